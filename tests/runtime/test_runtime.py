"""pyrt.Program on delegate-free programs written by ExecuTorch 1.5.1, against ExecuTorch's own runtime.

No GPU and no fake: every model is exported in this session, run through
``executorch.runtime`` and through pyrt (torch kernels and the numpy core
set), and the outputs compared run by run (state carries across runs).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("executorch")

from pyrt.errors import InputError, ProgramClosedError  # noqa: E402
from pyrt.runtime.program import Program  # noqa: E402

KERNELS = ("torch", "numpy")


# -- models ------------------------------------------------------------------------------------------


class Elementwise(torch.nn.Module):
    def forward(self, x: Any, y: Any) -> Any:
        return torch.sigmoid(torch.relu((x + y) * x) - y)


class Stateful(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.arange(4.0))  # initial value kept in the file
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))  # zero-initialised

    def forward(self, x: Any) -> Any:
        self.acc.mul_(x)
        self.steps.add_(1)
        return self.acc + 1, self.steps * 10


class Views(torch.nn.Module):
    def forward(self, x: Any, y: Any) -> Any:
        a, b = torch.split(x, 2, dim=1)
        z = torch.cat([b, a, y], dim=1)
        return z.permute(1, 0).sum(0), z[:, 1:3].amax(-1), z.reshape(-1)[2:5], z.T @ z, z.mean(dim=0)


class Dynamic(torch.nn.Module):
    def forward(self, x: Any, y: Any) -> Any:
        n = x.shape[0]
        z = x.reshape(n * 2, -1) + 1
        w = torch.zeros(n, 3) + y[:n]
        return z.view(-1), w, z.transpose(0, 1).contiguous().sum(0), torch.cat([x, x], 0)


class SmallCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 16, 3, stride=2, groups=2)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: Any) -> Any:
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.tanh(self.c2(x))
        return torch.softmax(self.fc(x.mean(dim=(2, 3))), -1)


class Cond(torch.nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


class Index(torch.nn.Module):
    def forward(self, x: Any, i: Any) -> Any:
        return x[i], x[:, i]


class Lists(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(-1, 1, 16).reshape(4, 4))

    def forward(self, x: Any) -> Any:
        return x @ self.w

    def pair(self, x: Any, y: Any) -> Any:
        return self.w.sum() * x, [x + y, x * y]


class Pair(torch.nn.Module):
    def __init__(self, base: Lists) -> None:
        super().__init__()
        self.base = base

    def forward(self, x: Any, y: Any) -> Any:
        return self.base.pair(x, y)


class TransposedConv(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = torch.nn.ConvTranspose2d(2, 3, 3, stride=2)

    def forward(self, x: Any) -> Any:
        return self.up(x)


def _lower(programs: Any, path: Path, config: Any = None) -> Path:
    from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower

    et = to_edge_transform_and_lower(programs).to_executorch(config or ExecutorchBackendConfig())
    path.write_bytes(et.buffer)
    return path


def _export(name: str, directory: Path) -> Path:
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass
    from torch.export import Dim, export

    torch.manual_seed(0)
    path = directory / f"{name}.pte"
    r = torch.randn
    if name == "elementwise":
        return _lower(export(Elementwise(), (r(4, 4), r(4, 4))), path)
    if name == "stateful":
        config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["acc"])])
        return _lower(export(Stateful(), (r(4),)), path, config)
    if name == "views":
        return _lower(export(Views(), (r(3, 4), r(3, 2))), path)
    if name == "dynamic":
        b = Dim("b", min=1, max=6)
        return _lower(export(Dynamic(), (r(4, 6), r(6, 3)), dynamic_shapes={"x": {0: b}, "y": None}), path)
    if name == "cnn":
        return _lower(export(SmallCNN().eval(), (r(1, 3, 16, 16),)), path)
    if name == "cond":
        return _lower(export(Cond(), (r(3),)), path)
    if name == "index":
        return _lower(export(Index(), (r(5, 5), torch.tensor([0, 2, 4]))), path)
    if name == "methods":
        base = Lists()
        return _lower({"forward": export(base, (r(2, 4),)), "pair": export(Pair(base), (r(2), r(2)))}, path)
    if name == "transposed_conv":
        return _lower(export(TransposedConv(), (r(1, 2, 5, 5),)), path)
    if name == "unplanned":
        planning = MemoryPlanningPass(alloc_graph_input=False, alloc_graph_output=False)
        return _lower(export(Pair(Lists()), (r(2), r(2))), path, ExecutorchBackendConfig(memory_planning_pass=planning))
    raise KeyError(name)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    directory = tmp_path_factory.mktemp("runtime")
    built: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in built:
            built[name] = _export(name, directory)
        return built[name]

    return get


def et_method(path: Path, method: str = "forward") -> Any:
    from executorch.runtime import Runtime

    return Runtime.get().load_program(str(path)).load_method(method)


def flat(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [y for item in x for y in flat(item)]
    return [x]


def assert_same(ours: Any, ref: list[Any], kind: type) -> None:
    got = flat(ours)
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        assert isinstance(a, kind), type(a)
        b = b.numpy()
        a = a.numpy() if isinstance(a, torch.Tensor) else a
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def compare(path: Path, kernels: str, inputs_seq: list[tuple[Any, ...]], method: str = "forward",
            as_numpy: bool = False) -> Any:
    """Run pyrt and ExecuTorch side by side over a sequence of inputs (state carries over)."""
    ref = et_method(path, method)
    last = None
    with Program(path, kernels=kernels) as prog:
        for inputs in inputs_seq:
            theirs = ref.execute(list(inputs))
            ours_in = tuple(x.numpy() for x in inputs) if as_numpy else inputs
            last = prog.run(*ours_in, method=method)
            assert_same(last, theirs, np.ndarray if as_numpy else torch.Tensor)
    return last


# -- agreement with ExecuTorch -----------------------------------------------------------------------


@pytest.mark.parametrize("kernels", KERNELS)
def test_elementwise(model: Callable[[str], Path], kernels: str) -> None:
    r = torch.randn
    out = compare(model("elementwise"), kernels, [(r(4, 4), r(4, 4)) for _ in range(2)])
    assert isinstance(out, torch.Tensor)  # a single-leaf output comes back bare
    compare(model("elementwise"), kernels, [(r(4, 4), r(4, 4))], as_numpy=True)


@pytest.mark.parametrize("kernels", KERNELS)
def test_mutable_state_persists_like_executorch(model: Callable[[str], Path], kernels: str) -> None:
    seq = [(torch.full((4,), 2.0),), (torch.tensor([1.0, -1.0, 0.5, 3.0]),), (torch.full((4,), 2.0),)]
    acc, steps = compare(model("stateful"), kernels, seq)
    assert steps.tolist() == [30]
    assert acc.tolist() == [1.0, -3.0, 5.0, 37.0]  # arange(4) * 2 * [1, -1, .5, 3] * 2 + 1


@pytest.mark.parametrize("kernels", KERNELS)
def test_views_reductions_and_tensor_lists(model: Callable[[str], Path], kernels: str) -> None:
    r = torch.randn
    out = compare(model("views"), kernels, [(r(3, 4), r(3, 2)), (r(3, 4), r(3, 2))])
    assert isinstance(out, tuple) and len(out) == 5


@pytest.mark.parametrize("kernels", KERNELS)
def test_dynamic_shapes_within_bounds(model: Callable[[str], Path], kernels: str) -> None:
    r = torch.randn
    seq = [(r(n, 6), r(6, 3)) for n in (4, 1, 6, 2)]
    compare(model("dynamic"), kernels, seq)
    compare(model("dynamic"), kernels, seq[:2], as_numpy=True)


@pytest.mark.parametrize("kernels", KERNELS)
def test_dynamic_shape_over_bound_is_input_error(model: Callable[[str], Path], kernels: str) -> None:
    with Program(model("dynamic"), kernels=kernels) as prog:
        with pytest.raises(InputError, match="input 0"):
            prog(torch.randn(7, 6), torch.randn(6, 3))
        prog(torch.randn(2, 6), torch.randn(6, 3))  # still usable afterwards


@pytest.mark.parametrize("kernels", KERNELS)
def test_small_cnn(model: Callable[[str], Path], kernels: str) -> None:
    compare(model("cnn"), kernels, [(torch.randn(1, 3, 16, 16),) for _ in range(2)])


@pytest.mark.parametrize("kernels", KERNELS)
def test_control_flow_jump_and_move(model: Callable[[str], Path], kernels: str) -> None:
    compare(model("cond"), kernels, [(torch.tensor([1.0, 2, 3]),), (torch.tensor([-1.0, 2, -3]),)])


@pytest.mark.parametrize("kernels", KERNELS)
def test_optional_tensor_list_indexing(model: Callable[[str], Path], kernels: str) -> None:
    compare(model("index"), kernels, [(torch.randn(5, 5), torch.tensor([0, 2, 4])),
                                      (torch.randn(5, 5), torch.tensor([4, -1, 1]))])


@pytest.mark.parametrize("kernels", KERNELS)
def test_several_methods_and_nested_outputs(model: Callable[[str], Path], kernels: str) -> None:
    path = model("methods")
    compare(path, kernels, [(torch.randn(2, 4),)])
    out = compare(path, kernels, [(torch.randn(2), torch.randn(2))], method="pair")
    assert isinstance(out, tuple) and isinstance(out[1], list) and len(out[1]) == 2
    with Program(path, kernels=kernels) as prog:
        assert prog.method_names == ("forward", "pair")


@pytest.mark.parametrize("kernels", KERNELS)
def test_unplanned_inputs_and_outputs(model: Callable[[str], Path], kernels: str) -> None:
    r = torch.randn
    compare(model("unplanned"), kernels, [(r(2), r(2)), (r(2), r(2))])
    compare(model("unplanned"), kernels, [(r(2), r(2))], as_numpy=True)


@pytest.mark.parametrize("kernels", KERNELS)
def test_lead_portable_fixture(pte_file: Callable[[str], Path], kernels: str) -> None:
    """gelu/clamp/cat/index/upsample, strings, doubles, initialised mutable buffers, a dynamic method."""
    path = pte_file("portable")
    compare(path, kernels, [(torch.randn(2, 4), torch.tensor([0, 3])) for _ in range(3)])
    compare(path, kernels, [(torch.randn(n, 3),) for n in (1, 16, 5)], method="dyn")


def test_transposed_convolution_torch_only(model: Callable[[str], Path]) -> None:
    """The numpy set has no transposed convolution: reported at load, naming the instruction."""
    from pyrt.errors import UnsupportedOperatorError

    compare(model("transposed_conv"), "torch", [(torch.randn(1, 2, 5, 5),)])
    with pytest.raises(UnsupportedOperatorError, match=r"method 'forward'.*aten::convolution\.out.*transposed"):
        Program(model("transposed_conv"), kernels="numpy")


# -- runtime properties ----------------------------------------------------------------------------------


def test_outputs_are_copies_and_inputs_are_not_retained(model: Callable[[str], Path]) -> None:
    with Program(model("elementwise")) as prog:
        x, y = torch.randn(4, 4), torch.randn(4, 4)
        first = prog(x, y)
        keep = first.clone()
        prog(x * 3, y)
        assert torch.equal(first, keep)  # the arena was reused, the returned tensor was not


def test_numpy_kernels_never_import_torch_when_forced(model: Callable[[str], Path]) -> None:
    with Program(model("elementwise"), kernels="numpy") as prog:
        assert prog.kernels == "numpy"
        out = prog(np.ones((4, 4), np.float32), np.zeros((4, 4), np.float32))
        assert isinstance(out, np.ndarray) and out.dtype == np.float32


def test_env_var_forces_numpy(model: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYRT_KERNELS", "numpy")
    with Program(model("cnn")) as prog:
        assert prog.kernels == "numpy"


def test_constants_are_read_only_views_of_the_file(model: Callable[[str], Path]) -> None:
    with Program(model("cnn"), kernels="numpy") as prog:
        data = np.frombuffer(prog._pte._data, dtype=np.uint8)
        lo, hi = data.ctypes.data, data.ctypes.data + data.nbytes
        table = prog._plans[0].table
        constants = [table.vals[i] for i, info in table.infos.items() if info.storage == "constant"]
        assert constants
        for c in constants:
            assert not c.flags.writeable
            assert lo <= c.__array_interface__["data"][0] < hi


@pytest.mark.parametrize("fold", [False, True])
def test_planned_tensors_are_views_into_one_arena(model: Callable[[str], Path], fold: bool) -> None:
    with Program(model("views"), kernels="torch", fold=fold) as prog:
        table = prog._plans[0].table
        (arena,) = table.arenas.values()
        base, size = arena.data_ptr(), arena.numel()
        planned = [i for i, info in table.infos.items() if info.storage == "planned"]
        assert all(table.infos[i].offset + table.infos[i].nbytes <= size for i in planned)
        at_offset = [i for i in planned if table.vals[i].data_ptr() == base + table.infos[i].offset]
        if fold:  # the others were moved to private memory, or made views, at load (pyrt.runtime.fold)
            assert len(at_offset) > len(planned) // 2
        else:
            assert at_offset == planned
        ptrs = {i: table.vals[i].data_ptr() for i in table.infos if table.infos[i].storage == "planned"}
        prog(torch.randn(3, 4), torch.randn(3, 2))
        assert ptrs == {i: table.vals[i].data_ptr() for i in ptrs}


def test_input_validation(model: Callable[[str], Path]) -> None:
    with Program(model("elementwise")) as prog:
        with pytest.raises(InputError, match="float32"):
            prog(torch.ones(4, 4, dtype=torch.float64), torch.ones(4, 4))
        with pytest.raises(InputError, match=r"shape \(4, 4\)"):
            prog(torch.ones(4, 5), torch.ones(4, 4))
        with pytest.raises(InputError, match="2 inputs"):
            prog(torch.ones(4, 4))
        with pytest.raises(InputError, match="no method"):
            prog.run(torch.ones(4, 4), torch.ones(4, 4), method="nope")
        with pytest.raises(InputError, match="rank"):
            prog(np.ones(16, np.float32), np.ones((4, 4), np.float32))


def test_inputs_accept_dlpack_and_lists(model: Callable[[str], Path]) -> None:
    x, y = np.random.rand(4, 4).astype(np.float32), np.random.rand(4, 4).astype(np.float32)
    with Program(model("elementwise")) as prog:
        expected = prog(x, y)

        class Capsule:  # only __dlpack__: goes back as numpy (host)
            def __init__(self, a: np.ndarray) -> None:
                self.a = a

            def __dlpack__(self, **kw: Any) -> Any:
                return self.a.__dlpack__(**kw)

            def __dlpack_device__(self) -> Any:
                return self.a.__dlpack_device__()

        np.testing.assert_array_equal(prog(Capsule(x), Capsule(y)), expected)
        np.testing.assert_array_equal(prog(x.tolist(), y), expected)


def test_closed_program_raises(model: Callable[[str], Path]) -> None:
    prog = Program(model("elementwise"))
    prog.close()
    prog.close()  # idempotent
    with pytest.raises(ProgramClosedError):
        prog(torch.ones(4, 4), torch.ones(4, 4))
    with pytest.raises(ProgramClosedError):
        _ = prog.method_names


def test_program_from_bytes(model: Callable[[str], Path]) -> None:
    data = model("elementwise").read_bytes()
    with Program(data) as prog:
        x = torch.ones(4, 4)
        assert torch.allclose(prog(x, x), Elementwise()(x, x))


def test_delegate_free_program_without_torch(model: Callable[[str], Path]) -> None:
    """With torch unimportable, kernels="auto" falls back to the numpy set and returns numpy arrays."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        import sys
        sys.modules["torch"] = None
        import numpy as np, pyrt
        with pyrt.Program({str(model("cnn"))!r}) as prog:
            y = prog(np.ones((1, 3, 16, 16), np.float32))
        print(prog.kernels, type(y).__name__, y.shape, round(float(y.sum()), 4))
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["numpy", "ndarray", "(1,", "10)", "1.0"]  # softmax rows sum to 1


