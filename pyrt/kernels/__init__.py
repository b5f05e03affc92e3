"""Operator kernels: the non-delegated instructions of a method.

Modules: :mod:`~pyrt.kernels.base` (what a kernel is), :mod:`~pyrt.kernels.registry`
(the allowlist and library lookup), the libraries :mod:`~pyrt.kernels.prim_kernels`
(ExecuTorch's prim ops, ``et_view``, dim-order ops, device copies),
:mod:`~pyrt.kernels.torch_kernels` (ATen through ``torch.ops``; the ``torch`` extra),
:mod:`~pyrt.kernels.numpy_library` (the portable set in numpy, without torch: machinery in
:mod:`~pyrt.kernels.numpy_base`, kernels in ``numpy_elementwise``, ``numpy_shape``,
``numpy_index``, ``numpy_reduce`` and ``numpy_nn``), and
:mod:`~pyrt.kernels.small_numpy_fastpath` (numpy ufuncs on views for small static tensors; their
argument views and checks in :mod:`~pyrt.kernels.small_numpy_fastpath_args`).

May import: :mod:`pyrt.errors`, :mod:`pyrt.format`, the device layer, :mod:`pyrt.memory`;
torch only lazily, inside the torch library.
"""
