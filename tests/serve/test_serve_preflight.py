"""``pyrt serve``'s checks before Ray: a port out of range at parsing (exit 2), a port in use, a missing file and a
bad tokenizer folder named on one line with exit 1, before Ray is even imported (issue 46: 20 s of Ray, then an
internal error and 25 lines of traceback)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyrt.errors import InputError, PyrtError
from pyrt.serve.config import ServeConfig, StartOptions
from pyrt.serve.flags import add_flags, configs
from pyrt.serve.preflight import check_before_ray, check_port

ROOT = Path(__file__).resolve().parents[2]
RUN = ("import sys; from pyrt.tools.cli import main; status = main(sys.argv[1:]); "
       "print('ray imported' if 'ray' in sys.modules else 'ray not imported'); sys.exit(status)")


@pytest.fixture
def held() -> Iterator[int]:
    """A port something listens on (127.0.0.1)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def serve(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYRT_SIMULATED_GPUS": "1"}
    return subprocess.run([sys.executable, "-c", RUN, "serve", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def refused(proc: subprocess.CompletedProcess[str], needle: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith("pyrt: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert needle in proc.stderr and "ray not imported" in proc.stdout, (proc.stderr, proc.stdout)


def test_a_port_out_of_range_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="pyrt serve")
    add_flags(parser)
    for flag in ("--port", "--metrics-port"):
        with pytest.raises(SystemExit) as caught:
            parser.parse_args([str(tmp_path / "m.pte"), flag, "99999"])
        assert caught.value.code == 2 and "from 1 to 65535, got '99999'" in capsys.readouterr().err
    with pytest.raises(InputError, match="port=65536 must be an int >= 1 and < 65536"):
        StartOptions(port=65536)


def test_a_port_in_use_is_named(held: int) -> None:
    with pytest.raises(PyrtError, match=f"--port {held}: 127.0.0.1:{held} is in use"):
        check_port("127.0.0.1", held)
    with pytest.raises(PyrtError, match=f"0.0.0.0:{held} is in use"):  # every address: 127.0.0.1 too
        check_port("0.0.0.0", held)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    check_port("127.0.0.1", free)  # nothing listens: no error


def test_a_joined_cluster_s_port_is_its_own(tmp_path: Path, held: int) -> None:
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"x")
    check_before_ray(ServeConfig(str(pte)), StartOptions(address="auto", port=held))  # its ingress holds it


def test_pyrt_serve_names_a_port_in_use_before_ray(tmp_path: Path, held: int) -> None:
    pte = tmp_path / "m.pte"
    pte.write_bytes(b"not read: the port is refused first")
    refused(serve(str(pte), "--port", str(held)), f"--port {held}: 127.0.0.1:{held} is in use")


def test_pyrt_serve_names_a_missing_file_and_a_bad_tokenizer_before_ray(tmp_path: Path) -> None:
    refused(serve(str(tmp_path / "nothere.pte")), f"{tmp_path / 'nothere.pte'}: no such file")
    pte, empty = tmp_path / "m.pte", tmp_path / "empty"
    pte.write_bytes(b"not read")
    empty.mkdir()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    refused(serve(str(pte), "--port", port, "--tokenizer", str(empty)), f"--tokenizer '{empty}' holds no tokenizer "
            "files")
    assert configs({"path": str(pte), "tokenizer": str(empty)})[0].tokenizer == str(empty)
