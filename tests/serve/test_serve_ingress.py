"""Which HTTP ingress a Ray started by ``pyrt serve`` gets: the environment Ray's processes start with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pyrt.serve import ingress

KEYS = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S",
        "RAY_SERVE_HAPROXY_RETRY_ON", *ingress.OWN_PORTS, *ingress.PATIENCE)


@pytest.fixture
def haproxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An executable standing in for HAProxy (Ray's override variable), the ingress variables unset."""
    binary = tmp_path / "haproxy"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(binary))
    for key in KEYS:
        monkeypatch.delenv(key, raising=False)
    return str(binary)


def test_haproxy_and_direct_ingress_with_ports_of_their_own(haproxy: str) -> None:
    env = ingress.ingress_env()
    assert ingress.haproxy_binary() == haproxy and sorted(env) == sorted(KEYS)
    assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert len({env[key] for key in ingress.OWN_PORTS}) == len(ingress.OWN_PORTS)
    assert ingress.mode(env) == ingress.HAPROXY


def test_ray_proxy_or_no_binary_leave_ray_as_it_is(haproxy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert ingress.ingress_env(ray_proxy=True) == ingress.PATIENCE and ingress.mode({}) == ingress.RAY_PROXY
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", haproxy + ".missing")
    assert ingress.haproxy_binary() is None and ingress.ingress_env() == ingress.PATIENCE


def test_a_slow_proxy_start_is_waited_for_unless_the_environment_says_otherwise(monkeypatch: pytest.MonkeyPatch
                                                                                ) -> None:
    assert float(ingress.PATIENCE["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 60  # Ray's default: 5 s
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "7")
    assert "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S" not in ingress.ingress_env(ray_proxy=True)


def test_the_environment_s_own_settings_win(haproxy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "0")
    monkeypatch.setenv("RAY_SERVE_HAPROXY_METRICS_PORT", "9101")
    env = ingress.ingress_env()
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in env and "RAY_SERVE_HAPROXY_METRICS_PORT" not in env
    assert ingress.mode(env) == ingress.RAY_PROXY


def test_environment_is_restored(haproxy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")
    with ingress.environment({"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "RAY_SERVE_ENABLE_HA_PROXY": "1"}):
        assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == os.environ["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "0" and "RAY_SERVE_ENABLE_HA_PROXY" not in os.environ


def test_the_guard_confines_ray_s_haproxy_config_then_runs_the_binary(tmp_path: Path) -> None:
    """Ray runs the guard as HAProxy (``-f CONFIG ...``): the config's side ports bind to the serve port's host and
    headers get the read timeout; then the real binary runs with the same arguments."""
    import subprocess

    seen = tmp_path / "seen"
    binary = tmp_path / "real-haproxy"
    binary.write_text(f"#!/bin/sh\necho \"$@\" > {seen}\n")
    binary.chmod(0o755)
    config = tmp_path / "haproxy.cfg"
    config.write_text("defaults\n    mode http\nfrontend prometheus\n    bind :9101\nfrontend http_frontend\n"
                      "    bind 10.1.2.3:8000\nlisten stats\n  bind *:8404\n")
    guard = ingress.write_guard(str(tmp_path), str(binary), 12.5)
    subprocess.run([guard, "-db", "-f", str(config), "-sf", "42"], check=True, timeout=60)
    assert seen.read_text().split() == ["-db", "-f", str(config), "-sf", "42"]
    text = config.read_text()
    assert "bind 10.1.2.3:9101" in text and "bind 10.1.2.3:8404" in text and "timeout http-request 13s" in text
    assert ":9101" not in text.replace("10.1.2.3:9101", "") and "*:" not in text


def test_a_server_on_every_interface_keeps_ray_s_binds(haproxy: str, tmp_path: Path) -> None:
    config = "defaults\nfrontend prometheus\n    bind :9101\nfrontend http_frontend\n    bind *:8000\n"
    assert ingress.confine(config).count("bind :9101") == 1
    env = ingress.ingress_env(guard_dir=str(tmp_path), read_timeout_s=30)
    assert env[ingress.BINARY].startswith(str(tmp_path)) and os.access(env[ingress.BINARY], os.X_OK)


def test_haproxy_waits_for_a_replica_a_little_longer_than_the_request_timeout(haproxy: str,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A replica on a host that vanished never answers: HAProxy gives up (500) instead of holding the client."""
    monkeypatch.delenv(ingress.SERVER_TIMEOUT, raising=False)
    assert ingress.SERVER_TIMEOUT not in ingress.ingress_env()  # Ray's default: no limit
    assert ingress.ingress_env(request_timeout_s=19.5)[ingress.SERVER_TIMEOUT] == str(20 + ingress.SERVER_MARGIN_S)
    node = ingress.node_env(10)
    assert node["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and not set(node) & set(ingress.OWN_PORTS)


def test_the_node_variables_print_as_shell_exports() -> None:
    """``eval "$(python -m pyrt.serve.ingress --request-timeout-s 30)"`` sets exactly :func:`ingress.node_env` (30)."""
    shell = (f"eval \"$({sys.executable} -m pyrt.serve.ingress --request-timeout-s 30)\" && "
             f"{sys.executable} -c 'import json, os; print(json.dumps(dict(os.environ)))'")
    done = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    expected = ingress.node_env(30)
    assert {k: seen.get(k) for k in expected} == expected
    assert "RAY_SERVE_HAPROXY_RETRY_ON" in expected and " " in expected["RAY_SERVE_HAPROXY_RETRY_ON"]  # quoted


@pytest.mark.parametrize("bad", ["-5", "0", "inf", "soon"])
def test_the_node_variables_refuse_a_timeout_that_is_not_a_positive_number(bad: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pyrt.serve.ingress", "--request-timeout-s", bad],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"got {bad!r}" in done.stderr and not done.stdout
