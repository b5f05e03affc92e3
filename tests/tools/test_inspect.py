"""``pyrt.inspect`` and ``pyrt inspect`` against ExecuTorch's view of ExecuTorch-written files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import pyrt
from pyrt.format.trt_blob import parse_blob
from tests.fixtures import pte as ptefixtures
from tests.fixtures.pte import et_raw, et_restored

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pyrt", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def spec_text(value: bytes) -> str:
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return text if text is not None and text.isprintable() else "hex:" + value.hex()


def test_inspect_matches_executorch(any_pte: Path) -> None:
    info = pyrt.inspect(any_pte)
    eh, program = et_raw(any_pte)
    restored = et_restored(any_pte).program
    f = info["file"]
    assert f["size"] == any_pte.stat().st_size
    assert f["identifier"] == "ET12"
    assert f["segment_base_offset"] == (eh.segment_base_offset if eh is not None and eh.is_valid() else 0)
    assert f["segments"] == [{"offset": s.offset, "size": s.size} for s in program.segments]
    assert [m["name"] for m in info["methods"]] == [p.name for p in program.execution_plan]
    for m, plan, rplan in zip(info["methods"], program.execution_plan, restored.execution_plan, strict=True):
        assert m["inputs"] == list(plan.inputs) and m["outputs"] == list(plan.outputs)
        assert m["num_values"] == len(plan.values)
        assert m["operators"] == [{"name": o.name, "overload": o.overload} for o in plan.operators]
        expected = []
        for ins in (i for c in plan.chains for i in c.instructions):
            kind = type(ins.instr_args).__name__
            item: dict[str, Any] = {"kind": kind}
            if kind == "KernelCall":
                op = plan.operators[ins.instr_args.op_index]
                item["op"] = f"{op.name}.{op.overload}" if op.overload else op.name
            elif kind == "DelegateCall":
                item["delegate"] = ins.instr_args.delegate_index
            expected.append(item)
        assert [{k: i[k] for k in ("kind", "op", "delegate") if k in i} for i in m["instructions"]] == expected
        assert len(m["delegates"]) == len(plan.delegates)
        for d, et_d, et_rd in zip(m["delegates"], plan.delegates, rplan.delegates, strict=True):
            blob = restored.backend_delegate_data[et_rd.processed.index].data
            assert d["id"] == et_d.id
            assert d["location"] == ("segment" if et_d.processed.location == 1 else "inline")
            assert d["index"] == et_d.processed.index
            assert d["size"] == len(blob)
            assert d["compile_specs"] == {c.key: spec_text(bytes(c.value)) for c in et_d.compile_specs}
            if et_d.id != "TensorRTBackend":
                assert d["tensorrt"] is None
                continue
            trt = parse_blob(blob)
            tag = dict((c.key, bytes(c.value)) for c in et_d.compile_specs).get("engine_tag", b"syn").decode()
            assert {k: d["tensorrt"][k] for k in ("magic", "device_id", "inputs", "outputs", "engine_size",
                                                  "target_platform")} == {
                "magic": trt.magic, "device_id": trt.device_id, "inputs": [b.name for b in trt.inputs],
                "outputs": [b.name for b in trt.outputs], "engine_size": len(ptefixtures.expected_engine(tag)),
                "target_platform": trt.target_platform}


def test_json_cli_returns_the_same_data(any_pte: Path) -> None:
    proc = cli("inspect", "--json", str(any_pte))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == json.loads(json.dumps(pyrt.inspect(any_pte)))


def test_inspect_accepts_bytes_and_an_open_file(delegated_pte: Path) -> None:
    from pyrt.pte_reader import PteFile

    by_path = pyrt.inspect(delegated_pte)
    by_bytes = pyrt.inspect(delegated_pte.read_bytes())
    with PteFile.open(delegated_pte) as pte:
        by_file = pyrt.inspect(pte)
    for other in (by_bytes, by_file):
        assert other["methods"] == by_path["methods"]
        assert {k: v for k, v in other["file"].items() if k != "source"} == {
            k: v for k, v in by_path["file"].items() if k != "source"}


def test_text_report_names_methods_operators_delegates_and_engines(delegated_pte: Path) -> None:
    proc = cli("inspect", str(delegated_pte))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    info = pyrt.inspect(delegated_pte)
    for m in info["methods"]:
        assert repr(m["name"]) in out
        for op in m["operators"]:
            assert f"{op['name']}.{op['overload']}" in out
        for d in m["delegates"]:
            trt = d["tensorrt"]
            assert d["id"] in out and trt["magic"] in out and f"device {trt['device_id']}" in out
            assert all(name in out for name in trt["inputs"] + trt["outputs"])
    assert "TR01" in out and "TR02" in out
    assert "weight_streaming_budget = 1048576" in out and "hex:00ff10" in out


def test_cli_reports_bad_files_without_a_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pte"
    bad.write_bytes(b"\x10\x00\x00\x00XXXX" + b"\x00" * 32)
    for args in (("inspect", str(bad)), ("inspect", "--json", str(bad)), ("inspect", str(tmp_path / "nope.pte"))):
        proc = cli(*args)
        assert proc.returncode == 1
        assert proc.stderr.startswith("pyrt: error:") and "Traceback" not in proc.stderr


@pytest.fixture(scope="module")
def mixed_delegates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The synthetic program plus a non-TensorRT delegate and a TensorRT delegate with a broken blob."""
    from executorch.exir import schema as s

    program = ptefixtures.synthetic_program()
    plan = program.execution_plan[0]
    program.backend_delegate_data += [s.BackendDelegateInlineData(data=b"opaque other-backend payload"),
                                      s.BackendDelegateInlineData(data=b"TR01" + b"\xff" * 40)]
    for i, backend in ((1, "OtherBackend"), (2, "TensorRTBackend")):
        plan.delegates.append(s.BackendDelegate(
            id=backend, processed=s.BackendDelegateDataReference(location=s.DataLocation.INLINE, index=i),
            compile_specs=[]))
    path = tmp_path_factory.mktemp("mixed") / "mixed.pte"
    path.write_bytes(bytes(ptefixtures.serialize_program(program)))
    return path


