"""Operators pyrt resolves: ExecuTorch's own kernel set plus pyrt's documented extras, nothing else.

A .pte is untrusted input and ``torch.ops`` reaches operators with side
effects. Hostile programs built by hand (ExecuTorch's serializer lays them
out) call those operators; pyrt must refuse them at load with either kernel
set, before anything runs, and the files they name must stay as they were.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import UnsupportedOperatorError  # noqa: E402
from pyrt.kernels import allowlist, numpy_library, prim_kernels  # noqa: E402
from pyrt.pte_reader import Operator  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import hand_program, hand_tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("torch", "numpy")
REFUSED = "ExecuTorch's runtime does not define"
SECRET = b"top secret: must be neither read nor written"


def _names(fname: str) -> list[str]:
    text = (ROOT / "pyrt" / "kernels" / fname).read_text(encoding="utf-8")
    return [ln.partition("#")[0].strip() for ln in text.splitlines() if ln.partition("#")[0].strip()]


# -- the data ----------------------------------------------------------------------------------------


def test_allowlist_is_current_for_installed_executorch() -> None:
    pytest.importorskip("yaml")
    if importlib.util.find_spec("executorch.extension.pybindings.portable_lib") is None:
        pytest.skip("executorch's runtime bindings are not installed")
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_allowed_ops.py"), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_allowlist_holds_executorch_kernel_families() -> None:
    allowed = allowlist.allowed_operators()
    for name in ("aten::add.out", "aten::copy_", "et_copy::_h2d_copy.out", "executorch_prim::add.Scalar",
                 "dim_order_ops::_to_dim_order_copy.out", "quantized_decomposed::quantize_per_tensor.out",
                 "aten::sym_size.int"):
        assert name in allowed
    for name in ("aten::from_file", "aten::_print", "aten::fill_.Scalar", "aten::add.Tensor"):
        assert name not in allowed


def test_extras_are_pyrt_kernels_outside_executorch() -> None:
    """extra_ops.txt may only name pyrt's own kernels, so it can never open torch.ops further."""
    extras, generated = _names("extra_ops.txt"), set(_names("allowed_ops.txt"))
    own = set(numpy_library.supported()) | set(prim_kernels._SPECIAL)
    assert extras and len(extras) == len(set(extras))
    assert [e for e in extras if e not in own] == []
    assert [e for e in extras if e in generated] == []  # nothing listed twice


def test_every_pyrt_kernel_name_is_allowed() -> None:
    """A kernel registered under a name outside the allowlist would be dead code: list it in extras or drop it."""
    allowed = allowlist.allowed_operators()
    own = set(numpy_library.supported()) | set(prim_kernels._SPECIAL)
    assert sorted(own - allowed) == []


def test_torch_library_does_not_look_up_refused_names() -> None:
    from pyrt.kernels.torch_kernels import TorchLibrary

    lib = TorchLibrary()
    assert lib.lookup(Operator("aten::add", "out")) is not None
    assert lib.lookup(Operator("aten::from_file", "")) is None  # exists in torch.ops
    assert lib.lookup(Operator("aten::_print", "")) is None


# -- hostile programs ----------------------------------------------------------------------------------


def _st() -> Any:
    from executorch.exir.scalar_type import ScalarType

    return ScalarType


def _from_file(path: Path, n: int, *, write: bool) -> bytes:
    """``t = aten::from_file(path, shared=True, size=n)``, then ``aten::fill_.Scalar(t, 65)`` when ``write``."""
    from executorch.exir import schema as s

    values = [s.EValue(s.String(str(path))), s.EValue(s.Bool(True)), s.EValue(s.Int(n)), s.EValue(s.Null()),
              hand_tensor(_st().BYTE, [n]), s.EValue(s.Int(65))]
    instructions = [s.KernelCall(op_index=0, args=[0, 1, 2, 3, 3, 3, 3, 4])]
    operators = [("aten::from_file", "")]
    if write:
        instructions.append(s.KernelCall(op_index=1, args=[4, 5, 4]))
        operators.append(("aten::fill_", "Scalar"))
    return hand_program(values, instructions, operators, outputs=[4])