def test_inputs_that_require_grad(model: Callable[[str], Path]) -> None:
    lin = torch.nn.Linear(4, 4)
    x = lin(torch.randn(4, 4))
    assert x.requires_grad
    with Program(model("elementwise")) as prog:
        out = prog(x, x)
    assert not out.requires_grad
    torch.testing.assert_close(out, Elementwise()(x, x).detach())


def test_budget_on_a_program_without_engines(model: Callable[[str], Path]) -> None:
    from pyrt.errors import BudgetError
    from pyrt.streaming import BudgetWarning

    with pytest.warns(BudgetWarning, match="no streamable weights"):
        Program(model("elementwise"), budget="1GiB").close()
    with pytest.raises(BudgetError):
        Program(model("elementwise"), budget="lots")
    with Program(model("elementwise")) as prog:
        assert prog.weight_streaming == []
        with pytest.raises(BudgetError, match="no TensorRT delegate with index 0"):
            prog.set_budget({0: "1MiB"})


def test_dlpack_capsule_reader() -> None:
    """The ctypes view of a DLPack capsule (used for CUDA DLPack inputs) reads pointer, shape and dtype."""
    from pyrt.format.dtypes import ScalarType
    from pyrt.memory.interop import _from_dlpack_capsule

    arr = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    d = _from_dlpack_capsule(arr.__dlpack__(), 0, "x")
    assert (d.ptr, d.shape, d.scalar_type, d.nbytes) == (arr.ctypes.data, (2, 3, 4), ScalarType.LONG, arr.nbytes)
    half = np.zeros((5,), np.float16)
    assert _from_dlpack_capsule(half.__dlpack__(), 0, "x").scalar_type == ScalarType.HALF
    with pytest.raises(InputError, match="C-contiguous"):
        _from_dlpack_capsule(arr[:, ::2].__dlpack__(), 0, "x")


def test_bfloat16_outputs_to_numpy_callers_keep_their_bits(tmp_path: Path) -> None:
    """A bfloat16 program on torch kernels called with numpy: ml_dtypes' bfloat16 out, the torch run's bits."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    from executorch.exir import to_edge

    torch.manual_seed(0)
    model = torch.nn.Linear(6, 5).to(torch.bfloat16).eval()
    x = torch.randn(3, 6, dtype=torch.bfloat16)
    path = tmp_path / "bf16.pte"
    path.write_bytes(to_edge(torch.export.export(model, (x,))).to_executorch().buffer)
    with Program(path, kernels="torch") as prog:
        want = prog(x)
        got = prog(x.view(torch.int16).numpy().view(ml_dtypes.bfloat16))
    assert isinstance(got, np.ndarray) and got.dtype == ml_dtypes.bfloat16 and got.shape == (3, 5)
    np.testing.assert_array_equal(got.view(np.int16), want.view(torch.int16).numpy())
