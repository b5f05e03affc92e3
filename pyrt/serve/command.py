"""``pyrt serve MODEL.pte``: serve a program over the Open Inference Protocol on Ray Serve.

    pyrt serve model.pte --replicas 2 --budget 50% --port 8000
    pyrt serve model.pte --address auto            # join a running Ray cluster (ray start --head ...)
    PYRT_SIMULATED_GPUS=2 pyrt serve model.pte     # two simulated GPUs (reference engines only)

It starts a local Ray (or joins ``--address``), deploys the program, prints where
it serves once every replica has loaded it, and serves until Ctrl-C or SIGTERM,
which drain the requests in flight and exit 0; no process of the Ray it started
outlives it, however it stops (:mod:`pyrt.serve.lifetime`). A local Ray serves HTTP through
HAProxy straight to the replicas (``--ray-proxy``: through Ray Serve's proxy
actor, one process hop more; see :mod:`pyrt.serve.ingress`). Ray and Serve come with the
``serve`` extra (``pip install 'pyrt[serve]'``); this module imports them only
when the command runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from pyrt.serve import lifetime
from pyrt.serve.config import RAY_LOOPBACK_ENV, ServeConfig, StartOptions
from pyrt.serve.flags import add_flags, configs
from pyrt.serve.preflight import check_before_ray

EXAMPLES = """examples:
  pyrt serve model.pte                               one replica on one GPU, http://127.0.0.1:8000/v2
  pyrt serve model.pte --replicas 4 --budget 50%     four replicas, half of each engine's streamable weights
  pyrt serve model.pte --address auto --host 0.0.0.0 join the Ray cluster this machine belongs to
  PYRT_SIMULATED_GPUS=2 pyrt serve model.pte --replicas 2
  pyrt serve llm.pte --tokenizer ./tokenizer        an LLM: OpenAI's API at /v1, Triton's generate routes"""


def add_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``serve`` to a command line's subparsers (its flags: :data:`pyrt.serve.flags.FLAGS`); the parsed
    namespace's ``func`` runs it."""
    p = subparsers.add_parser("serve", parents=list(parents), formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=EXAMPLES, help="serve a .pte over the Open Inference Protocol (Ray Serve)",
                              description="Serve a .pte program on Ray Serve, speaking KServe v2 / Triton's HTTP "
                                          "protocol, with dynamic batching and one Program per replica.")
    add_flags(p)
    p.set_defaults(func=run)
    return p


def _wait_for_stop(stop: threading.Event) -> None:
    """Block until ``stop`` is set (SIGTERM) or Ctrl-C."""
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    """Start Ray and Serve, deploy, serve until SIGTERM / Ctrl-C, drain, exit 0 (:mod:`pyrt.serve.lifetime`)."""
    # Ray Serve's option schema uses a Pydantic 1 idiom (extra keywords on Field) that Pydantic 2 warns about at
    # import: 18 lines of third-party noise, from that one module, on every start. pyrt's own warnings still show.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"ray\.serve\._private\.config")
    cfg, where = configs(vars(args))
    lifetime.end_orphans(_say)  # first: what a killed pyrt serve left may hold the port
    check_before_ray(cfg, where)  # a port in use, a bad tokenizer: named now, not after Ray's start
    if where.loopback and not where.address:
        os.environ.update(RAY_LOOPBACK_ENV)  # before Ray is imported: nothing of its Ray listens beyond the loopback
    from pyrt.serve.app import deployment, simulated_from_env  # extra: serve

    sim = simulated_from_env()
    app = deployment(cfg, simulated_gpus=sim)
    owner = None if where.address else lifetime.owner_token()  # marks the processes of the Ray started here
    watchdog = lifetime.start_watchdog(owner) if owner else None
    verbose = logging.getLogger("pyrt").isEnabledFor(logging.DEBUG)  # --verbose, PYRT_LOG=debug: Ray's lines too
    try:
        with ray_output(verbose):
            finished = _serve(cfg, where, app, sim, owner, verbose)
    finally:
        if watchdog is not None:
            watchdog.close()
        if owner is not None:
            lifetime.forget(owner)  # its processes are ended (the watchdog ends what is left, and forgets too)
    if not finished:  # a thread is stuck in a Ray that is gone: Ray's exit handlers would wait on it too
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def started_line(cfg: ServeConfig, where: StartOptions, via: str) -> str:
    """What ``pyrt serve`` says once it serves: where, the replicas, the draft, how HTTP reaches them.

    >>> from pyrt.llm.config import GenerationConfig
    >>> line = started_line(ServeConfig("m.pte", generation=GenerationConfig(draft="ngram")), StartOptions(), "HAProxy")
    >>> line.split(" (", 1)[1]
    '1 replica(s), draft ngram guessing up to 4 tokens, HTTP via HAProxy); Ctrl-C or SIGTERM drains and stops'
    """
    url = f"http://{where.host}:{where.port}"
    openai = f", OpenAI API at {url}/v1" if cfg.tokenizer else ""
    draft = cfg.generation.draft
    drafting = f", draft {draft} guessing up to {cfg.generation.draft_tokens} tokens" if draft is not None else ""
    return (f"pyrt serve: {cfg.path} at {url}/v2{openai} ({cfg.replicas} replica(s){drafting}, HTTP via {via}); "
            "Ctrl-C or SIGTERM drains and stops")


