"""What a method computes on: host and device tensors and the method's value table.

Job: the tensor types every kernel, delegate and executor step exchanges:
dtype maps and strides (:mod:`~pyrt.memory.layout`), device tensors and the
``Value`` types (:mod:`~pyrt.memory.tensors`), caller interop with DLPack and
``__cuda_array_interface__`` (:mod:`~pyrt.memory.interop`), the numpy and torch
host backends (:mod:`~pyrt.memory.host`), and
:class:`~pyrt.memory.table.ValueTable`, one method's values at run time with
what the plan knows about each slot.

May import: :mod:`pyrt.errors`, :mod:`pyrt.format`, the device layer, numpy;
torch only lazily, when a caller hands in torch tensors or asks for them.
"""
