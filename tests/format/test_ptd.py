"""`.ptd` files (ExecuTorch's FlatTensor): pyrt's reader and ``Program(data=...)`` against ExecuTorch 1.5.1.

The fixture is ExecuTorch's own: ``portable_external`` (``external_constants=True``)
and the .ptd ``write_tensor_data_to_file`` wrote for it. Hand-made .ptd files come
from ExecuTorch's ``FlatTensorSerializer``, so every byte layout here is ExecuTorch's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pyrt
from pyrt.errors import PteFormatError, PyrtError
from pyrt.format.dtypes import ScalarType
from pyrt.format.mapped import _address
from pyrt.format.ptd_reader import HEADER_OFFSET, ExternalData, PtdFile

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def external(pte_file) -> tuple[Path, Path]:
    pte = pte_file("portable_external")
    return pte, pte.with_suffix(".ptd")


def et_payload(ptd: Path):
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    return FlatTensorSerializer().deserialize(Cord(ptd.read_bytes()))


def write_ptd(path: Path, entries: dict[str, tuple[bytes, tuple | None]]) -> Path:
    """A .ptd written by ExecuTorch's serializer: ``{key: (bytes, (scalar_type, sizes, dim_order) | None)}``."""
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.exir.scalar_type import ScalarType as EtScalarType
    from executorch.exir.tensor_layout import TensorLayout
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    buffers, named = [], {}
    for key, (data, layout) in entries.items():
        buffers.append(data)
        tl = None if layout is None else TensorLayout(EtScalarType(layout[0]), list(layout[1]), list(layout[2]))
        named[key] = DataEntry(len(buffers) - 1, 16, tl)
    cord = FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=named))
    path.write_bytes(bytes(cord))
    return path


def inputs() -> tuple:
    torch.manual_seed(3)
    return torch.randn(2, 4), torch.tensor([0, 3])


def run_pyrt(pte: Path, data) -> list:
    with pyrt.Program(pte, data=data) as prog:
        out = prog.run(*inputs())
    return list(out) if isinstance(out, (list, tuple)) else [out]


# -- the reader against ExecuTorch's deserializer -----------------------------------------------------------


def test_entries_match_executorch(external) -> None:
    _, ptd = external
    payload = et_payload(ptd)
    with PtdFile.open(ptd) as ours:
        assert ours.keys() == list(payload.named_data) == ["lin.weight", "lin.bias"]
        assert ours.version == 0
        for key, entry in payload.named_data.items():
            assert bytes(ours.view(key)) == bytes(payload.buffers[entry.buffer_index])
            mine, theirs = ours.entries[key].layout, entry.tensor_layout
            assert (mine.scalar_type, mine.sizes, mine.dim_order) == (
                ScalarType(int(theirs.scalar_type)), tuple(theirs.sizes), tuple(theirs.dim_order))
            assert ours.entries[key].offset % 16 == 0  # ExecuTorch aligns segments: the view is aligned too


def test_reads_from_bytes_too(external) -> None:
    _, ptd = external
    with PtdFile.open(ptd.read_bytes()) as ours:
        assert ours.source == "<bytes>" and ours.entries["lin.bias"].layout.sizes == (3,)


# -- Program(data=...) against ExecuTorch's runtime ---------------------------------------------------------


def test_outputs_equal_executorch_runtime_given_the_same_ptd(external) -> None:
    from executorch.runtime import Runtime

    pte, ptd = external
    method = Runtime.get().load_program(str(pte), data_path=str(ptd)).load_method("forward")
    want = method.execute(list(inputs()))
    got = run_pyrt(pte, ptd)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):  # torch's kernels and ExecuTorch's portable ones round alike to 1 ulp
        np.testing.assert_allclose(np.asarray(g), w.numpy(), rtol=1e-6, atol=1e-6)


