"""The package's layers: imports go down, never up, and never round in a circle.

The layer order is written once, in :mod:`pyrt._layers` (``LAYERS``, bottom first), which
``scripts/module_map.py`` reads too; ``docs/architecture.md`` explains it. Each pyrt module
belongs to the first layer whose prefix names it. The rules,
checked on the imports the source spells (module level, ``TYPE_CHECKING`` blocks
and function bodies alike, read with :mod:`ast`, nothing imported):

1. a module imports only from its own layer or a lower one;
2. no circle: neither between modules nor between packages (a top-level module such as
   ``pyrt.pte_reader`` counts as part of its layer's package);
3. no function-local import of a pyrt module, except lazy imports of an optional extra,
   whose line says which (``# extra: NAME``, NAME one of pyproject's optional
   dependencies), and the ``EXEMPT`` list below, each with its reason;
4. no pyrt module loaded by a string from another package (``importlib.import_module`` or
   ``__import__`` of a literal, or of a name bound to one, such as a module-level tuple):
   rules 1-3 cannot see such an import;
5. no private name (``_name``, dunders aside) imported from another module, and no private
   module (a ``_name`` in its dotted path) imported from outside the package that holds it:
   a helper two modules share gets a public name, or lives in a private package (whose
   modules' public names its parent package may import). ``pyrt._version`` is such a
   private module of ``pyrt`` itself, so every pyrt module may import ``__version__`` from it;
6. no arrow back up: a module inside a package never imports a top-level module (such as
   ``pyrt.cuda``) that imports that package, directly or through other modules;
7. test help (``TEST_HELP``: ``pyrt.testing``'s tiny architectures and tokenizers) is no part of
   the product: no module outside it imports it, whatever its layer. The simulated GPU that the
   product offers (``builder="reference"``, ``PYRT_SIMULATED_GPUS``) lives in ``pyrt.sim``;
8. no import-time circle through the package root: while ``pyrt/__init__.py`` runs, no other
   module imports from ``pyrt`` itself (``from pyrt import cuda`` reaches the root, half made, to
   find a submodule; ``import pyrt.cuda`` does not). The source cannot show it (``from pyrt import
   cuda`` reads as an import of ``pyrt.cuda``), so a fresh process imports pyrt and records it.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import tomllib

from pyrt._layers import HOME, LAYERS, TEST_HELP

ROOT = Path(__file__).resolve().parents[1]

# (importing module, imported module): why a function-local import is right there.
EXEMPT = {
    ("pyrt", "pyrt.runtime.program"): "the package root resolves Program on first use, so that `import pyrt` "
                                      "and pyrt.inspect stay cheap (no runtime, no CUDA seam)",
    ("pyrt", "pyrt.llm.loop"): "pyrt.generate resolves on first use, as Program does",
    ("pyrt", "pyrt.tools.report"): "pyrt.inspect resolves on first use, as Program does: importing the report at "
                                   "import time made a circle through the root (rule 8)",
    # pyrt generate's start-up is mostly imports (benchmarks/bench_generate_startup.py): the command line imports
    # a subcommand's module, and builds its options, only for that command (tests/test_cold_imports.py)
    ("pyrt.tools.cli", "pyrt.tools.commands"): "inspect, run, bench, profile: the bench's and report's modules",
    ("pyrt.tools.cli", "pyrt.tools.generate_command"): "generate's module, for generate only",
    ("pyrt.tools.cli", "pyrt.tools.export_command"): "the exporter's options, for export only",
    ("pyrt.tools.cli", "pyrt.serve.command"): "the server's modules, for serve only",
    ("pyrt.tools.cli", "pyrt.sim"): "the simulated GPU, only when PYRT_SIMULATED_GPUS asks for it",
    ("pyrt.tools.cli_args", "pyrt.tools.export_command"): "export's options, built only to parse an export",
    ("pyrt.tools.cli_args", "pyrt.serve.command"): "serve's flags table, built only to parse a serve",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted((ROOT / "pyrt").rglob("*.py"))}


def layer_of(module: str) -> int:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes if p != "pyrt") or module in prefixes:
            return rank
    raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS in pyrt/_layers.py")


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


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(module: str, node: ast.ImportFrom) -> str:
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
    return base


def _outside(target: str, importer: str) -> bool:
    """Whether ``importer`` is outside the package that holds a private part of ``target``'s dotted path."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        parent = ".".join(parts[:i])
        if is_private(part) and importer != parent and not importer.startswith(parent + "."):
            return True
    return False


