"""Run a planned method: bind inputs, walk the instruction chain, hand outputs back.

The hot loop is a ``for`` over precomputed step closures (straight-line
chains) or a program counter over the same steps when the chain jumps
(``JumpFalseCall``). Inputs are copied into their memory-planned tensors (or
bound zero-copy when the file did not plan them; :mod:`pyrt.runtime.inputs`);
outputs are copied out in the kind the caller used (torch in -> torch out, numpy
in -> numpy out; :mod:`pyrt.runtime.outputs`) and arranged like the method's
pytree output when that is a plain tuple/list. Device work of a run shares one
:class:`~pyrt.runtime.run_state.RunState`.

>>> runner = MethodRunner(plan, default_kind="numpy")          # doctest: +SKIP
>>> runner((x, y), stream=None)                                 # doctest: +SKIP
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from pyrt.errors import ExecutionError, InputError, ProgramClosedError, PyrtError
from pyrt.format.pytree import input_flattener, output_builder
from pyrt.kernels.base import noop
from pyrt.memory.interop import caller_kind, is_torch_tensor
from pyrt.memory.table import PLANNED
from pyrt.runtime import state_rows
from pyrt.runtime.cuda_graphs import Segment, segment_steps
from pyrt.runtime.device_context import DeviceContext
from pyrt.runtime.graph_forward import graph_forward
from pyrt.runtime.inputs import input_failure, input_setter
from pyrt.runtime.outputs import output_getter
from pyrt.runtime.plan import Instr, MethodPlan
from pyrt.runtime.run_state import RunState
from pyrt.runtime.steady import shape_key, steady_chain


class MethodRunner:
    """Callable that runs one planned method; not re-entrant: runs take turns on ``_lock``.

    ``closed`` is set (under the lock) when the Program is closed; a run that was
    waiting for the lock then raises ProgramClosedError instead of touching freed memory.
    """

    def __init__(self, plan: MethodPlan, *, default_kind: str, devices: DeviceContext | None = None, cuda: Any = None,
                 cuda_graphs: bool = False, graph_outputs: str = "copy") -> None:
        self.plan = plan
        self.cuda = devices.cuda if devices is not None else cuda  # for device inputs of host-only methods
        self.name = plan.name
        self.default_kind = default_kind
        self.devices = devices  # when the method touches CUDA
        self._lock = threading.Lock()
        self.closed = False
        table = plan.table
        self._vals = table.vals
        self._setters = [input_setter(plan, pos, i) for pos, i in enumerate(plan.inputs)]
        self._getters = [output_getter(plan, pos, i) for pos, i in enumerate(plan.outputs)]
        in_spec, out_spec = plan.io_specs
        self._flatten = input_flattener(in_spec, len(plan.inputs), plan.name)
        self._build = output_builder(out_spec, len(plan.outputs))
        self._straight = not plan.has_jumps
        # One step per instruction, None for JumpFalseCall (straight chains hold none).
        self._plain: list[list[Any]] = [[ins.step for ins in chain] for chain in plan.chains]
        self._segments: list[Segment] = []
        # Straight chains run without their no-op steps (folded calls, frees of planned memory);
        # _pcs maps a position in such a list back to its instruction (for error messages).
        self._pcs: list[list[int]] = [list(range(len(steps))) for steps in self._plain]
        self._fast: list[list[Any]] = self._plain
        if self._straight:
            self._pcs = [[pc for pc, step in enumerate(steps) if step is not noop] for steps in self._plain]
            self._fast = [[steps[pc] for pc in pcs] for steps, pcs in zip(self._plain, self._pcs, strict=True)]
        if cuda_graphs and devices is not None and self._straight:  # device-only runs replay as CUDA graphs
            self._fast = []
            self._pcs = [list(range(len(steps))) for steps in self._plain]
            for steps in self._plain:
                grouped, segments = segment_steps(steps, devices)
                self._fast.append(grouped)
                self._segments.extend(segments)
        self._steps = self._fast
        self._step_pcs = self._pcs
        # Dynamic shapes: the chain to run when the inputs' shapes repeat the last run's (pyrt.runtime.steady).
        self._steady = None if cuda_graphs else steady_chain(plan)
        self._last_key: tuple[Any, ...] | None = None  # shapes of the last run that completed
        # device inputs and outputs around one graph: replayed with the least host work (pyrt.runtime.graph_forward)
        self._graph_forward = graph_forward(plan, self._fast, devices, self._flatten, graph_outputs) \
            if self._segments else None
        self.observer: Any = None  # see observe(); None: runs execute the plain steps, nothing else
        # the context every run enters when a step asks for one (numpy steps: floating-point events silent)
        self._context: Callable[[], AbstractContextManager[Any]] | None = next(
            (c for steps in self._plain for s in steps if (c := getattr(s, "run_context", None)) is not None), None)

    def reset_graphs(self) -> None:
        """Drop captured CUDA graphs (after execution contexts were recreated); they are captured again."""
        for segment in self._segments:
            segment.reset()

    def observe(self, observer: Any) -> None:
        """Install a run/step observer (``None`` removes it); :mod:`pyrt.runtime.profile` is the one user.

        ``observer.wrap(runner, chain, pc, step) -> step`` is asked once per instruction here,
        so the instruction loop is the same with or without an observer; each run goes through
        ``observer.run(runner, call, inputs, stream)``, which must call ``call(inputs, stream)``.
        An observed method runs instruction by instruction (CUDA graphs are not replayed meanwhile).
        """
        with self._lock:
            self.observer = observer
            self._last_key = None
            self._step_pcs = self._pcs if observer is None else [list(range(len(c))) for c in self._plain]
            self._steps = self._fast if observer is None else [
                [None if step is None else observer.wrap(self, ci, pc, step) for pc, step in enumerate(chain)]
                for ci, chain in enumerate(self._plain)]

    # -- state ---------------------------------------------------------------------------
    def state_sizes(self) -> tuple[int, ...]:
        """The first dimensions of the method's state tensors (:mod:`pyrt.runtime.state_rows`)."""
        return state_rows.state_sizes(self.plan)

    def copy_state_rows(self, size: int, runs: Sequence[tuple[int, int, int]]) -> int:
        """Rows copied inside the state tensors of first dimension ``size``, between runs (taking the run lock)."""
        with self._lock:
            if self.closed:
                raise ProgramClosedError(f"method {self.name!r}: the program was closed")
            return state_rows.copy_rows(self.plan, self.devices, size, runs)

    # -- running ---------------------------------------------------------------------------
    def __call__(self, inputs: Sequence[Any], stream: Any = None) -> Any:
        if self.observer is not None:
            return self.observer.run(self, self._call, inputs, stream)
        forward = self._graph_forward
        if forward is not None:  # None back: not captured yet, or not device inputs of the planned shapes
            with self._lock:
                outs = None if self.closed else forward(inputs, stream)
            if outs is not None:
                return self._build(outs)
        return self._call(inputs, stream)

    def _call(self, inputs: Sequence[Any], stream: Any) -> Any:
        try:
            flat = self._flatten(inputs)
            kind = self._kind(flat)
            if self.devices is not None:
                state: RunState | None = RunState(stream, flat, self.devices)
            else:  # no device work: a stream, if given, has nothing to order
                state = RunState(None, (), None, self.cuda) if self.cuda is not None else None
        except PyrtError:
            raise
        except Exception as exc:  # a caller object whose attributes raise
            raise InputError(f"method {self.name!r}: cannot read the inputs: {type(exc).__name__}: {exc}") from exc
        with self._lock:
            if self.closed:
                raise ProgramClosedError(f"method {self.name!r}: the program was closed while this run waited")
            if self.devices is not None and state is not None:  # device work: order it on the run's streams
                self.devices.begin(state, flat)
            try:
                pos = 0  # anything but a PyrtError from a setter becomes an InputError naming the input
                try:
                    for setter, x in zip(self._setters, flat, strict=True):
                        setter(x, state)
                        pos += 1
                except PyrtError:
                    raise
                except Exception as exc:
                    raise input_failure(self.name, pos, flat[pos], exc) from exc
                run = self._execute_keyed if self._steady is not None and self.observer is None else self._execute
                if self._context is None:
                    run(state)
                else:
                    with self._context():
                        run(state)
                try:
                    outs = [get(kind, state) for get in self._getters]
                except PyrtError:
                    raise
                except Exception as exc:
                    raise ExecutionError(f"method {self.name!r}: handing an output back failed: "
                                         f"{type(exc).__name__}: {exc}") from exc
            finally:
                if self.devices is not None and state is not None:
                    self.devices.end(state)
        return self._build(outs)

    def _kind(self, flat: Sequence[Any]) -> str:
        for x in flat:
            k = caller_kind(x)
            if k is not None:
                return k
        return self.default_kind

    def _execute(self, state: RunState | None) -> None:
        for ci, steps in enumerate(self._steps):
            if self._straight:
                self._run_straight(ci, steps, self._step_pcs[ci])
            else:
                self._run_jumping(ci, self.plan.chains[ci], steps)

    def _execute_keyed(self, state: RunState | None) -> None:
        """A dynamic-shape run: the steady chain when every input shape repeats the last completed run's."""
        key = shape_key(self._vals, self.plan.inputs)
        last, self._last_key = self._last_key, None  # a run that fails leaves no trusted shapes
        if key != last or self._steady is None:
            self._execute(state)
        else:
            self._run_straight(0, *self._steady)
        self._last_key = key

    def _run_straight(self, ci: int, steps: Sequence[Callable[[], Any]], pcs: Sequence[int]) -> None:
        """Run chain ``ci``'s straight-line ``steps``; a failure names instruction ``pcs[i]`` of step i."""
        it = iter(steps)
        try:
            for step in it:  # no enumerate on the hot path: the failing position follows from what is left
                step()
        except PyrtError:
            raise
        except Exception as exc:
            raise self._failure(ci, pcs[len(steps) - operator.length_hint(it) - 1], exc) from exc

    def _run_jumping(self, ci: int, chain: list[Instr], steps: list[Any]) -> None:
        vals, pc, n = self._vals, 0, len(chain)
        while pc < n:
            step = steps[pc]
            try:
                if step is None:
                    ins = chain[pc]
                    pc = pc + 1 if _truthy(vals[ins.cond]) else ins.target
                    continue
                step()
            except PyrtError:
                raise
            except Exception as exc:
                raise self._failure(ci, pc, exc) from exc
            pc += 1

    def _failure(self, chain: int, pc: int, exc: Exception) -> PyrtError:
        """A kernel raised something untyped (bad data for it, typically): name the instruction."""
        what = self.plan.chains[chain][pc].what if pc < len(self.plan.chains[chain]) else "?"
        return ExecutionError(f"method {self.name!r} instruction {pc} ({what}) failed: {type(exc).__name__}: {exc}")


def _truthy(v: Any) -> bool:
    if isinstance(v, (bool, int, float)):
        return bool(v)
    if isinstance(v, np.ndarray) or is_torch_tensor(v):
        return bool(v.all())
    raise InputError(f"JumpFalseCall condition is a {type(v).__name__}, not a bool or tensor")


__all__ = ["MethodRunner", "RunState", "output_builder", "input_flattener", "PLANNED"]
