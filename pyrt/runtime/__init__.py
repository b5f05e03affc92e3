"""The runtime: a loaded program's plan and the loop that runs it.

Job: ``file -> reader -> plan -> executor -> engine / kernels``. The plan
(:mod:`~pyrt.runtime.plan`) turns an execution plan into value tables, arenas and one
step per instruction, after validating it (:mod:`~pyrt.runtime.load_plan`) and allocating
its memory (:mod:`~pyrt.runtime.materialize`); load-time folding and views
(:mod:`~pyrt.runtime.fold`, its analysis :mod:`~pyrt.runtime.fold_analysis`), the steady
chain of repeated shapes (:mod:`~pyrt.runtime.steady`), TensorRT delegates (engines
loaded on their devices by :mod:`~pyrt.runtime.delegates`, a method's streams, events and staging
in :mod:`~pyrt.runtime.device_context`, launch steps in :mod:`~pyrt.runtime.delegate_steps`), CUDA-graph capture
(:mod:`~pyrt.runtime.cuda_graphs`, :mod:`~pyrt.runtime.graph_forward`), the instruction
loop (:mod:`~pyrt.runtime.executor`; inputs bound by :mod:`~pyrt.runtime.inputs`,
outputs handed back by :mod:`~pyrt.runtime.outputs`, per-run device state
:mod:`~pyrt.runtime.run_state`), the profiler, and the public
:class:`~pyrt.runtime.program.Program`.

May import: every lower layer (errors, format, device, memory, kernels). Never
:mod:`pyrt.sim` (nor :mod:`pyrt.testing`): simulated GPUs are passed in (``Program(path, devices=...)``)
or installed at the seams, not imported by the runtime.
"""
