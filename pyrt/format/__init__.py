"""The file formats: bytes on disk, read and checked, never executed.

Job: everything a ``.pte`` or ``.ptd`` file means as data, with every offset
bounds-checked: the one bounds check (:mod:`~pyrt.format.bounds`), the
FlatBuffers table reader, read-only mappings, the typed records of
``program.fbs`` and their bulk decoders, scalar types, the TensorRT delegate
blob (TR01/TR02), FlatTensor ``.ptd`` data, I/O container specs, and the
memory a file may declare before anything is allocated (:mod:`~pyrt.format.limits`).
The ``.pte`` reader itself is :mod:`pyrt.pte_reader` (its path is fixed by the
design card); it belongs to this layer and delegates the file's framing
(:mod:`~pyrt.format.pte_header`), the per-table decoders (:mod:`~pyrt.format.decode`)
and the delegate records (:mod:`~pyrt.format.delegates`) to this package.

May import: :mod:`pyrt.errors`, this package, the standard library and numpy.
Nothing here knows about devices, kernels or running a program.
"""