def _print_program(text: str) -> bytes:
    from executorch.exir import schema as s

    return hand_program([s.EValue(s.String(text)), s.EValue(s.Int(0))], [s.KernelCall(op_index=0, args=[0])],
                        [("aten::_print", "")], outputs=[1])


@pytest.fixture()
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.txt"
    path.write_bytes(SECRET)
    return path


def _untouched(path: Path, before: Any) -> None:
    after = path.stat()
    assert path.read_bytes() == SECRET
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


@pytest.mark.parametrize("kernels_name", KERNELS)
@pytest.mark.parametrize("write", [False, True], ids=["read", "write"])
def test_from_file_is_refused_and_the_file_untouched(secret: Path, kernels_name: str, write: bool) -> None:
    before = secret.stat()
    data = _from_file(secret, len(SECRET), write=write)
    with pytest.raises(UnsupportedOperatorError, match=rf"{REFUSED}.*aten::from_file"):
        prog = Program(data, kernels=kernels_name)
        try:  # only reached by a runtime that loads it: show what it leaked
            pytest.fail(f"loaded; it returned {prog()!r}")
        finally:
            prog.close()
    _untouched(secret, before)


@pytest.mark.parametrize("kernels_name", KERNELS)
def test_print_is_refused(capfd: pytest.CaptureFixture[str], kernels_name: str) -> None:
    data = _print_program("pyrt-hostile-print")
    with pytest.raises(UnsupportedOperatorError, match=rf"{REFUSED}.*aten::_print"):
        Program(data, kernels=kernels_name).close()
    assert "pyrt-hostile-print" not in capfd.readouterr().out


@pytest.fixture(scope="module")
def touch_op() -> Any:
    """``pyrt_hostile::touch(str path) -> ()``: a torch op (as any loaded extension may register) that writes."""
    lib = torch.library.Library("pyrt_hostile", "DEF")
    lib.define("touch(str path) -> ()")

    def touch(path: str) -> None:
        Path(path).write_bytes(b"pwned")

    lib.impl("touch", touch, "CompositeExplicitAutograd")
    yield lib


@pytest.mark.parametrize("kernels_name", KERNELS)
def test_registered_torch_op_with_side_effects_is_refused(tmp_path: Path, touch_op: Any, kernels_name: str) -> None:
    from executorch.exir import schema as s

    target = tmp_path / "created-by-the-file"
    torch.ops.pyrt_hostile.touch(str(tmp_path / "probe"))  # the op is live in torch.ops
    assert (tmp_path / "probe").exists()
    data = hand_program([s.EValue(s.String(str(target))), s.EValue(s.Int(0))], [s.KernelCall(op_index=0, args=[0])],
                        [("pyrt_hostile::touch", "")], outputs=[1])
    with pytest.raises(UnsupportedOperatorError, match=rf"{REFUSED}.*pyrt_hostile::touch"):
        Program(data, kernels=kernels_name).close()
    assert not target.exists()


@pytest.mark.parametrize("kernels_name", KERNELS)
def test_every_refused_operator_is_named_once(kernels_name: str) -> None:
    from executorch.exir import schema as s

    data = hand_program([s.EValue(s.Int(0))], [], [("aten::from_file", ""), ("aten::_print", ""),
                                                   ("aten::from_file", ""), ("aten::add", "out")], outputs=[0])
    with pytest.raises(UnsupportedOperatorError) as info:
        Program(data, kernels=kernels_name)
    msg = str(info.value)
    assert "method 'forward'" in msg and msg.count("aten::from_file") == 1 and "aten::_print" in msg
    assert "aten::add.out" not in msg


def test_every_allowed_operator_has_a_schema_pyrt_can_read() -> None:
    """op_schemas.txt covers the allowlist exactly, and every schema maps to argument kinds."""
    from pyrt.kernels import schemas

    assert set(schemas._table()) == set(allowlist.allowed_operators())
    for name in allowlist.allowed_operators():
        parsed = schemas.schema(name)
        assert parsed is not None and parsed.kinds, name
        assert all(parsed.kinds[:-1]) or name == "executorch_prim::et_copy_index.tensor", name
