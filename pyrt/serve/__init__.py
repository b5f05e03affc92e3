"""``pyrt serve``: pyrt programs behind the Open Inference Protocol on Ray Serve (the ``serve`` extra).

:mod:`pyrt.serve.protocol` and :mod:`pyrt.serve.batching` are plain functions (numpy only);
:mod:`pyrt.serve.replica` is the Ray Serve deployment (one Program per replica, on the GPU
Ray assigns it) and :func:`pyrt.serve.app.deployment` builds the application.

May import: every layer below the apps (runtime, memory, format, errors); Ray Serve,
FastAPI and the generation routes' ``pyrt.llm.serving`` only lazily (the ``serve`` extra).
"""
