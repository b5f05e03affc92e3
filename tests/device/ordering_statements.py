"""Discovery, by AST, of the statements in pyrt that order device work (for tests/device/test_ordering_mutants.py).

A statement is an *ordering statement* when it (or, for an ``if``/``while``, its condition):

* records or waits for an event (``record``, ``wait``, ``cuEventRecord``, ``cuStreamWaitEvent``),
  or orders one stream after another (``wait_for``, ``order``, ``_order_streams``);
* synchronises a stream, an event or a device (``synchronize``, ``cu*Synchronize``);
* keeps host memory alive for a queued copy (``_keep.append``, ``keepalive``);
* records a stream for a foreign tensor (``record_stream``);
* chooses the stream a buffer is freed on (``free_async``, ``alloc_async``, ``free_on``).

Every package module is scanned but the fakes (``pyrt/sim``) and the exporter (``pyrt/export``, build time).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

CALLS = frozenset({"record", "wait", "synchronize", "record_stream", "wait_for", "order", "_order_streams",
                   "free_async", "alloc_async", "cuEventRecord", "cuStreamWaitEvent", "cuStreamSynchronize",
                   "cuEventSynchronize", "cuCtxSynchronize"})
KEEP_NAMES = frozenset({"free_on", "_free_on", "keepalive", "_keep"})
SKIPPED = ("pyrt/sim/", "pyrt/export/")


@dataclass(frozen=True)
class Statement:
    """One ordering statement: where it is, its first line's text (stripped), and how to mutate it."""

    rel: str
    lineno: int
    end: int  # last line replaced by the mutant
    text: str
    header: bool  # an if/while whose condition orders: the mutant makes the condition False

    @property
    def key(self) -> str:
        return f"{self.rel}: {self.text}"

    def mutate(self, source: str) -> str:
        """``source`` with this statement deleted (``pass``), or its condition made False."""
        lines = source.splitlines(keepends=True)
        first = lines[self.lineno - 1]
        indent = first[: len(first) - len(first.lstrip())]
        if self.header:
            word = "elif" if first.lstrip().startswith("elif") else first.lstrip().split()[0]
            new = f"{indent}{word} False:  # mutant\n"
        else:
            new = f"{indent}pass  # mutant\n"
        return "".join(lines[: self.lineno - 1] + [new] + lines[self.end:])


def _hit(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in CALLS:
                return True
            if (isinstance(f, ast.Attribute) and f.attr == "append" and isinstance(f.value, ast.Attribute)
                    and f.value.attr in KEEP_NAMES):
                return True
        if isinstance(n, (ast.Attribute, ast.Name)) and isinstance(n.ctx, ast.Store):
            if (n.attr if isinstance(n, ast.Attribute) else n.id) in KEEP_NAMES:
                return True
    return False


def statements(root: Path) -> list[Statement]:
    """Every ordering statement under ``root/pyrt``, in file and line order."""
    found: list[Statement] = []
    for path in sorted((root / "pyrt").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(SKIPPED):
            continue
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for stmt in ast.walk(ast.parse(source)):
            if isinstance(stmt, (ast.If, ast.While)):
                if _hit(stmt.test):
                    found.append(Statement(rel, stmt.lineno, stmt.body[0].lineno - 1,
                                           lines[stmt.lineno - 1].strip(), True))
            elif isinstance(stmt, ast.stmt) and not isinstance(stmt, _COMPOUND) and _hit(stmt):
                found.append(Statement(rel, stmt.lineno, stmt.end_lineno or stmt.lineno,
                                       lines[stmt.lineno - 1].strip(), False))
    return sorted(found, key=lambda s: (s.rel, s.lineno))


_COMPOUND = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.While, ast.For, ast.AsyncFor,
             ast.With, ast.AsyncWith, ast.Try, ast.Match)
