"""``Program(path, mmap=False)``: the file is read into private memory, so changing it cannot hurt a loaded program.

With the default mapping, constants are views of the file: truncating it while
the program runs kills the process with SIGBUS (documented in the README and
the Program docstring; shown here in a child process). Both modes give the
same results.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import InputError, PteFormatError, ResourceError  # noqa: E402
from pyrt.format import limits  # noqa: E402
from pyrt.pte_reader import PteFile  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
X = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
IDX = np.array([0, 3])


@pytest.fixture()
def portable_copy(tmp_path: Path, pte_file: Callable[[str], Path]) -> Path:
    """A private copy of the portable fixture (constants and mutable buffers in segments)."""
    path = tmp_path / "portable.pte"
    shutil.copyfile(pte_file("portable"), path)
    return path


def _outputs(prog: Program) -> list[np.ndarray]:
    return [np.asarray(y) for y in prog.run(X, IDX, method="forward")]


@pytest.mark.parametrize("kernels", ["torch", "numpy"])
def test_both_modes_agree(portable_copy: Path, kernels: str) -> None:
    with Program(portable_copy, kernels=kernels) as mapped, Program(portable_copy, kernels=kernels,
                                                                    mmap=False) as private:
        for _ in range(2):  # state (mutable buffers) carries across runs in both
            for a, b in zip(_outputs(mapped), _outputs(private), strict=True):
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("change", ["truncate", "overwrite", "delete"])
def test_private_memory_survives_changes_to_the_file(portable_copy: Path, change: str) -> None:
    with Program(portable_copy, kernels="numpy") as reference:
        expected = _outputs(reference)
    with Program(portable_copy, kernels="numpy", mmap=False) as prog:
        if change == "truncate":
            os.truncate(portable_copy, 0)
        elif change == "overwrite":
            portable_copy.write_bytes(b"\xff" * portable_copy.stat().st_size)
        else:
            portable_copy.unlink()
        for a, b in zip(_outputs(prog), expected, strict=True):
            np.testing.assert_array_equal(a, b)


def test_reader_gives_read_only_private_views(portable_copy: Path) -> None:
    with PteFile.open(portable_copy, mmap=False) as pte:
        assert pte._mmap is None
        plan = pte.program.method("forward")
        const = next(v.value for v in plan.values if v.kind == "Tensor" and v.value.is_constant)
        view = pte.program.constant_data(const)
        assert view.readonly and view.nbytes == const.nbytes
        with PteFile.open(portable_copy) as mapped:
            assert bytes(mapped.program.constant_data(const)) == bytes(view)


def test_private_read_is_checked_against_available_memory(portable_copy: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "available_host_memory", lambda: (100, "test"))
    size = portable_copy.stat().st_size
    with pytest.raises(ResourceError, match=rf"reading the file into memory \(mmap=False\): {size} bytes"):
        PteFile.open(portable_copy, mmap=False)
    PteFile.open(portable_copy).close()  # a mapping costs no private memory


def test_file_shrinking_while_read_is_a_format_error(portable_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.readv
    calls = []

    def short(fd: int, buffers: list) -> int:
        calls.append(1)
        return real(fd, [buffers[0][:100]]) if len(calls) == 1 else 0

    monkeypatch.setattr(os, "readv", short)
    with pytest.raises(PteFormatError, match=r"shrank to 100 bytes while being read"):
        PteFile.open(portable_copy, mmap=False)


def test_mmap_must_be_a_bool(portable_copy: Path) -> None:
    with pytest.raises(InputError, match="mmap='no' must be True"):
        Program(portable_copy, mmap="no")  # type: ignore[arg-type]


CHILD = """
import os, sys
sys.path.insert(0, {root!r})
import numpy as np, pyrt
x, idx = np.ones((2, 4), np.float32), np.array([0, 3])
with pyrt.Program({path!r}, kernels="numpy", mmap={mmap}) as prog:
    prog.run(x, idx, method="forward")
    os.truncate({path!r}, 0)
    print("truncated", flush=True)
    prog.run(x, idx, method="forward")
print("survived", flush=True)
"""


@pytest.mark.parametrize("mmap", [True, False])
def test_truncating_a_mapped_file_kills_the_process(portable_copy: Path, mmap: bool) -> None:
    """The documented hazard, in a child process: SIGBUS with the mapping, nothing with private memory."""
    proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), path=str(portable_copy), mmap=mmap)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    if mmap:
        assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr[-500:])
        assert proc.stdout.split() == ["truncated"]
    else:
        assert proc.returncode == 0 and proc.stdout.split() == ["truncated", "survived"], proc.stderr[-1000:]
