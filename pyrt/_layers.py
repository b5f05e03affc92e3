"""pyrt's layers, bottom first: the one list tests/test_layers.py checks and scripts/module_map.py draws.

Plain data: it imports nothing and nothing in pyrt imports it. A layer is (name, module
prefixes); a module belongs to the first layer with a prefix equal to its name or to a package
above it (the prefix ``pyrt`` names the package root alone). Imports go down, never up;
docs/architecture.md says why the layers stand in this order.

>>> [name for name, _ in LAYERS][-5:]
['sim', 'testing', 'export', 'apps', 'root']
>>> HOME["pyrt.cuda"]
'pyrt.device'
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("pyrt.errors", "pyrt.checks", "pyrt.renames", "pyrt._version", "pyrt.logs", "pyrt._layers")),
    ("format", ("pyrt.pte_reader", "pyrt.format")),
    ("device", ("pyrt.cuda", "pyrt.engine", "pyrt.streaming", "pyrt.device")),
    ("memory", ("pyrt.memory",)),
    ("kernels", ("pyrt.kernels",)),
    ("runtime", ("pyrt.runtime",)),
    ("sim", ("pyrt.sim",)),  # the simulated GPU and reference engines: product code (export builds reference engines)
    ("testing", ("pyrt.testing",)),  # test help: tiny architectures and tokenizers; see TEST_HELP
    ("export", ("pyrt.export",)),
    ("apps", ("pyrt.tools", "pyrt.serve", "pyrt.llm")),
    ("root", ("pyrt", "pyrt.__main__")),
)

# The package a top-level module counts as part of, for the rule against circles between packages.
HOME: dict[str, str] = {
    "pyrt.pte_reader": "pyrt.format",
    "pyrt.cuda": "pyrt.device",
    "pyrt.engine": "pyrt.device",
    "pyrt.streaming": "pyrt.device",
}

# Test help, not product: it may import the layers below it, and no module outside it imports it.
TEST_HELP: tuple[str, ...] = ("pyrt.testing",)
