"""The device seam: the CUDA driver, the TensorRT flavours, device names.

Job: the lowest layer that touches hardware. :mod:`pyrt.cuda` (the public CUDA
module) and the modules here wrap ``cuda.bindings`` and TensorRT behind two
seams that the simulated GPU (:mod:`pyrt.sim`) replaces with its fakes: the checked
driver calls, devices and contexts (:mod:`~pyrt.device.driver`), device memory
handles (:mod:`~pyrt.device.memory`), stream and event handles
(:mod:`~pyrt.device.streams`) and the TensorRT flavours (:mod:`~pyrt.device.tensorrt_seam`);
:mod:`pyrt.engine` (one TensorRT engine: deserialize, budget, context, launch)
and :mod:`pyrt.streaming` (weight-streaming budget arithmetic, pure integers; the values
as written are parsed in :mod:`~pyrt.device.budgets`)
belong to this layer too.

May import: :mod:`pyrt.errors`, :mod:`pyrt.format`, this layer's modules, the
standard library, numpy; ``cuda.bindings`` and TensorRT only lazily, at first use.
"""
