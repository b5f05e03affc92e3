"""The export's graph passes in the one order they run, from an ExportedProgram to the graph the planner partitions.

Decompose (to the ops torch.onnx translates), unlift (states become attributes), strip the
assertions, drop dead code, recompute every size from the inputs' shapes, match
``torch_executed_ops`` (through the decompositions, so the program from before them is kept
to name what matched nothing), rewrite ``masked_select`` as a boolean index (one torch.onnx
translates; a forced one stays as it is), recompile. Each pass is in
:mod:`pyrt.export._graph.passes` (``rewrite_masked_select`` in :mod:`.datadep`, ``unlift`` in
:mod:`.fx`); this module alone says their order.

>>> import torch
>>> from pyrt.export._engines.progress import Progress
>>> program = torch.export.export(torch.nn.ReLU(), (torch.randn(2),))   # doctest: +SKIP
>>> _, gm, forced = prepare_graph(program, frozenset(), Progress(False))  # doctest: +SKIP
>>> forced                                                              # doctest: +SKIP
{}
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch
import torch.fx as fx

from pyrt.export._graph.datadep import rewrite_masked_select
from pyrt.export._graph.fx import unlift
from pyrt.export._graph.passes import (
    canonicalize_sizes,
    check_forced_matched,
    decompose,
    forced_nodes,
    strip_assertions,
)

if TYPE_CHECKING:
    from pyrt.export._engines.progress import Progress

log = logging.getLogger("pyrt.export")


def prepare_graph(program: torch.export.ExportedProgram, forced_fallback: frozenset[str], progress: Progress
                  ) -> tuple[torch.export.ExportedProgram, fx.GraphModule, dict[fx.Node, str]]:
    """(the decomposed program, its unlifted graph ready to partition, the nodes ``torch_executed_ops`` keeps
    out of engines -> the name that matched them)."""
    before = program.graph
    with progress.task("decomposing", stage="export"):
        program = decompose(program)
    gm = unlift(program)
    strip_assertions(gm)
    gm.graph.eliminate_dead_code()
    canonicalize_sizes(gm)
    forced = forced_nodes(gm, forced_fallback)
    for name in check_forced_matched(forced_fallback, set(forced.values()), before):
        log.warning("torch_executed_ops names %r, which matches no operator of this model", name)
    rewrite_masked_select(gm, keep=forced)
    gm.recompile()
    return program, gm, forced
