"""Stage 1 of ``to_pte``: partitions built into engines, spilled to disk, wired into the graph.

``engine_graph`` (the stage itself, and the planner that partitions and builds), ``builders`` (the
reference and TensorRT builders behind ``builder=``), ``dims`` (dimension ranges and hints of
symbolic shapes), ``profiles`` (several optimization profiles), ``to_onnx`` (a partition's
graph as an ONNX file) and ``progress`` (bars and log lines for long steps).

May import: pyrt.export._graph, pyrt.export._files, pyrt.export's public modules; torch.
"""
