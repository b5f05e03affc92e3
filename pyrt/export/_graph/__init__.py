"""The FX graph engines are cut from: a model made exportable, then prepared and partitioned.

``hf_decoder`` (Hugging Face causal LMs as ExecuTorch LLM modules), ``fx`` (FX plumbing:
lifted objects, unlifting, inlining, dynamic dims for re-export), ``passes`` (decomposition,
assertions, symbolic sizes, forced ops, what ExecuTorch keeps), ``pass_order`` (the one order the
passes run in), ``partition`` (engine partitions and fallback ops),
``datadep`` (data-dependent output shapes), ``spec`` (what an engine node carries) and
``engine_op`` (the ``pyrt::execute_engine`` operator).

May import: pyrt.export's public option checks, pyrt.sim (reference engines), pyrt.format,
pyrt.errors; torch and executorch.
"""