def test_several_data_files_resolve_by_key(external, tmp_path: Path) -> None:
    pte, ptd = external
    with PtdFile.open(ptd) as src:
        parts = {key: (bytes(src.view(key)), (e.layout.scalar_type, e.layout.sizes, e.layout.dim_order))
                 for key, e in src.entries.items()}
    a = write_ptd(tmp_path / "a.ptd", {"lin.weight": parts["lin.weight"]})
    b = write_ptd(tmp_path / "b.ptd", {"lin.bias": parts["lin.bias"]})
    for g, w in zip(run_pyrt(pte, [a, b]), run_pyrt(pte, ptd), strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_constants_are_zero_copy_views_of_the_ptd_mapping(external) -> None:
    pte, ptd = external
    with pyrt.Program(pte, data=ptd, kernels="numpy") as prog:
        mm = prog._data.files[0]._mmap
        lo, hi = _address(mm), _address(mm) + len(mm)
        table = prog._plans[0].table
        constants = [table.vals[i] for i, info in table.infos.items() if info.storage == "constant"]
        inside = [c for c in constants if lo <= c.__array_interface__["data"][0] < hi]
        assert len(inside) == 2, "lin.weight and lin.bias are read in place from the .ptd"
        assert all(not c.flags.writeable for c in inside)


# -- typed errors -------------------------------------------------------------------------------------------


def test_missing_data_is_named(external, tmp_path: Path) -> None:
    pte, _ = external
    with pytest.raises(PteFormatError, match=r"external tensor 'lin\.(weight|bias)' \(FLOAT\[3.*not found: no data "
                                             r"file was given.*portable_external\.ptd exists beside it"):
        pyrt.Program(pte)
    with pytest.raises(PteFormatError, match=r"absent\.ptd: cannot open data file: No such file"):
        pyrt.Program(pte, data=tmp_path / "absent.ptd")


def test_missing_key_size_and_dtype_mismatch(external, tmp_path: Path) -> None:
    pte, ptd = external
    weight = bytes(12 * 4)
    bias = (bytes(12), (ScalarType.FLOAT, (3,), (0,)))
    cases = {
        "other key": ({"lin.bias": bias, "other": (weight, None)},
                      r"external tensor 'lin.weight' \(FLOAT\[3, 4\]\) not found in .*other key\.ptd"),
        "dtype": ({"lin.weight": (weight, (ScalarType.INT, (3, 4), (0, 1))), "lin.bias": bias},
                  r"named data 'lin.weight' is INT\[3, 4\], but .* expects FLOAT\[3, 4\]"),
        "sizes": ({"lin.weight": (weight, (ScalarType.FLOAT, (4, 3), (0, 1))), "lin.bias": bias},
                  r"named data 'lin.weight' is FLOAT\[4, 3\], but .* expects FLOAT\[3, 4\]"),
        "dim order": ({"lin.weight": (weight, (ScalarType.FLOAT, (3, 4), (1, 0))), "lin.bias": bias},
                      r"'lin.weight' has dim_order \(1, 0\), but .* expects \(0, 1\)"),
        "short": ({"lin.weight": (weight[:40], None), "lin.bias": bias},
                  r"named data 'lin.weight' holds 40 bytes, but .* expects FLOAT\[3, 4\] \(48 bytes\)"),
    }
    for name, (entries, message) in cases.items():
        with pytest.raises(PteFormatError, match=message):
            pyrt.Program(pte, data=write_ptd(tmp_path / f"{name}.ptd", entries))
    with pytest.raises(PteFormatError, match=r"key 'lin.weight' is in both .*portable_external.ptd and .*copy.ptd"):
        pyrt.Program(pte, data=[ptd, write_ptd(tmp_path / "copy.ptd", {"lin.weight": (weight, None)})])


def test_a_layout_larger_than_its_segment_is_refused_at_open(tmp_path: Path) -> None:
    path = write_ptd(tmp_path / "lie.ptd", {"w": (bytes(8), (ScalarType.FLOAT, (4,), (0,)))})
    with pytest.raises(PteFormatError, match=r"'w' is FLOAT\[4\] \(16 bytes\) but its segment 0 holds 8 bytes"):
        PtdFile.open(path)


def _patched(data: bytes, offset: int, value: bytes) -> bytes:
    return data[:offset] + value + data[offset + len(value):]


def test_header_fields_are_checked(external) -> None:
    _, ptd = external
    data = ptd.read_bytes()
    cases = [
        (data[:40], "too short for a .ptd header"),
        (_patched(data, 4, b"ET12"), r"file identifier b'ET12' is not b'FT01'"),
        (_patched(data, HEADER_OFFSET, b"eh00"), r"header magic b'eh00' at offset 8 is not b'FH01'"),
        (_patched(data, 12, (39).to_bytes(4, "little")), "header length 39 < 40"),
        (_patched(data, 24, (1 << 40).to_bytes(8, "little")), r"flatbuffer_size 1099511627776 = .* is outside"),
        (_patched(data, 32, (8).to_bytes(8, "little")), "segment_base_offset 8 is inside the flatbuffer"),
        (data[:-1], rf"segment data \[\d+, {len(data)}\) overruns the file \(length {len(data) - 1}\): truncated"),
        (_patched(data, 40, (20).to_bytes(8, "little")), r"segment 0 at offset 0 size 48 overruns the segment data"),
    ]
    for bad, message in cases:
        with pytest.raises(PteFormatError, match=message):
            PtdFile.open(bad)


def test_a_newer_schema_version_is_refused(tmp_path: Path, monkeypatch) -> None:
    from executorch.extension.flat_tensor.serialize import serialize

    monkeypatch.setattr(serialize, "_FLAT_TENSOR_VERSION", 1)  # what a newer ExecuTorch would stamp
    path = write_ptd(tmp_path / "v1.ptd", {"w": (bytes(4), None)})
    with pytest.raises(PteFormatError, match="FlatTensor version 1 is newer than this reader supports"):
        PtdFile.open(path)


def test_every_corrupted_byte_is_a_typed_error_or_a_valid_file(external) -> None:
    """Each byte of the header and flatbuffer set to 0x00, 0xff and 0x80, and every truncation:
    opening and resolving every entry gives a PtdFile or a PteFormatError, nothing else."""
    _, ptd = external
    data = ptd.read_bytes()
    end = int.from_bytes(data[16:24], "little") + int.from_bytes(data[24:32], "little")
    variants = [_patched(data, i, bytes([v])) for i in range(end) for v in (0x00, 0xFF, 0x80)]
    variants += [data[:n] for n in range(0, len(data), 7)]
    opened = 0
    for bad in variants:
        try:
            with PtdFile.open(bad) as f:
                for key in f.keys():
                    f.view(key)
                opened += 1
        except PteFormatError:
            pass
    assert 0 < opened < len(variants)


def test_a_hostile_ptd_reaches_program_as_a_typed_error(external) -> None:
    pte, ptd = external
    data = ptd.read_bytes()
    for i in range(0, 64):
        try:
            pyrt.Program(pte, data=_patched(data, i, b"\xff"), kernels="numpy").close()
        except PyrtError:
            pass


def test_external_data_closes_what_it_opened(external) -> None:
    _, ptd = external
    with ExternalData.open([ptd]) as data:
        f, entry = data.find("lin.weight")
        assert entry.size == 48 and data.find("nope") is None
    assert f._mmap is None


def test_reading_a_ptd_imports_neither_torch_nor_executorch(external) -> None:
    pte, ptd = external
    code = f"""
import sys
import numpy as np, pyrt
from pyrt.format.ptd_reader import PtdFile
with PtdFile.open({str(ptd)!r}) as f:
    [f.view(k) for k in f.keys()]
pyrt.inspect({str(pte)!r}, data={str(ptd)!r})
print(sorted(m for m in ("torch", "executorch") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"


def _mutable_external_program() -> bytes:
    """``out = x + w`` where ``w`` is planned memory whose initial value is external named data "w"
    (what ExecuTorch's ``external_mutable_weights`` emits), serialized by ExecuTorch."""
    from executorch.exir import schema as s
    from executorch.exir._serialize._program import PTEFile, serialize_pte_binary
    from executorch.exir.scalar_type import ScalarType as EtScalarType

    def tensor(offset: int, extra=None) -> s.EValue:
        return s.EValue(s.Tensor(scalar_type=EtScalarType.FLOAT, storage_offset=0, sizes=[3], dim_order=[0],
                                 requires_grad=False, layout=0, data_buffer_idx=0,
                                 allocation_info=s.AllocationDetails(1, offset, 0),
                                 shape_dynamism=s.TensorShapeDynamism.STATIC, extra_tensor_info=extra))

    extra = s.ExtraTensorInfo(fully_qualified_name="w", location=s.TensorDataLocation.EXTERNAL)
    values = [tensor(0), tensor(16, extra), s.EValue(s.Int(1)), tensor(32)]
    chain = s.Chain(inputs=[0], outputs=[3], stacktrace=None,
                    instructions=[s.Instruction(s.KernelCall(op_index=0, args=[0, 1, 2, 3, 3]))])
    plan = s.ExecutionPlan(name="forward", container_meta_type=s.ContainerMetadata("", ""), values=values,
                           inputs=[0], outputs=[3], chains=[chain], operators=[s.Operator("aten::add", "out")],
                           delegates=[], non_const_buffer_sizes=[0, 48])
    program = s.Program(version=0, execution_plan=[plan], constant_buffer=[s.Buffer(storage=b"")],
                        backend_delegate_data=[], segments=[],
                        constant_segment=s.SubsegmentOffsets(segment_index=0, offsets=[]))
    return bytes(serialize_pte_binary(PTEFile(program=program)))  # moves the placeholder buffer to a segment


def test_mutable_external_weights_are_copied_into_planned_memory(tmp_path: Path) -> None:
    from executorch.runtime import Runtime

    pte = tmp_path / "mutable.pte"
    pte.write_bytes(_mutable_external_program())
    w = np.array([10.0, 20.0, 30.0], np.float32)
    ptd = write_ptd(tmp_path / "mutable.ptd", {"w": (w.tobytes(), (ScalarType.FLOAT, (3,), (0,)))})
    x = np.array([1.0, 2.0, 3.0], np.float32)
    want = Runtime.get().load_program(str(pte), data_path=str(ptd)).load_method("forward").execute(
        [torch.from_numpy(x)])[0].numpy()
    with pyrt.Program(pte, data=ptd, kernels="numpy") as prog:
        (got,) = prog(x)
        table = prog._plans[0].table
        assert table.infos[1].storage == "planned", "a mutable external tensor lives in its arena, not the mmap"
        assert table.vals[1].flags.writeable
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(want, x + w)
