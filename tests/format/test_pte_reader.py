"""pyrt's .pte reader against ExecuTorch 1.5.1's own deserializer, on files ExecuTorch wrote.

The independent implementation is ``executorch.exir._serialize``:
``_get_extended_header`` + ``_flatbuffer_to_program`` (the Program as stored,
segments included) and ``deserialize_pte_binary`` (segments restored into
bytes: delegate blobs, constant buffers, mutable data, named data).
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pyrt.errors import PteFormatError, PyrtError
from pyrt.format.trt_blob import parse_blob
from pyrt.pte_reader import (
    DataLocation,
    DelegateCall,
    DeviceType,
    EValue,
    KernelCall,
    PteFile,
    PteProgram,
    Tensor,
    iter_delegate_blobs,
)
from tests.fixtures import pte as ptefixtures
from tests.fixtures.pte import et_raw, et_restored


@pytest.fixture
def pte(any_pte: Path):
    with PteFile.open(any_pte) as f:
        yield f


def _plans(pte: PteFile, path: Path) -> list[tuple[Any, Any]]:
    ours = pte.program.execution_plan
    theirs = et_raw(path)[1].execution_plan
    assert [p.name for p in ours] == [p.name for p in theirs]
    return list(zip(ours, theirs, strict=True))


# -- conversions of ExecuTorch dataclasses into pyrt's values ----------------------------------------


def et_tensor_fields(t: Any) -> dict[str, Any]:
    alloc = t.allocation_info
    extra = t.extra_tensor_info
    return {
        "scalar_type": int(t.scalar_type),
        "storage_offset": t.storage_offset,
        "sizes": tuple(t.sizes),
        "dim_order": tuple(t.dim_order),
        "requires_grad": bool(t.requires_grad),
        "data_buffer_idx": t.data_buffer_idx,
        "allocation": None if alloc is None else (
            alloc.memory_id, alloc.memory_offset_low | (alloc.memory_offset_high << 32)),
        "layout": t.layout,
        "shape_dynamism": int(t.shape_dynamism),
        "extra": None if extra is None else (
            extra.mutable_data_segments_idx, extra.fully_qualified_name, int(extra.location),
            int(extra.device_type), extra.device_index),
    }


def pyrt_tensor_fields(t: Tensor) -> dict[str, Any]:
    a, e = t.allocation_info, t.extra_tensor_info
    return {
        "scalar_type": int(t.scalar_type),
        "storage_offset": t.storage_offset,
        "sizes": t.sizes,
        "dim_order": t.dim_order,
        "requires_grad": t.requires_grad,
        "data_buffer_idx": t.data_buffer_idx,
        "allocation": None if a is None else (a.memory_id, a.memory_offset),
        "layout": t.layout,
        "shape_dynamism": int(t.shape_dynamism),
        "extra": None if e is None else (
            e.mutable_data_segments_idx, e.fully_qualified_name, int(e.location), int(e.device_type), e.device_index),
    }


def et_payload(val: Any) -> Any:
    kind = type(val).__name__
    if kind == "Null":
        return None
    if kind == "Int":
        return val.int_val
    if kind == "Bool":
        return bool(val.bool_val)
    if kind == "Double":
        return float(val.double_val)  # ExecuTorch keeps +-inf as the strings "inf" / "-inf"
    if kind == "String":
        return val.string_val
    if kind == "Tensor":
        return et_tensor_fields(val)
    if kind == "BoolList":
        return tuple(bool(b) for b in val.items)
    return tuple(val.items)


def pyrt_payload(v: EValue) -> Any:
    return pyrt_tensor_fields(v.value) if v.kind == "Tensor" else v.value


def et_instruction(ins: Any) -> tuple:
    a = ins.instr_args
    kind = type(a).__name__
    fields = {
        "KernelCall": lambda: (a.op_index, tuple(a.args)),
        "DelegateCall": lambda: (a.delegate_index, tuple(a.args)),
        "MoveCall": lambda: (a.move_from, a.move_to),
        "JumpFalseCall": lambda: (a.cond_value_index, a.destination_instruction),
        "FreeCall": lambda: (a.value_index,),
    }[kind]()
    return (kind, *fields)


def pyrt_instruction(ins: Any) -> tuple:
    fields = {
        "KernelCall": lambda: (ins.op_index, ins.args),
        "DelegateCall": lambda: (ins.delegate_index, ins.args),
        "MoveCall": lambda: (ins.move_from, ins.move_to),
        "JumpFalseCall": lambda: (ins.cond_value_index, ins.destination_instruction),
        "FreeCall": lambda: (ins.value_index,),
    }[ins.kind]()
    return (ins.kind, *fields)


# -- header, segments and program-level tables ---------------------------------------------------------


def test_header_and_segments(pte: PteFile, any_pte: Path) -> None:
    data = any_pte.read_bytes()
    eh, program = et_raw(any_pte)
    assert pte.size == len(data)
    assert pte.identifier == data[4:8].decode()
    if eh is None or not eh.is_valid():
        assert pte.extended_header is None
        assert pte.segment_base_offset == 0
    else:
        assert pte.extended_header.program_size == eh.program_size
        assert pte.extended_header.segment_base_offset == eh.segment_base_offset
        assert pte.extended_header.segment_data_size == eh.segment_data_size
    assert [(s.offset, s.size) for s in pte.program.segments] == [(s.offset, s.size) for s in program.segments]
    for i, seg in enumerate(program.segments):
        start = eh.segment_base_offset + seg.offset
        assert bytes(pte.segment_view(i)) == data[start:start + seg.size]


def test_program_tables(pte: PteFile, any_pte: Path) -> None:
    _, program = et_raw(any_pte)
    ours = pte.program
    assert ours.version == program.version
    assert len(ours) == len(program.execution_plan)
    cs = program.constant_segment
    assert (ours.constant_segment.segment_index, ours.constant_segment.offsets) == (cs.segment_index, tuple(cs.offsets))
    assert [(m.segment_index, m.offsets) for m in ours.mutable_data_segments] == [
        (m.segment_index, tuple(m.offsets)) for m in program.mutable_data_segments or ()]
    assert [(n.key, n.segment_index) for n in ours.named_data] == [
        (n.key, n.segment_index) for n in program.named_data or ()]
    assert ours.num_inline_delegate_data == len(program.backend_delegate_data)


# -- execution plans -------------------------------------------------------------------------------------


def test_values_match_executorch(pte: PteFile, any_pte: Path) -> None:
    for ours, theirs in _plans(pte, any_pte):
        assert ours.num_values == len(theirs.values)
        assert [v.kind for v in ours.values] == [type(v.val).__name__ for v in theirs.values]
        for i, (a, b) in enumerate(zip(ours.values, theirs.values, strict=True)):
            assert pyrt_payload(a) == et_payload(b.val), f"{ours.name} value {i}"
            assert ours.value(i) == a


def test_plan_fields_match_executorch(pte: PteFile, any_pte: Path) -> None:
    for ours, theirs in _plans(pte, any_pte):
        assert ours.container_meta_type == (theirs.container_meta_type.encoded_inp_str,
                                            theirs.container_meta_type.encoded_out_str)
        assert ours.inputs == tuple(theirs.inputs)
        assert ours.outputs == tuple(theirs.outputs)
        assert [(o.name, o.overload) for o in ours.operators] == [(o.name, o.overload) for o in theirs.operators]
        assert ours.non_const_buffer_sizes == tuple(theirs.non_const_buffer_sizes)
        assert [(d.buffer_idx, int(d.device_type), d.device_index) for d in ours.non_const_buffer_device] == [
            (d.buffer_idx, int(d.device_type), d.device_index) for d in theirs.non_const_buffer_device or ()]


def test_chains_match_executorch(pte: PteFile, any_pte: Path) -> None:
    for ours, theirs in _plans(pte, any_pte):
        assert len(ours.chains) == len(theirs.chains)
        for a, b in zip(ours.chains, theirs.chains, strict=True):
            assert a.inputs == tuple(b.inputs)
            assert a.outputs == tuple(b.outputs)
            assert [pyrt_instruction(i) for i in a.instructions] == [et_instruction(i) for i in b.instructions]


def test_delegates_match_executorch(pte: PteFile, any_pte: Path) -> None:
    for ours, theirs in _plans(pte, any_pte):
        assert len(ours.delegates) == len(theirs.delegates)
        for a, b in zip(ours.delegates, theirs.delegates, strict=True):
            assert a.id == b.id
            assert (int(a.location), a.index) == (int(b.processed.location), b.processed.index)
            assert [(c.key, c.value) for c in a.compile_specs] == [(c.key, bytes(c.value)) for c in b.compile_specs]


# -- data bytes (delegate blobs, constants, mutable data, named data) --------------------------------------


def test_delegate_blob_bytes_match_executorch(pte: PteFile, any_pte: Path) -> None:
    """ExecuTorch restores segment blobs inline; the restored plan delegates index its inline data."""
    restored = et_restored(any_pte).program
    count = 0
    for ours, theirs in zip(pte.program.execution_plan, restored.execution_plan, strict=True):
        for a, b in zip(ours.delegates, theirs.delegates, strict=True):
            assert b.processed.location == DataLocation.INLINE
            expected = restored.backend_delegate_data[b.processed.index].data
            assert bytes(pte.program.delegate_data(a)) == expected
            count += 1
    assert count == sum(len(p.delegates) for p in pte.program.execution_plan)


def _tensors(pte: PteFile):
    for plan in pte.program.execution_plan:
        for i, v in enumerate(plan.values):
            if v.kind == "Tensor":
                yield plan, i, v.value


def test_constant_bytes_match_executorch(pte: PteFile, any_pte: Path) -> None:
    """Each constant equals ExecuTorch's restored buffer up to nbytes; the rest of that buffer is padding."""
    buffers = et_restored(any_pte).program.constant_buffer
    for plan, i, t in _tensors(pte):
        external = t.extra_tensor_info is not None and t.extra_tensor_info.location == 1
        if not t.is_constant or external:
            continue
        theirs = buffers[t.data_buffer_idx].storage
        ours = pte.program.constant_data(t)
        assert ours.nbytes == t.nbytes == math.prod(t.sizes) * t.scalar_type.itemsize
        assert bytes(ours) == theirs[: t.nbytes], f"{plan.name} value {i}"
        assert not any(theirs[t.nbytes:])


