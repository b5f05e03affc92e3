"""The builder config of an engine build: weight streaming, workspace, compute capabilities
(TensorRT-RTX) and the optimization profile of the dynamic shapes.
"""

from __future__ import annotations

from typing import Any

import pyrt.cuda as cuda_seam
from pyrt.device import tensorrt_seam
from pyrt.errors import ExportError
from pyrt.export._tensorrt.flavour import BuildOptions, Session, logged_errors
from pyrt.export._tensorrt.shapes import ShapeRange


def configure(session: Session, network: Any, ranges: list[dict[int | str, ShapeRange]],
               options: BuildOptions) -> Any:
    trt = session.trt
    config = session.builder.create_builder_config()
    if config is None:
        raise ExportError(f"{session.name} create_builder_config returned None{logged_errors(session.logger)}")
    if options.weight_streaming:
        config.set_flag(trt.BuilderFlag.WEIGHT_STREAMING)
        if not config.get_flag(trt.BuilderFlag.WEIGHT_STREAMING):
            raise ExportError(f"{session.name} did not keep BuilderFlag.WEIGHT_STREAMING")
    if options.workspace is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace)
        if config.get_memory_pool_limit(trt.MemoryPoolType.WORKSPACE) != options.workspace:
            raise ExportError(f"{session.name} did not keep workspace={options.workspace}")
    if options.compute_capabilities is not None:
        _set_compute_capabilities(session, config, options.compute_capabilities)
    for profile in ranges:  # one optimization profile each, in order (profile 0 first)
        _add_profile(session, network, config, profile)
    return config


def _set_compute_capabilities(session: Session, config: Any, names: tuple[str, ...]) -> None:
    members = session.trt.ComputeCapability.__members__
    unknown = [n for n in names if n not in members]
    if unknown:
        raise ExportError(f"{session.name} has no compute capability {', '.join(unknown)} "
                          f"(it offers {', '.join(m for m in members if m != 'NONE')})")
    if "CURRENT" in names:
        _check_current_device(session)
    caps = [members[n] for n in names]
    config.num_compute_capabilities = len(caps)
    if config.num_compute_capabilities != len(caps):
        raise ExportError(f"{session.name} did not keep num_compute_capabilities={len(caps)}")
    for i, cap in enumerate(caps):
        if not config.set_compute_capability(cap, i) or config.get_compute_capability(i) != cap:
            raise ExportError(f"{session.name} refused compute capability {cap.name} at index {i}"
                              f"{logged_errors(session.logger)}")


def _check_current_device(session: Session) -> None:
    """``CURRENT`` on a GPU the flavour cannot run on builds an engine that runs nowhere: refuse it."""
    seam = cuda_seam.current()
    if seam.device_count() == 0:
        return  # TensorRT itself reports that 'current' needs a visible GPU
    info = seam.devices()[0]
    refusal = tensorrt_seam.unsupported_device(session.trt, info.compute_capability)
    if refusal is not None:
        raise ExportError(f"compute capability 'current' is device {info}, and {refusal}: the engine would run "
                          f"nowhere; build with full TensorRT, or name a supported compute capability")


def _add_profile(session: Session, network: Any, config: Any, ranges: dict[int | str, ShapeRange]) -> None:
    tensors = [network.get_input(i) for i in range(network.num_inputs)]
    by_name = {t.name: i for i, t in enumerate(tensors)}
    for key in ranges:
        if (by_name.get(key) if isinstance(key, str) else key if 0 <= key < len(tensors) else None) is None:
            raise ExportError(f"dynamic_shapes names input {key!r}, but the network's inputs are "
                              f"{list(by_name)}")
    profile = session.builder.create_optimization_profile()
    used = False
    for i, tensor in enumerate(tensors):
        rng = ranges.get(i, ranges.get(tensor.name))
        shape = tuple(int(d) for d in tensor.shape)
        if rng is None:
            if -1 in shape:
                raise ExportError(f"input {i} ({tensor.name!r}) has dynamic shape {shape} but dynamic_shapes "
                                  "gives it no min/opt/max")
            continue
        _check_range_fits(i, tensor.name, shape, rng)
        try:  # the binding raises RuntimeError for a shape setDimensions refuses, TypeError for a non-Dims
            profile.set_shape(tensor.name, *rng)
        except (RuntimeError, TypeError) as exc:
            raise ExportError(f"dynamic_shapes for input {tensor.name!r}: {session.name} refused {rng}: {exc}") from exc
        used = True
    if used and config.add_optimization_profile(profile) < 0:
        raise ExportError(f"{session.name} refused the optimization profile {ranges}{logged_errors(session.logger)}")


def _check_range_fits(i: int, name: str, shape: tuple[int, ...], rng: ShapeRange) -> None:
    lo, _, hi = rng
    if len(lo) != len(shape):
        raise ExportError(f"dynamic_shapes for input {i} ({name!r}) has rank {len(lo)}, the network input "
                          f"has shape {shape}")
    for d, size in enumerate(shape):
        if size != -1 and not lo[d] == hi[d] == size:
            raise ExportError(f"dynamic_shapes asks dim {d} of input {i} ({name!r}) to range {lo[d]}..{hi[d]}, "
                              f"but the network fixed it to {size} (the ONNX model has a static dim there: "
                              "torch.export specialised it, so check the model's code)")
