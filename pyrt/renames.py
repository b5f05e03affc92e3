"""Public names that were renamed: the old name keeps working, with a DeprecationWarning naming the new one.

A module that renamed a public class keeps its old name importable through a module
``__getattr__`` made here, rather than a second name bound to the same class: the old name
is no part of the module's namespace (nor of its ``__all__``), and every use of it says what to
write instead.

>>> import types, warnings
>>> demo = types.ModuleType("demo")
>>> class New: ...
>>> demo.New, demo.__getattr__ = New, renamed("demo", {"Old": "New"}, vars(demo))
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     demo.Old is New, str(caught[0].message)
(True, 'demo.Old is now demo.New')
>>> demo.Missing
Traceback (most recent call last):
...
AttributeError: module 'demo' has no attribute 'Missing'
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any


def renamed(module: str, names: Mapping[str, str], namespace: Mapping[str, Any],
            note: str = "") -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``module``: each old name in ``names`` gives ``namespace[new]`` and warns.

    ``note`` ends the warning (what the old name might be mistaken for, say).
    """
    def __getattr__(name: str) -> Any:
        new = names.get(name)
        if new is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        warnings.warn(f"{module}.{name} is now {module}.{new}{note}", DeprecationWarning, stacklevel=2)
        return namespace[new]

    return __getattr__


__all__ = ["renamed"]
