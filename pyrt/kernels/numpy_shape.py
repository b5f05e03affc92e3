"""numpy kernels, shapes and layouts: views as copies, concatenation, slicing, splitting, padding, creation.

>>> import numpy as np
>>> from pyrt.kernels.numpy_base import Operand, Out, Scalar, OPS
>>> OPS["aten::as_strided_copy.out"].fn(np.arange(6.0), [2, 2], [1, 2], 1).tolist()
[[1.0, 3.0], [2.0, 4.0]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from pyrt.errors import InputError
from pyrt.kernels.numpy_base import Out, Scalar, clip_slice, op


@op("aten::permute_copy.out", n_in=2)
def _permute(a: np.ndarray, dims: Sequence[int]) -> Out:
    return np.transpose(a, [d % max(a.ndim, 1) for d in dims])


@op("aten::view_copy.out", "aten::_unsafe_view.out", n_in=2)
def _view(a: np.ndarray, size: Sequence[int]) -> Out:
    return np.reshape(a, [int(s) for s in size])


@op("aten::expand_copy.out", n_in=3)
def _expand(a: np.ndarray, size: Sequence[int], implicit: bool = False) -> Out:
    lead = len(size) - a.ndim
    shape = [a.shape[i - lead] if s == -1 else s for i, s in enumerate(size)]
    return np.broadcast_to(a, shape)


@op("aten::cat.out", n_in=2)
def _cat(tensors: Sequence[np.ndarray], dim: int = 0) -> Out:
    parts = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips legacy empties
    if not parts:
        return tensors[0]
    return np.concatenate(parts, axis=dim % parts[0].ndim)


@op("aten::stack.out", n_in=2)
def _stack(tensors: Sequence[np.ndarray], dim: int = 0) -> Out:
    return np.stack(list(tensors), axis=dim % (tensors[0].ndim + 1))


@op("aten::slice_copy.Tensor_out", n_in=5)
def _slice(a: np.ndarray, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> Out:
    d = dim % a.ndim
    index = [slice(None)] * a.ndim
    index[d] = clip_slice(a.shape[d], start, end, int(step))
    return a[tuple(index)]


@op("aten::select_copy.int_out", n_in=3)
def _select(a: np.ndarray, dim: int, index: int) -> Out:
    d = dim % a.ndim
    if not -a.shape[d] <= index < a.shape[d]:
        raise InputError(f"select index {index} out of range for dimension {d} of size {a.shape[d]}")
    return np.take(a, index, axis=d)


@op("aten::unsqueeze_copy.out", n_in=2)
def _unsqueeze(a: np.ndarray, dim: int) -> Out:
    return np.expand_dims(a, dim % (a.ndim + 1))


@op("aten::squeeze_copy.dim_out", "aten::squeeze_copy.dims_out", n_in=2)
def _squeeze_dims(a: np.ndarray, dims: int | Sequence[int]) -> Out:
    ds = [dims] if isinstance(dims, (int, np.integer)) else list(dims)
    ds = [d % max(a.ndim, 1) for d in ds if a.ndim and a.shape[d % a.ndim] == 1]
    return np.squeeze(a, axis=tuple(ds)) if ds else a


@op("aten::squeeze_copy.out", n_in=1)
def _squeeze(a: np.ndarray) -> Out:
    return np.squeeze(a)


@op("aten::transpose_copy.int_out", n_in=3)
def _transpose(a: np.ndarray, d0: int, d1: int) -> Out:
    return np.swapaxes(a, d0, d1)


@op("aten::t_copy.out", n_in=1)
def _t(a: np.ndarray) -> Out:
    return a.T


@op("aten::clone.out", n_in=2)
def _clone(a: np.ndarray, memory_format: int | None = None) -> Out:
    return a


@op("aten::_to_copy.out", n_in=3)
def _to_copy(a: np.ndarray, non_blocking: bool = False, memory_format: int | None = None) -> Out:
    return a


@op("aten::alias_copy.out", "aten::lift_fresh_copy.out", "aten::detach_copy.out", n_in=1)
def _identity(a: np.ndarray) -> Out:
    return a


@op("aten::split_with_sizes_copy.out", n_in=3)
def _split_sizes(a: np.ndarray, sizes: Sequence[int], dim: int = 0) -> list[np.ndarray]:
    return np.split(a, np.cumsum([int(s) for s in sizes])[:-1], axis=dim % a.ndim)


@op("aten::split_copy.Tensor_out", n_in=3)
def _split(a: np.ndarray, size: int, dim: int = 0) -> list[np.ndarray]:
    d = dim % a.ndim
    return np.split(a, list(range(size, a.shape[d], size)), axis=d)


@op("aten::unbind_copy.int_out", n_in=2)
def _unbind(a: np.ndarray, dim: int = 0) -> list[np.ndarray]:
    d = dim % a.ndim
    return [np.take(a, i, axis=d) for i in range(a.shape[d])]


@op("aten::full.out", n_in=2)
def _full(size: Sequence[int], value: Scalar) -> Out:
    return np.full([int(s) for s in size], value)


@op("aten::full_like.out", n_in=3)
def _full_like(a: np.ndarray, value: Scalar, memory_format: int | None = None) -> Out:
    return np.full(a.shape, value)


@op("aten::zeros.out", n_in=1)
def _zeros(size: Sequence[int]) -> Out:
    return np.zeros([int(s) for s in size])


@op("aten::ones.out", n_in=1)
def _ones(size: Sequence[int]) -> Out:
    return np.ones([int(s) for s in size])


@op("aten::scalar_tensor.out", n_in=1)
def _scalar_tensor(s: Scalar) -> Out:
    return np.asarray(s)


@op("aten::arange.out", n_in=1)
def _arange(end: Scalar) -> Out:
    return np.arange(end)


@op("aten::arange.start_out", n_in=3)
def _arange_start(start: Scalar, end: Scalar, step: Scalar = 1) -> Out:
    return np.arange(start, end, step)


@op("aten::repeat.out", n_in=2)
def _repeat(a: np.ndarray, repeats: Sequence[int]) -> Out:
    lead = len(repeats) - a.ndim
    return np.tile(a.reshape((1,) * lead + a.shape), repeats)


@op("aten::constant_pad_nd.out", n_in=3)
def _pad(a: np.ndarray, pad: Sequence[int], value: Scalar = 0) -> Out:
    widths = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise InputError(f"constant_pad_nd: negative padding {pad} is not supported by the numpy kernels")
    return np.pad(a, widths, constant_values=value)


@op("aten::flip.out", n_in=2)
def _flip(a: np.ndarray, dims: Sequence[int]) -> Out:
    return np.flip(a, axis=tuple(dims))


@op("aten::empty.out", n_in=2)
def _empty(size: Sequence[int], memory_format: int | None = None) -> Out:
    return np.zeros([int(s) for s in size])


@op("aten::tril.out", n_in=2)
def _tril(a: np.ndarray, diagonal: int = 0) -> Out:
    return np.tril(a, int(diagonal))


@op("aten::as_strided_copy.out", n_in=4)
def _as_strided(a: np.ndarray, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> Out:
    """Elements of ``a``'s contiguous storage at ``offset + sum(i_k * stride_k)``; every index bounds-checked."""
    size, stride = [int(s) for s in size], [int(s) for s in stride]
    offset = int(storage_offset or 0)
    if len(size) != len(stride) or any(s < 0 for s in (*size, *stride)) or offset < 0:
        raise InputError(f"as_strided_copy: size {size}, stride {stride}, offset {offset} are not valid")
    flat = np.ascontiguousarray(a).reshape(-1)
    if math.prod(size) == 0:
        return np.zeros(size, dtype=a.dtype)
    last = offset + sum((n - 1) * st for n, st in zip(size, stride, strict=True))
    if last >= flat.size:
        raise InputError(f"as_strided_copy: size {size}, stride {stride}, offset {offset} reach element {last} "
                         f"of a {flat.size}-element tensor")
    return np.lib.stride_tricks.as_strided(flat[offset:], size, [s * flat.itemsize for s in stride],
                                           writeable=False).copy()