def test_mutable_bytes_match_executorch(pte: PteFile, any_pte: Path) -> None:
    mutable = et_restored(any_pte).mutable_data
    seen = 0
    for plan, i, t in _tensors(pte):
        if t.allocation_info is None or t.data_buffer_idx == 0:
            continue
        theirs = mutable[t.data_buffer_idx].storage
        assert bytes(pte.program.mutable_data(t)) == theirs[: t.nbytes], f"{plan.name} value {i}"
        seen += 1
    assert seen == (len(mutable) - 1 if mutable else 0)  # entry 0 is ExecuTorch's placeholder


def test_named_data_matches_executorch(pte: PteFile, any_pte: Path) -> None:
    store = et_restored(any_pte).named_data
    keys = [n.key for n in pte.program.named_data]
    if store is None:
        assert keys == []
        return
    assert sorted(keys) == sorted(store.pte_data)
    for key, entry in store.pte_data.items():
        assert bytes(pte.program.named_data_view(key)) == store.buffers[entry.buffer_index]


# -- what the fixtures were built to contain ---------------------------------------------------------------


def test_portable_covers_state_lists_and_dynamic_shapes(portable_pte: Path) -> None:
    with PteFile.open(portable_pte) as pte:
        assert sorted(pte.program.method_names) == ["dyn", "forward"]  # ExecuTorch sorts methods by name
        fwd = pte.program.method("forward")
        kinds = {v.kind for v in fwd.values}
        assert {"TensorList", "OptionalTensorList", "String", "Double", "DoubleList", "IntList", "Null"} <= kinds
        state = [v.value for v in fwd.values if v.kind == "Tensor" and v.value.extra_tensor_info
                 and v.value.extra_tensor_info.fully_qualified_name == "state"]
        assert len(state) == 1
        initial = pte.program.mutable_data(state[0])
        import numpy as np

        assert np.frombuffer(initial, dtype=np.float32).tolist() == [0.5, 1.5, 2.5]
        dyn = pte.program.method("dyn")
        assert any(v.kind == "Tensor" and v.value.shape_dynamism != 0 for v in dyn.values)
        x = dyn.value(dyn.inputs[0]).value
        assert x.sizes == (16, 3)  # upper bound of Dim("batch", max=16)


