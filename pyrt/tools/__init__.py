"""Tools for people: the ``pyrt`` command line and what it shows.

Job: ``pyrt inspect`` (:func:`pyrt.inspect`, the report), ``run``, ``bench``
(latency and budget sweeps), ``profile``, the instruction-chain drawing, and
reading inputs from files or drawing random ones.

May import: every layer below (the runtime, export, testing for
``PYRT_SIMULATED_GPUS``); nothing below imports this package.
"""
