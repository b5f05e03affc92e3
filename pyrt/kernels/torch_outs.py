"""torch's out= kernels resize an out tensor whose shape is not the result's, with only a warning; pyrt refuses.

An out tensor of static shape is a view of its memory-planned arena bytes: a resized one
would silently hand back (or pass on) a tensor of another shape than the file declares.
:func:`checking_static_outs` wraps a torch step so that such a resize is an
:class:`~pyrt.errors.InputError` naming the instruction, the operator, the value and both
shapes, as the numpy kernels report it. Where every tensor the call reads has one fixed
static shape (the result shapes cannot change between runs), only the first run is checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, cast

from pyrt.errors import InputError
from pyrt.kernels.base import KernelSite, Step, with_steady

if TYPE_CHECKING:
    import torch

Out = tuple[int, "Callable[[], torch.Tensor]", tuple[int, ...]]  # (value, getter, planned shape)


def checking_static_outs(step: Step, site: KernelSite, out_args: Sequence[int], tensor_args: Sequence[int]) -> Step:
    """``step``, checked against resizes of its static out tensors (``step`` itself when it has none)."""
    static = _static_outs(out_args, site)
    if not static:
        return step
    checked = _checking(step, static, site.where, once=_fixed_inputs(site, out_args, tensor_args))
    steady = getattr(step, "steady", None)  # steady runs repeat a checked run's shapes (pyrt.runtime.steady)
    return with_steady(checked, steady) if steady is not None else checked


def _static_outs(out_args: Sequence[int], site: KernelSite) -> list[Out]:
    """(value, getter, planned shape) of each out tensor of static shape: torch must not resize it."""
    table, out = site.table, []
    for k in out_args:
        for j in (table.items[site.args[k]] if site.kind(k) == "TensorList" else (site.args[k],)):
            info = table.infos.get(j)
            if info is not None and not info.dynamic:
                out.append((j, cast("Callable[[], torch.Tensor]", table.getter(j)), tuple(info.sizes)))
    return out


def _fixed_inputs(site: KernelSite, out_args: Sequence[int], tensor_args: Sequence[int]) -> bool:
    """Whether every tensor the call reads is one object of static shape for the method's life."""
    table = site.table
    for k in tensor_args:
        if k in out_args:
            continue
        if not site.is_const(k):
            return False
        idxs = table.items[site.args[k]] if site.kind(k) in ("TensorList", "OptionalTensorList") else (site.args[k],)
        if any(j >= 0 and (info := table.infos.get(j)) is not None and info.dynamic for j in idxs):
            return False
    return True


def _checking(step: Step, outs: list[Out], where: str, once: bool) -> Step:
    """``step``, then an InputError if torch resized a static out tensor (it does so with a warning only).

    With ``once`` (inputs of fixed static shapes: the result shapes cannot change) only the first
    run that completes is checked.
    """
    pending = [True]

    def checked() -> None:
        step()
        if pending[0]:
            for j, get, planned in outs:
                t = get()
                if tuple(t.shape) != planned:
                    shape = tuple(t.shape)
                    t.resize_(planned)  # the planned view again (a shrink: its storage still holds it)
                    raise InputError(f"{where}: result shape {shape} does not match the planned {planned} of "
                                     f"static out tensor value {j} (torch would resize it)")
            pending[0] = not once

    return checked


__all__ = ["checking_static_outs"]
