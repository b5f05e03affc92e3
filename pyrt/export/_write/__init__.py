"""Stage 2 of ``to_pte``: the engine graph re-exported, lowered and written as a .pte (and .ptd).

``lower`` (the stage itself), ``direct`` (a fully delegated program written without
ExecuTorch's lowering), ``flatbuffer`` (FlatBuffers tables in ExecuTorch's order),
``executorch_serializer`` (ExecuTorch's serializer with engine blobs streamed from disk),
``external_weights`` (the .ptd) and ``state`` (mutable buffers kept on the device).

May import: pyrt.export._graph, pyrt.export._files, pyrt.export's public modules (the backend);
torch, executorch (the full lowering only inside the functions that run it).
"""