@pytest.mark.parametrize("name", ["delegated_segments", "delegated_inline"])
def test_tensorrt_delegates_as_built(pte_file, name: str) -> None:
    with PteFile.open(pte_file(name)) as pte:
        fwd, other = pte.program.method("forward"), pte.program.method("other")
        want = DataLocation.SEGMENT if name == "delegated_segments" else DataLocation.INLINE
        assert all(d.location == want for p in (fwd, other) for d in p.delegates)
        # identical blobs (partition p0 of both methods) are stored once
        assert (other.delegates[0].location, other.delegates[0].index) == (fwd.delegates[0].location,
                                                                           fwd.delegates[0].index)
        assert fwd.delegates[0].index != fwd.delegates[1].index
        for _plan, _, d, blob in iter_delegate_blobs(pte):
            tag = d.spec("engine_tag").decode()
            trt = parse_blob(blob)
            assert bytes(trt.engine) == ptefixtures.expected_engine(tag)
            assert trt.magic == ("TR02" if d.spec("alias") else "TR01")
            assert d.spec("target_device") == b"cuda:0"
        assert fwd.delegates[0].spec("weight_streaming_budget") == ptefixtures.WEIGHT_STREAMING_BUDGET
        assert fwd.delegates[1].spec("weight_streaming_budget") is None
        # target_device: ExecuTorch inserted copies around the delegate and a CUDA arena
        ops = [op.qualified_name for op in fwd.operators]
        assert "et_copy::_h2d_copy.out" in ops and "et_copy::_d2h_copy.out" in ops
        cuda = [d.buffer_idx for d in fwd.non_const_buffer_device if d.device_type == DeviceType.CUDA]
        assert cuda and fwd.buffer_device(cuda[0]) == (DeviceType.CUDA, 0)
        assert fwd.buffer_device(1) == (DeviceType.CPU, 0)
        instrs = fwd.chains[0].instructions
        first_delegate = next(i for i, ins in enumerate(instrs) if isinstance(ins, DelegateCall))
        h2d = instrs[first_delegate - 1]
        assert isinstance(h2d, KernelCall) and fwd.operators[h2d.op_index].name == "et_copy::_h2d_copy"
        assert [n.key for n in pte.program.named_data] == ["weights_p0"]
        assert bytes(pte.program.named_data_view("weights_p0")) == b"W" * 40 + b"p0"


