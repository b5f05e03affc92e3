"""Moved to :mod:`pyrt.refengine`: reference engines are a product module (the exporter writes
them). The public names stay importable from here for existing code.

>>> from pyrt.testing.refengine import RefEngine
>>> import pyrt.refengine
>>> RefEngine is pyrt.refengine.RefEngine
True
"""

from pyrt.refengine import (  # noqa: F401 - re-exported
    ALIGN,
    DTYPES,
    HEADER,
    MAGIC,
    DType,
    Ref,
    RefEngine,
    RefNode,
    RefTensor,
    RefWeight,
)
