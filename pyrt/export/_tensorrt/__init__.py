"""The steps of a TensorRT engine build, run by :mod:`pyrt.export.trt_builder`.

``flavour`` (which TensorRT, its builder session, the checked options), ``shapes``
(dynamic shapes), ``torch_onnx`` (the module checked and exported to ONNX), ``network``
(the strongly typed network and the ONNX parse), ``config`` (builder config and
optimization profiles), ``serialize`` (the engine in memory or streamed to a file).

May import: pyrt.device (the TensorRT seam), pyrt.format, pyrt.errors; torch, onnx and
TensorRT only inside the functions that need them.
"""