def private_imports(module: str) -> Iterator[tuple[str, int]]:
    """(what, line) for each private name or private module ``module`` imports against rule 5."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pyrt") and _outside(alias.name, module):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            if base != "pyrt" and not base.startswith("pyrt."):
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:  # a submodule, imported by name
                    if _outside(full, module):
                        yield full, node.lineno
                elif is_private(alias.name) or _outside(base, module):
                    yield full, node.lineno


def _bindings(tree: ast.AST) -> dict[str, list[ast.expr]]:
    """name -> the expressions bound to it anywhere in ``tree`` (assignments, for-loops, comprehensions)."""
    out: dict[str, list[ast.expr]] = {}

    def bind(target: ast.expr, value: ast.expr) -> None:
        for leaf in ast.walk(target):
            if isinstance(leaf, ast.Name):
                out.setdefault(leaf.id, []).append(value)

    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                bind(target, node.value)
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and node.value is not None:
            bind(node.target, node.value)
        elif isinstance(node, ast.For | ast.AsyncFor | ast.comprehension):
            bind(node.target, node.iter)
    return out


def _strings(expr: ast.expr, bindings: dict[str, list[ast.expr]], seen: set[str]) -> set[str]:
    """The string constants ``expr`` is made of, following the names it uses to what is bound to them."""
    found: set[str] = set()
    for node in ast.walk(expr):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
        elif isinstance(node, ast.Name) and node.id not in seen:
            seen.add(node.id)
            for value in bindings.get(node.id, ()):
                found |= _strings(value, bindings, seen)
    return found


def string_imports(module: str) -> Iterator[tuple[str, int]]:
    """(pyrt module named, line) for each import by string of a module of another package (rule 4)."""
    tree = ast.parse(MODULES[module].read_text(encoding="utf-8"))
    bindings = _bindings(tree)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and node.args):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        if name not in ("import_module", "__import__"):
            continue
        for text in sorted(_strings(node.args[0], bindings, set())):
            named = text.rstrip(".")
            if (named == "pyrt" or named.startswith("pyrt.")) and package_of(named) != package_of(module):
                yield named, node.lineno


def back_up(edges: dict[str, set[str]], roots: set[str]) -> list[tuple[str, str]]:
    """(module, root module) for each module inside a package that imports a top-level module which
    imports (directly or through other modules) that package (rule 6)."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    bad = []
    for module in sorted(edges):
        if module in roots:
            continue
        package = ".".join(module.split(".")[:2])
        for target in sorted(edges[module] & roots):
            if any(m == package or m.startswith(package + ".") for m in reach(target)):
                bad.append((module, target))
    return bad


def is_test_help(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in TEST_HELP)


def imports_of_test_help(module: str) -> Iterator[tuple[str, int]]:
    """(test-help module, line) for each import of test help by a module outside it (rule 7)."""
    if not is_test_help(module):
        yield from ((target, line) for target, line, _ in imports(module) if is_test_help(target))


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_every_name_in_the_layer_list_is_a_module() -> None:
    named = [p for _, prefixes in LAYERS for p in prefixes] + list(HOME) + list(HOME.values()) + list(TEST_HELP)
    stale = sorted(set(named) - set(MODULES))
    assert not stale, f"pyrt/_layers.py names modules that do not exist: {stale}"


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


def test_no_module_is_imported_by_a_string_from_another_package() -> None:
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} loads {named} by a string"
           for m in MODULES for named, line in string_imports(m)]
    assert not bad, ("pyrt modules loaded by a string (import them, at module level or lazily as rule 3 "
                     "allows, so the layering sees the import):\n" + "\n".join(bad))


def test_no_private_name_crosses_a_module_line() -> None:
    """Rule 5. pyrt/export's findings are the exporter's regrouping (another branch) until it lands."""
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {what}"
           for m in MODULES for what, line in private_imports(m)]
    assert not bad, ("private names imported across modules (give the helper a public name, or put it in a "
                     "private package):\n" + "\n".join(bad))