def test_synthetic_covers_every_kind(synthetic_pte: Path) -> None:
    with PteFile.open(synthetic_pte) as pte:
        plan = pte.program.method("synthetic")
        assert {v.kind for v in plan.values} == {
            "Null", "Int", "Bool", "Double", "Tensor", "String", "IntList", "DoubleList", "BoolList",
            "TensorList", "OptionalTensorList"}
        assert {i.kind for i in plan.chains[0].instructions} == {
            "KernelCall", "DelegateCall", "MoveCall", "JumpFalseCall", "FreeCall"}
        assert plan.value(12).value == (8, -1, 9)
        assert plan.value(14).value == math.inf
        big = plan.value(10).value
        assert big.allocation_info.memory_offset == (1 << 32) + 16
        assert plan.buffer_device(2) == (DeviceType.CUDA, 1)
        assert bytes(pte.program.constant_data(plan.value(8).value)) == bytes(range(24))
        assert pte.program.method("empty").values == ()


def test_external_constants_are_reported_not_read(pte_file) -> None:
    with PteFile.open(pte_file("portable_external")) as pte:
        external = [t for _, _, t in _tensors(pte)
                    if t.extra_tensor_info is not None and t.extra_tensor_info.location == 1]
        assert {t.extra_tensor_info.fully_qualified_name for t in external} == {"lin.weight", "lin.bias"}
        with pytest.raises(PteFormatError, match="lin.weight|lin.bias"):
            pte.program.constant_data(external[0])


# -- API behaviour -----------------------------------------------------------------------------------------


