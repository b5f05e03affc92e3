"""``pyrt serve``: pyrt programs behind the Open Inference Protocol and OpenAI's API on Ray Serve (the ``serve`` extra).

:mod:`pyrt.serve.protocol` and :mod:`pyrt.serve.batching` are plain functions (numpy only);
:mod:`pyrt.serve.replica` is the Ray Serve deployment (one Program per replica, on the GPU
Ray assigns it) and :func:`pyrt.serve.app.deployment` builds the application. Programs that
generate get one ``pyrt.llm.Engine`` per model (:mod:`pyrt.serve.llm_host`) behind OpenAI's
``/v1`` routes and Triton's generate routes (:mod:`pyrt.serve.llm_routes`).

May import: every layer below the apps (runtime, memory, format, errors) and ``pyrt.llm.serving``
(the engine, in the same layer); Ray Serve and Starlette (the ``serve`` extra) and ``transformers``
(a tokenizer, with ``--tokenizer``) only in the modules that serve.
"""
