"""Hostile programs and inputs: a typed PyrtError naming the value and where it came from.

Container specs that are deep or malformed, declared sizes larger than pyrt's
limit or the machine's memory, and caller inputs torch or numpy cannot read
(meta or sparse tensors, DLPack producers that raise, objects whose attributes raise).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

from pyrt.errors import InputError, PteFormatError, PyrtError, ResourceError  # noqa: E402
from pyrt.format import limits  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402
from tests.fixtures.pte import relu_program  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ("torch", "numpy")
LEAF = '{"type": null, "context": null, "children_spec": []}'


def run(data: bytes, *inputs: Any, kernels: str = "torch") -> Any:
    with Program(data, kernels=kernels) as prog:
        return prog(*inputs)


def test_the_base_program_runs() -> None:
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    for kernels in KERNELS:
        for planned in (True, False):
            y = run(relu_program(planned_input=planned), x, kernels=kernels)[0]
            np.testing.assert_array_equal(y, np.maximum(x, 0))


# -- container specs ------------------------------------------------------------------------------------


def _nested(depth: int) -> str:
    node = '{"type": "builtins.tuple", "context": "null", "children_spec": ['
    return "[1, " + node * depth + LEAF + "]}" * depth + "]"


@pytest.mark.parametrize("spec, match", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to decode"),
    (_nested(200), "nest deeper than 64 levels"),
    ('[1, {"type": "builtins.tuple", "children_spec": 5}]', "children_spec is a int, not a list"),
    ('[1, {"type": "builtins.tuple", "children_spec": [5]}]', "node at depth 1 is a int, not an object"),
    ('[1, {"type": 7, "children_spec": []}]', "type is a int, not a string"),
    ('[1, {"type": "builtins.dict", "context": "[\\"a\\"]", "children_spec": []}]', "JSON list of its 0 keys"),
    ('[1, {"type": "builtins.dict", "context": 3, "children_spec": []}]', "JSON list of its 0 keys"),
    ('{"type": null}', "expected \\[protocol, node\\], got a dict"),
    ("not json", "not a JSON pytree spec"),
])
@pytest.mark.parametrize("field", [0, 1], ids=["inputs", "outputs"])
def test_bad_container_spec_is_a_format_error(spec: str, match: str, field: int) -> None:
    container = (spec, "") if field == 0 else ("", spec)
    name = ("encoded_inp_str", "encoded_out_str")[field]
    with pytest.raises(PteFormatError, match=rf"method 'forward': container_meta_type\.{name}: .*{match}"):
        Program(relu_program(container=container))


def test_nested_spec_within_the_limit_still_arranges_outputs() -> None:
    depth = 60
    x = np.ones((2, 3), np.float32)
    y = run(relu_program(container=("", _nested(depth))), x)
    for _ in range(depth):
        assert isinstance(y, tuple) and len(y) == 1
        y = y[0]
    np.testing.assert_array_equal(y, x)


def test_dict_inputs_flatten_by_key_name() -> None:
    arg = '{"type": "builtins.dict", "context": "[\\"x\\"]", "children_spec": [' + LEAF + ']}'
    args = '{"type": "builtins.tuple", "context": "null", "children_spec": [' + arg + ']}'
    kwargs = '{"type": "builtins.dict", "context": "[]", "children_spec": []}'
    inp = '[1, {"type": "builtins.tuple", "context": "null", "children_spec": [' + args + ", " + kwargs + "]}]"
    x = np.ones((2, 3), np.float32)
    np.testing.assert_array_equal(run(relu_program(container=(inp, "")), {"x": x})[0], x)
    with pytest.raises(InputError, match="takes 1 inputs"):
        run(relu_program(container=(inp, "")), {"y": x})


# -- declared sizes --------------------------------------------------------------------------------------


def test_huge_arena_is_a_resource_error_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(limits.ENV_VAR, raising=False)
    monkeypatch.setattr(limits, "available_host_memory", lambda: (1 << 30, "test"))
    with pytest.raises(ResourceError, match=r"needs 1099511627776 bytes .*method 'forward' arena 1 "
                                            r"\(non_const_buffer_sizes\[1\]\): 1099511627776 bytes.* 1073741824 bytes"):
        Program(relu_program(arena=1 << 40))


def test_arena_past_the_hard_limit_is_a_format_error() -> None:
    with pytest.raises(PteFormatError, match=r"arena 1 \(non_const_buffer_sizes\[1\]\) declares 1125899906842624 "
                                             r"bytes, more than pyrt's limit of 2\*\*48"):
        Program(relu_program(arena=1 << 50))


def test_huge_unplanned_tensor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(limits, "available_host_memory", lambda: (1 << 30, "test"))
    with pytest.raises(ResourceError, match=r"unplanned tensor value 1 \(sizes \[65536, 65536\], FLOAT\): 17179869184"):
        Program(relu_program(out_sizes=(1 << 16, 1 << 16), unplanned_out=True))
    with pytest.raises(PteFormatError, match=r"unplanned tensor value 1 \(sizes \[1073741824, 1073741824\], FLOAT\) "
                                             r"declares 4611686018427387904 bytes"):
        Program(relu_program(out_sizes=(1 << 30, 1 << 30), unplanned_out=True))


def test_real_available_memory_refuses_a_terabyte_arena(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(limits.ENV_VAR, raising=False)
    room = limits.available_host_memory()
    if room is None or room[0] >= 1 << 40:
        pytest.skip(f"available memory unknown or over 1 TiB here ({room})")
    with pytest.raises(ResourceError, match="arena 1"):
        Program(relu_program(arena=1 << 40))


def test_address_space_limit_is_a_resource_error() -> None:
    """Under ``ulimit -v`` (services and sandboxes set it), an arena that fits MemAvailable but not the
    address-space limit is refused by name at load, not a MemoryError from the allocator."""
    code = textwrap.dedent("""
        import resource, sys
        from pyrt.errors import ResourceError
        from pyrt.format import limits
        from pyrt.runtime.program import Program
        from tests.fixtures.pte import relu_program
        data = relu_program(arena=8 << 30)
        used = int(dict(l.split(":", 1) for l in open("/proc/self/status"))["VmSize"].split()[0]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (used + (2 << 30), resource.RLIM_INFINITY))
        print(limits.available_host_memory()[1])
        try:
            Program(data)
        except ResourceError as exc:
            print("ResourceError:", exc)
        """)
    env = {k: v for k, v in os.environ.items() if k != limits.ENV_VAR}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("RLIMIT_AS (ulimit -v) - VmSize"), proc.stdout
    assert "ResourceError:" in proc.stdout and "arena 1 (non_const_buffer_sizes[1]): 8589934592 bytes" in proc.stdout


ALLOCATION_CHILD = """
import os, resource, sys
import torch  # imported before the limit: only the allocations under test should meet it
from pyrt.errors import PyrtError
from pyrt.runtime.program import Program
from tests.fixtures.pte import relu_program
cases = {"arena": relu_program(arena=4 << 30),
         "unplanned": relu_program(out_sizes=(1 << 15, 1 << 15), unplanned_out=True)}