def test_non_tensorrt_and_broken_tensorrt_delegates(mixed_delegates: Path) -> None:
    delegates = pyrt.inspect(mixed_delegates)["methods"][0]["delegates"]
    assert [d["id"] for d in delegates] == ["TensorRTBackend", "OtherBackend", "TensorRTBackend"]
    assert delegates[0]["tensorrt"]["magic"] == "TR01"
    assert delegates[1]["tensorrt"] is None and delegates[1]["size"] == len(b"opaque other-backend payload")
    assert delegates[2]["tensorrt"] is None
    proc = cli("inspect", str(mixed_delegates))
    assert proc.returncode == 0 and "OtherBackend" in proc.stdout


# -- where stored tensors live (.pte segments, .ptd files) ----------------------------------------------------


def test_inspect_says_which_file_holds_each_tensor(pte_file) -> None:
    pte = pte_file("portable_external")
    ptd = pte.with_suffix(".ptd")
    alone = pyrt.inspect(pte)["methods"][0]["tensors"]
    with_data = pyrt.inspect(pte, data=ptd)
    tensors = with_data["methods"][0]["tensors"]
    external = {t["key"]: t for t in tensors if t["location"] == "external"}
    assert set(external) == {"lin.weight", "lin.bias"}
    assert {t["file"] for t in external.values()} == {str(ptd)}
    assert external["lin.weight"]["dtype"] == "float32" and external["lin.weight"]["shape"] == [3, 4]
    assert {t["file"] for t in alone if t["location"] == "external"} == {None}, "no data file: reported missing"
    assert with_data["data_files"] == [str(ptd)]
    kept = [t for t in tensors if t["location"] != "external"]
    assert kept and all(t["file"] == ".pte" for t in kept)  # the initialised mutable buffer stays in the .pte
    json.dumps(with_data)


def test_inspect_a_ptd_and_the_cli(pte_file) -> None:
    pte = pte_file("portable_external")
    ptd = pte.with_suffix(".ptd")
    info = pyrt.inspect(ptd)
    assert info["file"]["identifier"] == "FT01"
    assert [(e["key"], e["dtype"], e["shape"]) for e in info["entries"]] == [
        ("lin.weight", "float32", [3, 4]), ("lin.bias", "float32", [3])]
    text = cli("inspect", str(pte), "--data", str(ptd))
    assert text.returncode == 0, text.stderr
    assert "lin.weight: float32[3, 4] -> portable_external.ptd" in text.stdout
    assert "external: 2 tensor(s), 60 B in" in text.stdout
    missing = cli("inspect", str(pte))
    assert "MISSING (no data file holds them)" in missing.stdout
    assert "lin.bias: float32[3] -> missing" in missing.stdout
    data_file = cli("inspect", str(ptd))
    assert "lin.bias: float32[3], 12 B at offset" in data_file.stdout
    as_json = json.loads(cli("inspect", "--json", str(pte), "--data", str(ptd)).stdout)
    assert as_json["data_files"] == [str(ptd)]
    bad = cli("inspect", str(pte), "--data", str(pte))
    assert bad.returncode == 1 and "file identifier b'ET12' is not b'FT01'" in bad.stderr