@op("aten::narrow_copy.out", n_in=4)
def _narrow(a: np.ndarray, dim: int, start: int, length: int) -> Out:
    d = dim % a.ndim
    start = start + a.shape[d] if start < 0 else start
    if not (0 <= start and 0 <= length and start + length <= a.shape[d]):
        raise InputError(f"narrow_copy: start {start} length {length} overrun dimension {d} of size {a.shape[d]}")
    return np.take(a, np.arange(start, start + length), axis=d)


@op("aten::diagonal_copy.out", n_in=4)
def _diagonal(a: np.ndarray, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Out:
    return np.diagonal(a, int(offset), dim1 % a.ndim, dim2 % a.ndim)


@op("aten::roll.out", n_in=3)
def _roll(a: np.ndarray, shifts: Sequence[int], dims: Sequence[int] = ()) -> Out:
    if not len(dims):
        return np.roll(a.reshape(-1), int(shifts[0])).reshape(a.shape)
    return np.roll(a, [int(s) for s in shifts], axis=[int(d) % a.ndim for d in dims])


@op("aten::pixel_shuffle.out", n_in=2)
def _pixel_shuffle(a: np.ndarray, r: int) -> Out:
    *lead, c, h, w = a.shape
    x = a.reshape(*lead, c // (r * r), r, r, h, w)
    n = len(lead)
    x = x.transpose(*range(n), n, n + 3, n + 1, n + 4, n + 2)
    return x.reshape(*lead, c // (r * r), h * r, w * r)


@op("aten::pixel_unshuffle.out", n_in=2)
def _pixel_unshuffle(a: np.ndarray, r: int) -> Out:
    *lead, c, h, w = a.shape
    n = len(lead)
    x = a.reshape(*lead, c, h // r, r, w // r, r)
    x = x.transpose(*range(n), n, n + 2, n + 4, n + 1, n + 3)
    return x.reshape(*lead, c * r * r, h // r, w // r)


def _pad_widths(a: np.ndarray, pad: Sequence[int], what: str) -> list[tuple[int, int]]:
    widths = [(0, 0)] * a.ndim
    for i in range(len(pad) // 2):
        widths[a.ndim - 1 - i] = (int(pad[2 * i]), int(pad[2 * i + 1]))
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        raise InputError(f"{what}: negative padding {list(pad)} is not supported by the numpy kernels")
    return widths


for _dims in (1, 2, 3):
    op(f"aten::reflection_pad{_dims}d.out", n_in=2)(
        lambda a, pad: np.pad(a, _pad_widths(a, pad, "reflection_pad"), mode="reflect"))
    op(f"aten::replication_pad{_dims}d.out", n_in=2)(
        lambda a, pad: np.pad(a, _pad_widths(a, pad, "replication_pad"), mode="edge"))


@op("aten::unfold_copy.out", n_in=4)
def _unfold(a: np.ndarray, dim: int, size: int, step: int) -> Out:
    d = dim % max(a.ndim, 1)
    if size > a.shape[d] or step <= 0:
        raise InputError(f"unfold_copy: size {size} step {step} do not fit dimension {d} of size {a.shape[d]}")
    win = np.lib.stride_tricks.sliding_window_view(a, size, axis=d)
    return np.take(win, np.arange(0, a.shape[d] - size + 1, step), axis=d)


@op("aten::repeat_interleave.Tensor_out", n_in=2)
def _repeat_interleave(repeats: np.ndarray, output_size: int | None = None) -> Out:
    return np.repeat(np.arange(repeats.shape[0]), repeats)