big = sys.argv[1]
with open(big, "wb") as f:  # a sparse 4 GiB file that starts with a valid program
    f.write(relu_program())
    f.truncate(4 << 30)
used = int(dict(l.split(":", 1) for l in open("/proc/self/status"))["VmSize"].split()[0]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (used + (2 << 30), resource.RLIM_INFINITY))
os.environ["PYRT_MAX_HOST_BYTES"] = str(1 << 40)  # the load-time figure lets everything through: the allocator decides
runs = [(name, data, {"kernels": k}) for name, data in cases.items() for k in ("numpy", "torch")]
runs += [("private copy", big, {"mmap": False}), ("mapping", big, {"mmap": True})]
for name, source, kw in runs:
    try:
        Program(source, **kw).close()
        print(name, kw, "loaded")
    except BaseException as exc:
        print(name, kw, type(exc).__name__, str(exc).replace(chr(10), " ")[:300])
"""


def test_failed_allocations_are_resource_errors_naming_what(tmp_path: Path) -> None:
    """Under an address-space limit, each allocation a load makes that fails is a ResourceError naming it:
    host arenas, unplanned tensors (numpy's MemoryError and torch's allocator's RuntimeError), the private
    copy of ``mmap=False`` and the mapping itself."""
    env = {k: v for k, v in os.environ.items() if k != limits.ENV_VAR}
    proc = subprocess.run([sys.executable, "-c", ALLOCATION_CHILD, str(tmp_path / "big.pte")], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 6, proc.stdout
    want = [r"arena .*numpy.* ResourceError <bytes>: method 'forward': host arena 1 \(4294967296 bytes",
            r"arena .*torch.* ResourceError <bytes>: method 'forward': host arena 1 \(4294967296 bytes",
            r"unplanned .*numpy.* ResourceError method 'forward': unplanned tensor value 1 \(4294967296 bytes",
            r"unplanned .*torch.* ResourceError method 'forward': unplanned tensor value 1 \(4294967296 bytes",
            r"private copy .* ResourceError .*big.pte: reading the file into private memory \(mmap=False, 4294967296",
            r"mapping .* ResourceError .*big.pte: cannot map the file"]
    for line, pattern in zip(lines, want, strict=True):
        assert re.match(pattern, line), (pattern, line)


def test_env_var_sets_the_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(limits.ENV_VAR, "47")
    with pytest.raises(ResourceError, match=r"needs 48 bytes .* more than the 47 bytes available \(\$PYRT_MAX_HOST"):
        Program(relu_program())
    monkeypatch.setenv(limits.ENV_VAR, "48")
    Program(relu_program()).close()
    monkeypatch.setenv(limits.ENV_VAR, "lots")
    with pytest.raises(ResourceError, match=r"PYRT_MAX_HOST_BYTES='lots' is not a byte count"):
        Program(relu_program())


# -- caller inputs ---------------------------------------------------------------------------------------


class RaisingDLPack:
    """A DLPack producer whose methods raise (as a broken or hostile one may)."""

    def __init__(self, device: tuple[int, int] = (1, 0), exc: type[Exception] = ValueError) -> None:
        self.device, self.exc = device, exc

    def __dlpack__(self, stream: Any = None) -> Any:
        raise self.exc("producer failed")

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device


class RaisingCAI:
    @property
    def __cuda_array_interface__(self) -> Any:
        raise KeyError("no interface today")


BAD_INPUTS = {
    "meta": (lambda: torch.ones(2, 3, device="meta"), "a meta tensor has no data"),
    "sparse_coo": (lambda: torch.ones(2, 3).to_sparse(), "sparse_coo tensor is not supported"),
    "sparse_csr": (lambda: torch.ones(2, 3).to_sparse_csr(), "sparse_csr tensor is not supported"),
    "dlpack_raises": (lambda: RaisingDLPack(), "DLPack input could not be read.*ValueError: producer failed"),
    "dlpack_cuda_raises": (lambda: RaisingDLPack((2, 0), OSError), "DLPack input could not be read.*OSError"),
    "cai_raises": (lambda: RaisingCAI(), "KeyError"),
}


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.parametrize("planned", [True, False], ids=["planned", "unplanned"])
@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_unreadable_input_is_an_input_error(case: str, kernels: str, planned: bool) -> None:
    make, match = BAD_INPUTS[case]
    with Program(relu_program(planned_input=planned), kernels=kernels) as prog:
        with pytest.raises(InputError, match=rf"method 'forward'.*{match}"):
            prog(make())
        x = np.ones((2, 3), np.float32)  # the method still runs afterwards
        np.testing.assert_array_equal(prog(x)[0], x)


def test_only_pyrt_errors_escape_for_odd_objects() -> None:
    class Weird:
        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(f"no {name}")

    with Program(relu_program()) as prog:
        for obj in (Weird(), object(), "text", [[1, 2, 3]], {"a": 1}, None, 3.5):
            with pytest.raises(PyrtError):
                prog(obj)


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "unplanned"])
@pytest.mark.parametrize("kernels", KERNELS)
def test_memoryview_inputs(kernels: str, planned: bool) -> None:
    """Strided and Fortran-order memoryviews are read correctly; a flat byte view is a typed mismatch."""
    base = np.arange(24, dtype=np.float32).reshape(4, 6) - 10
    with Program(relu_program(planned_input=planned), kernels=kernels) as prog:
        for view, x in ((memoryview(base[::2, ::2]), base[::2, ::2]),
                        (memoryview(np.asfortranarray(base[1:3, :3])), base[1:3, :3])):
            np.testing.assert_array_equal(np.asarray(prog(view)[0]), np.maximum(x, 0))
        with pytest.raises(InputError, match="method 'forward' input 0"):
            prog(memoryview(np.ones(6, np.float32).tobytes()))