def test_nothing_in_the_product_imports_test_help() -> None:
    bad = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {target}"
           for m in MODULES for target, line in imports_of_test_help(m)]
    assert not bad, ("product modules that import test help (the simulated GPU is pyrt.sim; tiny models and "
                     "tokenizers are for tests and benchmarks only):\n" + "\n".join(bad))


def test_no_arrow_back_up_to_a_top_level_module() -> None:
    edges = {m: {t for t, _, _ in imports(m)} for m in MODULES}
    roots = {m for m, path in MODULES.items() if path.parent == ROOT / "pyrt"}
    bad = [f"{m} imports {root}, which imports {'.'.join(m.split('.')[:2])}" for m, root in back_up(edges, roots)]
    assert not bad, ("imports back up to a top-level module built on the importer's own package (move what "
                     "is needed into the package, or pass it in):\n" + "\n".join(bad))


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


def _probe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    monkeypatch.setitem(MODULES, name, tmp_path / "probe.py")
    (tmp_path / "probe.py").write_text(source)
    return name


@pytest.mark.parametrize(("source", "expected"), [
    ("import importlib\nm = importlib.import_module('pyrt.llm.command')\n", [("pyrt.llm.command", 2)]),
    ("import importlib\nPLUGINS = ('pyrt.llm.command',)\n\ndef parser():\n    for name in PLUGINS:\n"
     "        importlib.import_module(name).add_commands()\n", [("pyrt.llm.command", 6)]),
    ("NAME = 'pyrt.serve.app'\nm = __import__(NAME)\n", [("pyrt.serve.app", 2)]),
    ("from importlib import import_module\nm = import_module(f'pyrt.llm.{x}')\n", [("pyrt.llm", 2)]),
    ("import importlib\nfor name in ('tensorrt', 'tensorrt_rtx'):\n    importlib.import_module(name)\n", []),
    ("import importlib\nm = importlib.import_module('pyrt.tools.report')\n", []),  # its own package
])
def test_imports_by_string_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                     expected: list[tuple[str, int]]) -> None:
    module = _probe(tmp_path, monkeypatch, "pyrt.tools._probe_", source)
    assert list(string_imports(module)) == expected


@pytest.mark.parametrize(("source", "expected"), [
    ("from pyrt.tools.cli_args import _budget, parser\n", [("pyrt.tools.cli_args._budget", 1)]),
    ("from .report import _size\n", [("pyrt.tools.report._size", 1)]),
    ("from pyrt.export import _lower\n", [("pyrt.export._lower", 1)]),
    ("import pyrt.export._lower\n", [("pyrt.export._lower", 1)]),
    ("from pyrt.export._lower import lower\n", [("pyrt.export._lower.lower", 1)]),
    ("from pyrt._version import __version__\nfrom pyrt.tools.report import inspect\n", []),
])
def test_private_imports_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str,
                                   expected: list[tuple[str, int]]) -> None:
    module = _probe(tmp_path, monkeypatch, "pyrt.tools._probe_", source)
    assert list(private_imports(module)) == expected


def test_a_private_package_is_open_to_its_parent_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inside = _probe(tmp_path, monkeypatch, "pyrt.export.api_probe", "from pyrt.export._lower import lower\n")
    assert list(private_imports(inside)) == []
    peer = _probe(tmp_path, monkeypatch, "pyrt.export._a.b", "from pyrt.export._a.c import helper, _hidden\n")
    assert list(private_imports(peer)) == [("pyrt.export._a.c._hidden", 1)]


def test_arrows_back_up_are_found() -> None:
    edges = {"pyrt.device.seam": {"pyrt.cuda"}, "pyrt.cuda": {"pyrt.device.driver"}, "pyrt.device.driver": set(),
             "pyrt.memory.x": {"pyrt.cuda"}, "pyrt.format.io": {"pyrt.reader"}, "pyrt.reader": {"pyrt.helper"},
             "pyrt.helper": {"pyrt.format.bounds"}}
    roots = {"pyrt.cuda", "pyrt.reader", "pyrt.helper"}
    assert back_up(edges, roots) == [("pyrt.device.seam", "pyrt.cuda"), ("pyrt.format.io", "pyrt.reader")]


