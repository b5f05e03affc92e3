"""``pyrt serve``: pyrt programs behind the Open Inference Protocol and OpenAI's API on Ray Serve (the ``serve`` extra).

:mod:`pyrt.serve.protocol` and :mod:`pyrt.serve.batching` are plain functions (numpy and the
request models); :mod:`pyrt.serve.replica` is the Ray Serve deployment (one Program per replica,
on the GPU Ray assigns it, or on the devices :func:`pyrt.serve.app.deployment` binds it with) and
answers HTTP through the routes it declares once (:mod:`pyrt.serve.routes`, Starlette's router).
Request bodies are pydantic models (:mod:`pyrt.serve.validation`, :mod:`pyrt.serve.openai_api`,
:mod:`pyrt.serve.generate`); a generation request becomes one ``pyrt.llm.SamplingParams``.
Programs that generate get one ``pyrt.llm.Engine`` per model (:mod:`pyrt.serve.llm_host`,
:mod:`pyrt.serve.llm_models`) behind OpenAI's ``/v1`` routes (:mod:`pyrt.serve.openai_routes`)
and Triton's generate routes (:mod:`pyrt.serve.generate_routes`), each request one
:mod:`pyrt.serve.generation_call` through its protocol's adapter. The command line is
:mod:`pyrt.serve.command`, its flags one table (:mod:`pyrt.serve.flags`) that fills the configs
(:mod:`pyrt.serve.config`).

May import: every layer below the apps (runtime, memory, format, errors) and ``pyrt.llm`` (the
engine, in the same layer); Ray Serve, Starlette and pydantic (the ``serve`` extra) and
``transformers`` (a tokenizer, with ``--tokenizer``) only in the modules that serve.
"""
