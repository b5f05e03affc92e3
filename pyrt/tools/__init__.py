"""Tools for people: the ``pyrt`` command line and what it shows.

Job: ``pyrt inspect`` (:func:`pyrt.inspect`, the report), ``run``, ``bench``
(latency and budget sweeps), ``profile``, the instruction-chain drawing, and
reading inputs from files or drawing random ones; the parser of every subcommand,
``serve`` (:mod:`pyrt.serve.command`) and ``generate`` / ``bench --generate`` (:mod:`pyrt.llm`) included.

May import: every layer below (the runtime, export, sim for
``PYRT_SIMULATED_GPUS``) and the apps beside it, :mod:`pyrt.serve` and :mod:`pyrt.llm`;
nothing below imports this package, and neither do they.
"""