def test_open_bytes_equals_open_path(any_pte: Path) -> None:
    data = any_pte.read_bytes()
    with PteFile.open(any_pte) as a, PteFile.open(data) as b, PteFile.open(bytearray(data)) as c:
        for other in (b, c):
            assert other.extended_header == a.extended_header
            assert [p.values for p in other.program.execution_plan] == [p.values for p in a.program.execution_plan]
            assert [bytes(v) for *_, v in iter_delegate_blobs(other)] == [bytes(v) for *_, v in iter_delegate_blobs(a)]


def test_blobs_are_zero_copy_views(delegated_pte: Path) -> None:
    with PteFile.open(delegated_pte) as pte:
        for *_, blob in iter_delegate_blobs(pte):
            assert isinstance(blob, memoryview) and blob.readonly
            assert blob.obj is pte._mmap  # a view into the mapping, not a copy
            del blob


def test_unknown_method_names_the_choices(portable_pte: Path) -> None:
    with PteFile.open(portable_pte) as pte:
        with pytest.raises(PteFormatError, match=r"'nope'.*'dyn', 'forward'"):
            pte.program.method("nope")


def test_duplicate_compile_spec_is_an_error() -> None:
    from pyrt.pte_reader import BackendDelegate, CompileSpec

    d = BackendDelegate("TensorRTBackend", DataLocation.INLINE, 0,
                        (CompileSpec("weight_streaming_budget", b"1"), CompileSpec("weight_streaming_budget", b"2")))
    with pytest.raises(PteFormatError, match="weight_streaming_budget"):
        d.spec("weight_streaming_budget")
    assert CompileSpec("k", b"\x00\xff").text() == "hex:00ff"
    assert CompileSpec("k", b"cuda:0").text() == "cuda:0"


def test_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(PteFormatError, match="cannot open"):
        PteFile.open(tmp_path / "absent.pte")
    (tmp_path / "empty.pte").write_bytes(b"")
    with pytest.raises(PteFormatError, match="empty"):
        PteFile.open(tmp_path / "empty.pte")
    with pytest.raises(PteFormatError):
        PteFile.open(tmp_path)  # a directory
    with pytest.raises(PteFormatError, match="identifier"):
        PteFile.open(b"\x00" * 64)


def test_views_survive_close_and_reader_refuses_after_close(delegated_pte: Path) -> None:
    """A view handed out before close() stays readable; the closed reader raises, never crashes."""
    pte = PteFile.open(delegated_pte)
    blob = pte.program.delegate_data(pte.program.execution_plan[0].delegates[0])
    expected = bytes(blob)
    pte.close()
    assert bytes(blob) == expected
    fresh = PteFile.open(delegated_pte)
    fresh.close()
    with pytest.raises(PyrtError):
        _ = fresh.program.execution_plan[0].values


def test_reading_never_imports_torch_or_executorch(delegated_pte: Path, portable_pte: Path) -> None:
    code = f"""
import sys
import pyrt
from pyrt.pte_reader import PteFile
from tests.fixtures.pte import walk
for path in ({str(delegated_pte)!r}, {str(portable_pte)!r}):
    with PteFile.open(path) as pte:
        walk(pte)
    pyrt.inspect(path)
heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'executorch', 'tensorrt', 'tensorrt_rtx',
                                                            'tensorrt_lean'))
print(heavy)
sys.exit(1 if heavy else 0)
"""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_older_24_byte_extended_header_reads_the_same(delegated_pte: Path) -> None:
    """A header length of 24 (no segment_data_size field) is a valid older header, for ExecuTorch too."""
    import struct

    from executorch.exir._serialize._program import _get_extended_header

    data = bytearray(delegated_pte.read_bytes())
    struct.pack_into("<I", data, 12, 24)
    assert _get_extended_header(bytes(data)).is_valid()
    with PteFile.open(bytes(data)) as old, PteFile.open(delegated_pte) as new:
        assert old.extended_header.segment_data_size is None
        assert old.extended_header.program_size == new.extended_header.program_size
        assert [bytes(b) for *_, b in iter_delegate_blobs(old)] == [bytes(b) for *_, b in iter_delegate_blobs(new)]
        ptefixtures.walk(old)


# -- segments past 4 GiB (sparse file) ---------------------------------------------------------------------

GiB = 1 << 30


def _sparse_supported(directory: Path) -> bool:
    probe = directory / "sparse.probe"
    try:
        with open(probe, "wb") as fh:
            fh.seek(256 << 20)
            fh.write(b"\x01")
        return probe.stat().st_blocks * 512 < (1 << 20)
    finally:
        probe.unlink(missing_ok=True)


