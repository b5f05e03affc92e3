"""The files an export writes, whichever stage writes them.

``engine_store`` (each engine spilled to its own file as soon as it exists), ``atomic``
(temporary file, fsync, rename), ``sparse_file`` (runs of zeros left as holes) and
``tempfiles`` (temporary names that say their owner, swept once it is gone).

May import: pyrt.errors, pyrt.export._graph.spec (a spilled engine's spec); torch (the engine
store maps each engine file as a tensor).
"""