def ray_output(verbose: bool) -> contextlib.AbstractContextManager[Any]:
    """Where the lines Ray's driver prints go while ``pyrt serve`` runs.

    Ray's driver prints what its raylet pushes ("(raylet) ..." lines: a worker that died, the memory
    monitor, a stop's "Task ServeController.graceful_shutdown failed ... killed by ray.kill", every clean
    stop) to ``sys.stdout``, coloured (``ray/_private/worker.py``: ``listen_error_messages``,
    ``print_to_stdstream``, ``print_worker_logs``). pyrt serve's own lines go to stderr, so stdout is
    Ray's alone: sent to /dev/null unless ``verbose``; with ``verbose`` and a stdout that is no terminal,
    Ray's colours are off (``RAY_COLOR_PREFIX=0``, read as each line prints) unless the user set it.
    """
    stack = contextlib.ExitStack()
    if not verbose:
        stack.enter_context(contextlib.redirect_stdout(stack.enter_context(open(os.devnull, "w"))))
    elif not sys.stdout.isatty() and "RAY_COLOR_PREFIX" not in os.environ:
        os.environ["RAY_COLOR_PREFIX"] = "0"
        stack.callback(os.environ.pop, "RAY_COLOR_PREFIX", None)
    return stack


def _serve(cfg: ServeConfig, where: StartOptions, app: Any, sim: int | None, owner: str | None,
           verbose: bool) -> bool:
    """Serve until stopped; False when the stop had to abandon a step (:func:`pyrt.serve.lifetime.shutdown`)."""
    import ray  # extra: serve
    from ray import serve  # extra: serve

    from pyrt.serve.app import GRACEFUL_SHUTDOWN_S, start  # extra: serve
    from pyrt.serve.app import run as deploy  # extra: serve

    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        via = start(address=where.address, host=where.host, port=where.port,
                    num_gpus=sim if not where.address else None, metrics_port=where.metrics_port,
                    ray_proxy=where.ray_proxy, owner=owner, read_timeout_s=cfg.read_timeout_s,
                    request_timeout_s=cfg.request_timeout_s, verbose=verbose)
        if owner is not None:
            lifetime.record(owner)  # what a later pyrt serve may end if this one and its watchdog are killed
        # after ray.init, whose own SIGTERM handler exits; SIGINT too, whatever this process inherited (a job
        # started with `cmd &` in a script has SIGINT ignored, and Python then installs no KeyboardInterrupt)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        deploy(app, app_name=cfg.app_name, path=cfg.path)
        if owner is not None:
            lifetime.record(owner)  # the replicas too (the watchdog records them again every few seconds)
        _say(started_line(cfg, where, via))
        _wait_for_stop(stop)
        _say("pyrt serve: draining requests in flight")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the stop is bounded: a second signal does not cut it short
            signal.signal(sig, signal.SIG_IGN)

        def drain() -> None:
            with contextlib.suppress(Exception):  # the ingress answers while the replicas finish their requests
                serve.delete(cfg.app_name)
            serve.shutdown()

        finished = lifetime.shutdown(drain, ray.shutdown, owner, GRACEFUL_SHUTDOWN_S + 30, _say)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return finished