def test_segments_beyond_4gib_in_a_sparse_file(delegated_pte: Path, tmp_path: Path) -> None:
    if not _sparse_supported(tmp_path):
        pytest.skip("the temporary filesystem does not support sparse files")
    data = delegated_pte.read_bytes()
    eh, program = ptefixtures.raw_program(data)
    segments = [bytes(data[eh.segment_base_offset + s.offset:][:s.size]) for s in program.segments]
    with PteFile.open(delegated_pte) as small:
        moved = small.program.method("forward").delegates[1].index          # the TR02 blob
        named = small.program.named_data[0].segment_index
        before = {(p.name, i): bytes(b) for p, i, _, b in iter_delegate_blobs(small)}
        named_bytes = bytes(small.program.named_data_view("weights_p0"))
    far = {moved: 5 * GiB + 128, named: 9 * GiB}                        # both need 64-bit offsets
    placements = [(far.get(i, program.segments[i].offset), len(seg), ptefixtures.bytes_writer(seg))
                  for i, seg in enumerate(segments)]
    path = ptefixtures.write_relocated(tmp_path / "far.pte", program, placements)
    try:
        _check_far_file(path, eh, program, segments, placements, moved, named, before, named_bytes)
    finally:
        path.unlink()


def _check_far_file(path: Path, eh: Any, program: Any, segments: list, placements: list, moved: int, named: int,
                    before: dict, named_bytes: bytes) -> None:
    assert path.stat().st_size > 9 * GiB and path.stat().st_blocks * 512 < 64 << 20

    # the file is what ExecuTorch's own header/flatbuffer reader says it is
    with open(path, "rb") as fh:
        head = fh.read(eh.program_size + 4096)
    far_eh, far_program = ptefixtures.raw_program(head)
    assert [s.offset for s in far_program.segments][moved] == 5 * GiB + 128
    from executorch.runtime import Runtime, Verification  # ExecuTorch's C++ loader accepts it too

    assert Runtime.get().load_program(path, verification=Verification.Minimal).method_names == {"forward", "other"}

    with PteFile.open(path) as pte:
        assert pte.extended_header.segment_data_size == far_eh.segment_data_size == 9 * GiB + len(segments[named])
        assert [(s.offset, s.size) for s in pte.program.segments] == [(o, n) for o, n, _ in placements]
        after = {(p.name, i): bytes(b) for p, i, _, b in iter_delegate_blobs(pte)}
        assert after == before
        assert parse_blob(pte.program.delegate_data(pte.program.method("forward").delegates[1])).magic == "TR02"
        assert bytes(pte.program.named_data_view("weights_p0")) == named_bytes
        ptefixtures.walk(pte)

    import pyrt

    info = pyrt.inspect(path)
    assert info["file"]["size"] == path.stat().st_size
    assert [s["offset"] for s in info["file"]["segments"]][moved] == 5 * GiB + 128
    fwd = next(m for m in info["methods"] if m["name"] == "forward")
    assert fwd["delegates"][1]["tensorrt"]["magic"] == "TR02"
    assert fwd["delegates"][1]["size"] == len(segments[moved])


def test_test_backend_never_shadows_a_real_tensorrt_backend(delegated_pte: Path) -> None:
    """ExecuTorch looks backends up by class name; after building fixtures ours no longer has that name."""
    from executorch.exir.backend.backend_details import BackendDetails

    assert "__subclasses__" not in vars(BackendDetails)
    ours = ptefixtures._backend_classes()[0]
    assert ours in BackendDetails.__subclasses__() and ours.__name__ != "TensorRTBackend"


def test_the_program_table_is_a_pte_program_and_its_old_name_still_imports(pte: PteFile) -> None:
    """``pyrt.pte_reader.Program`` was the table's name (``pyrt.Program`` is the one ``Program`` now)."""
    assert type(pte.program) is PteProgram
    with pytest.warns(DeprecationWarning, match=r"pyrt\.pte_reader\.Program is now pyrt\.pte_reader\.PteProgram"):
        from pyrt.pte_reader import Program
    assert Program is PteProgram
