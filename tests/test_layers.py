"""The package's layers: imports go down, never up, and never round in a circle.

The layer order is written once, here (``LAYERS``, bottom first); ``docs/architecture.md``
explains it. Each pyrt module belongs to the first layer whose prefix names it. Three
rules, checked on the imports the source spells (module level, ``TYPE_CHECKING`` blocks
and function bodies alike, read with :mod:`ast`, nothing imported):

1. a module imports only from its own layer or a lower one;
2. no circle: neither between modules nor between packages (a top-level module such as
   ``pyrt.pte_reader`` counts as part of its layer's package);
3. no function-local import of a pyrt module, except lazy imports of an optional extra,
   whose line says which (``# extra: NAME``, NAME one of pyproject's optional
   dependencies), and the ``EXEMPT`` list below, each with its reason.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]

# Bottom first. A module belongs to the first layer with a prefix equal to its name or a package above it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("base", ("pyrt.errors", "pyrt._version", "pyrt.logs")),
    ("format", ("pyrt.format", "pyrt.pte_reader")),
    ("device", ("pyrt.device", "pyrt.cuda", "pyrt.engine", "pyrt.streaming")),
    ("memory", ("pyrt.memory",)),
    ("kernels", ("pyrt.kernels",)),
    ("runtime", ("pyrt.runtime",)),
    ("testing", ("pyrt.testing",)),
    ("export", ("pyrt.export",)),
    ("apps", ("pyrt.tools", "pyrt.serve", "pyrt.llm")),
    ("root", ("pyrt", "pyrt.__main__")),
]
# The package a top-level module counts as part of, for the package-circle rule.
HOME = {"pyrt.pte_reader": "pyrt.format", "pyrt.cuda": "pyrt.device", "pyrt.engine": "pyrt.device",
        "pyrt.streaming": "pyrt.device"}
# (importing module, imported module): why a function-local import is right there.
EXEMPT = {
    ("pyrt", "pyrt.runtime.program"): "the package root resolves Program on first use, so that `import pyrt` "
                                      "and pyrt.inspect stay cheap (no runtime, no CUDA seam)",
    ("pyrt", "pyrt.llm.loop"): "pyrt.generate resolves on first use, as Program does",
    ("pyrt.serve.generate", "pyrt.llm.serving"): "the generate routes load LLM generation only in a replica that "
                                                 "serves, and answer 404 where it does not import",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((ROOT / "pyrt").rglob("*.py"))}


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "pyrt") or module in prefixes:
            return rank
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS in tests/test_layers.py")


def package_of(module: str) -> str:
    top = ".".join(module.split(".")[:2])
    return HOME.get(top, top)


def imports(module: str) -> Iterator[tuple[str, int, bool]]:
    """(imported pyrt module, line, inside a function) for every import statement of ``module``."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def visit(node: ast.AST, local: bool) -> Iterator[tuple[str, int, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield from named(alias.name, child.lineno, local)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + [base]).strip(".")
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    yield from named(full if full in MODULES else base, child.lineno, local)
            else:
                yield from visit(child, inner)

    def named(name: str, line: int, local: bool) -> Iterator[tuple[str, int, bool]]:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name.startswith("pyrt") and name != module:
            yield name, line, local

    yield from visit(tree, False)


def extras() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return set(meta["project"]["optional-dependencies"])


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``edges`` (as a path that ends where it starts), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := walk(node)):
            return found
    return None


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_imports_never_go_up_a_layer() -> None:
    bad = []
    for module in MODULES:
        for target, line, _ in imports(module):
            if layer_of(target) > layer_of(module):
                bad.append(f"{MODULES[module].relative_to(ROOT)}:{line}: {module} ({LAYERS[layer_of(module)][0]}) "
                           f"imports {target} ({LAYERS[layer_of(target)][0]})")
    assert not bad, "imports that go up a layer:\n" + "\n".join(bad)


def test_no_circle_between_modules() -> None:
    edges = {m: {t for t, _, _ in imports(m)} for m in MODULES}
    assert find_circle(edges) is None, f"import circle: {' -> '.join(find_circle(edges) or [])}"


def test_no_circle_between_packages() -> None:
    edges: dict[str, set[str]] = {}
    for module in MODULES:
        for target, _, _ in imports(module):
            if package_of(target) != package_of(module):
                edges.setdefault(package_of(module), set()).add(package_of(target))
    assert find_circle(edges) is None, f"package circle: {' -> '.join(find_circle(edges) or [])}"


def test_function_local_imports_are_lazy_extras() -> None:
    known = extras()
    bad = []
    for module, path in MODULES.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for target, line, local in imports(module):
            if not local or (module, target) in EXEMPT:
                continue
            comment = lines[line - 1].partition("#")[2]
            extra = comment.split("extra:", 1)[1].split()[0].strip(",;()") if "extra:" in comment else None
            if extra not in known:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {module} imports {target} inside a function"
                           + (f" (extra {extra!r} is not in pyproject)" if extra else ""))
    assert not bad, ("function-local imports of pyrt modules (import at module level, or mark a lazy import of "
                     "an optional extra with '# extra: NAME'):\n" + "\n".join(bad))


@pytest.mark.parametrize(("source", "expected"), [
    ("import pyrt.errors\n", [("pyrt.errors", 1, False)]),
    ("def f():\n    from pyrt.format import bounds\n", [("pyrt.format.bounds", 2, True)]),
    ("from . import bounds\n", [("pyrt.format.bounds", 1, False)]),
    ("if True:\n    from pyrt.format.bounds import Span\n", [("pyrt.format.bounds", 2, False)]),
])
def test_imports_are_read_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                     expected: list[tuple[str, int, bool]]) -> None:
    monkeypatch.setitem(MODULES, "pyrt.format._probe_", tmp_path / "probe.py")
    (tmp_path / "probe.py").write_text(source)
    assert list(imports("pyrt.format._probe_")) == expected


def test_circles_are_found() -> None:
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": {"c"}}) is None