@pytest.mark.parametrize(("name", "source", "expected"), [
    ("pyrt.tools._probe_", "from pyrt.testing import archs\n", [("pyrt.testing.archs", 1)]),
    ("pyrt.tools._probe_", "def f():\n    import pyrt.testing\n", [("pyrt.testing", 2)]),
    ("pyrt.export._probe_", "from pyrt.testing.archs import build\n", [("pyrt.testing.archs", 1)]),
    ("pyrt.tools._probe_", "from pyrt.sim import simulated_gpus\n", []),  # the product's simulated GPU
    ("pyrt.testing._probe_", "from pyrt.testing.archs import build\n", []),  # test help among itself
])
def test_imports_of_test_help_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str,
                                        expected: list[tuple[str, int]]) -> None:
    module = _probe(tmp_path, monkeypatch, name, source)
    assert list(imports_of_test_help(module)) == expected


# Run in a fresh process: every import that names the package ``PACKAGE`` itself (``from PACKAGE import x``,
# ``import PACKAGE``, relative imports resolving to it) made by one of its modules while ``import PACKAGE`` runs.
_ROOT_WATCH = textwrap.dedent("""
    import builtins, json, sys
    package, seen, real = sys.argv[1], [], builtins.__import__
    loading = True

    def watch(name, globals=None, locals=None, fromlist=(), level=0):
        importer, target = (globals or {}).get("__name__", ""), name
        if level:  # relative: from the importer's package, level - 1 packages up
            base = (globals or {}).get("__package__") or ""
            base = base.rsplit(".", level - 1)[0] if level > 1 else base
            target = f"{base}.{name}" if name else base
        if loading and target == package and importer.startswith(package + "."):
            seen.append([importer, sorted(fromlist or ())])
        return real(name, globals, locals, fromlist, level)

    builtins.__import__ = watch
    __import__(package)
    loading = False
    print(json.dumps(seen))
""")


def imports_of_the_root_while_it_loads(package: str, where: Path, env: dict[str, str] | None = None) -> list[list]:
    """[importer, [names]] for each import of ``package`` itself by one of its modules while it is imported."""
    base = {k: v for k, v in os.environ.items() if k != "PYRT_SIMULATED_GPUS"}
    done = subprocess.run([sys.executable, "-c", _ROOT_WATCH, package], capture_output=True, text=True, timeout=120,
                          cwd=where, env={**base, "PYTHONPATH": str(where), **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("env", [{}, {"PYRT_SIMULATED_GPUS": "1"}], ids=["plain", "simulated"])
def test_import_pyrt_makes_no_circle_through_the_root(env: dict[str, str]) -> None:
    """Rule 8, with and without ``PYRT_SIMULATED_GPUS`` (the root then installs :mod:`pyrt.sim` as it loads)."""
    found = imports_of_the_root_while_it_loads("pyrt", ROOT, env)
    assert found == [], ("modules that import from the package root while pyrt/__init__.py runs (import the "
                         "submodule itself: `import pyrt.cuda as cuda_seam`, or make the root's import lazy): "
                         + ", ".join(f"{m} ({'from pyrt import ' + ', '.join(names) if names else 'import pyrt'})"
                                    for m, names in found))


def test_a_circle_through_the_root_is_found(tmp_path: Path) -> None:
    (tmp_path / "ring" / "inner").mkdir(parents=True)
    (tmp_path / "ring" / "__init__.py").write_text("from ring.inner.user import used\nfrom ring import plain\n")
    (tmp_path / "ring" / "plain.py").write_text("import ring.helper as helper\n")  # a submodule: no circle
    (tmp_path / "ring" / "helper.py").write_text("VALUE = 1\n")
    (tmp_path / "ring" / "inner" / "__init__.py").write_text("")
    (tmp_path / "ring" / "inner" / "user.py").write_text("from ring import helper\nfrom .. import plain\n"
                                                        "used = helper.VALUE\n")
    assert imports_of_the_root_while_it_loads("ring", tmp_path) == [["ring.inner.user", ["helper"]],
                                                                   ["ring.inner.user", ["plain"]]]
