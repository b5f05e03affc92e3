"""Mutable buffers (a static KV cache): initial values kept, memory on the device between calls.

After ``torch.export``, a buffer an engine updates is a buffer *mutation*: the engine
reads the buffer and returns its new value, and ExecuTorch writes that value back
with ``aten::copy_(buffer, new)`` after the call. ExecuTorch's device propagation
then puts the buffer in host memory and brackets the engine with copies, so every
call would move the whole cache host -> device and back.

:class:`StateOnDevice` runs right after that propagation (wrapped around
``ExecutorchBackendConfig.to_out_var_pass``, the last pass before out-variant
conversion and memory planning). For each written-back buffer whose readers are
all host -> device copies onto one device, and whose new value comes from an
engine on that device, it drops those copies, tags the buffer itself with the
device, and writes the engine's output back directly. Memory planning then places
the buffer in that device's arena, and the write-back is a device-to-device
``aten::copy_``.

The same pass keeps one host -> device copy per host value and device
(:func:`share_host_copies`): ExecuTorch copies a host input once for each delegate
that reads it, which for a decoder cut into layer groups is once per group and step.

Every written-back buffer is also marked ``et_init_buffer``, so its initial value
(the registered buffer's, zeros for a fresh cache) is stored in the file's mutable
data and loaded with the program: without it ExecuTorch leaves the memory
uninitialized, and a masked-out cache row of NaN bit patterns would still poison
attention (0 * NaN). The file grows by the buffers' size.

>>> StateOnDevice(lambda gm: gm).moved
[]
"""

from __future__ import annotations

import logging
import operator
from typing import Any

import torch
import torch.fx as fx

log = logging.getLogger("pyrt.export")


class StateOnDevice:
    """A pass: move written-back buffers to their engine's device, then run ``then``."""

    def __init__(self, then: Any) -> None:
        self.then = then
        self.moved: list[str] = []

    def __call__(self, gm: fx.GraphModule) -> Any:
        moved = move_state_to_device(gm)
        self.moved.extend(moved)
        if len(moved) + skip_host_hops(gm) + share_host_copies(gm):
            gm.recompile()  # once, after every rewrite
        return self.then(gm)


def move_state_to_device(gm: fx.GraphModule) -> list[str]:
    """Rewrite ``gm``'s graph in place (see the module docstring); returns the buffers moved."""
    h2d, d2h = _copy_ops()
    moved = []
    for copy in _calls(gm, _is_copy_):
        buffer, value = copy.args[0], copy.args[1]
        if not (isinstance(buffer, fx.Node) and buffer.op == "placeholder" and isinstance(value, fx.Node)):
            continue
        buffer.meta["et_init_buffer"] = True  # serialize the initial value (see the module docstring)
        source = value.args[0] if value.op == "call_function" and value.target == d2h else None
        device = _delegate_device(source)
        readers = [u for u in buffer.users if u is not copy]
        if device is None or not readers or any(u.target != h2d or _device(u) != device for u in readers):
            continue
        for reader in readers:
            reader.replace_all_uses_with(buffer)
            gm.graph.erase_node(reader)
        _set_device(buffer, device)
        copy.args = (buffer, source, *copy.args[2:])
        if not value.users:
            gm.graph.erase_node(value)
        moved.append(buffer.name)
    if moved:
        log.info("kept %d mutable buffer(s) in device memory: %s", len(moved), ", ".join(moved))
    return moved


def skip_host_hops(gm: fx.GraphModule) -> int:
    """A delegate's output that only other delegates read, on another GPU (layer groups spread over GPUs), goes
    to them as it is: ExecuTorch's device -> host -> device copies are dropped, and the runtime copies it device to
    device, ordered on both devices' streams (a peer copy, else through host memory: pyrt.runtime.delegate_steps).
    Returns how many host hops went."""
    from executorch.exir.delegate import executorch_call_delegate

    h2d, d2h = _copy_ops()
    hops = 0
    for node in _calls(gm, lambda target: target == h2d):
        back = node.args[0]
        if not (isinstance(back, fx.Node) and back.op == "call_function" and back.target == d2h):
            continue
        source = back.args[0]
        if not isinstance(source, fx.Node) or _delegate_device(source) is None or not node.users or \
                any(u.target is not executorch_call_delegate for u in node.users):
            continue
        node.replace_all_uses_with(source)
        gm.graph.erase_node(node)
        if not back.users:
            gm.graph.erase_node(back)
        hops += 1
    if hops:
        log.info("%d value(s) go from delegate to delegate across GPUs without a host copy", hops)
    return hops


def share_host_copies(gm: fx.GraphModule) -> int:
    """One host -> device copy per host value and device: ExecuTorch copies a host value once for each delegate
    that reads it, so a decoder cut into layer groups copied its positions once per group and step; the later
    copies are dropped and their readers read the first. A value something writes in place (a written-back
    buffer) keeps every copy: a later one may read what the write left. Returns how many copies went."""
    h2d, _ = _copy_ops()
    first: dict[tuple[fx.Node, Any], fx.Node] = {}
    shared = 0
    for node in _calls(gm, lambda target: target == h2d):
        source, device = node.args[0], _device(node)
        if not isinstance(source, fx.Node) or device is None or _written_in_place(source):
            continue
        kept = first.setdefault((source, device), node)
        if kept is node:
            continue
        node.replace_all_uses_with(kept)
        gm.graph.erase_node(node)
        shared += 1
    if shared:
        log.info("%d host -> device copies shared with an earlier copy of the same value", shared)
    return shared


def _written_in_place(node: fx.Node) -> bool:
    return any(u.op == "call_function" and _is_copy_(u.target) and u.args[0] is node for u in node.users)


def _calls(gm: fx.GraphModule, is_target: Any) -> list[fx.Node]:
    """``gm``'s call_function nodes whose target ``is_target`` accepts, as a list (the caller rewrites the graph)."""
    return [n for n in gm.graph.nodes if n.op == "call_function" and is_target(n.target)]


def _copy_ops() -> tuple[Any, Any]:
    import executorch.exir.passes._device_copy_ops_registry  # noqa: F401  (registers torch.ops.et_copy)

    return torch.ops.et_copy._h2d_copy.default, torch.ops.et_copy._d2h_copy.default


def _is_copy_(target: Any) -> bool:
    schema = getattr(target, "_schema", None)
    return schema is not None and schema.name == "aten::copy_"


def _device(node: fx.Node) -> tuple[Any, int] | None:
    spec = node.meta.get("spec")
    device = getattr(spec, "device", None)
    return None if device is None or device.name == "CPU" else (device, int(getattr(spec, "device_index", 0)))


def _delegate_device(node: Any) -> tuple[Any, int] | None:
    """The device of a delegate output (``getitem`` of ``executorch_call_delegate``), else None."""
    from executorch.exir.delegate import executorch_call_delegate

    if not (isinstance(node, fx.Node) and node.op == "call_function" and node.target is operator.getitem):
        return None
    producer = node.args[0]
    if not (isinstance(producer, fx.Node) and producer.target is executorch_call_delegate):
        return None
    return _device(node)


def _set_device(node: fx.Node, device: tuple[Any, int]) -> None:
    spec = node.meta["spec"]
    spec.device, spec.device_index = device
