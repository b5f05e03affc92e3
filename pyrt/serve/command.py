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
import os
import signal
import sys
import threading
import warnings
from collections.abc import Sequence
from typing import Any

from pyrt.format.companions import find_tokenizer
from pyrt.serve import lifetime
from pyrt.serve.arguments import number_argument, seconds_argument, whole_argument
from pyrt.serve.config import API_KEY_ENV, DEFAULT_MAX_REQUEST_BYTES, DEFAULT_READ_TIMEOUT_S, api_key_from_env
from pyrt.streaming import budget_argument

APP_NAME = "pyrt"
EXAMPLES = """examples:
  pyrt serve model.pte                               one replica on one GPU, http://127.0.0.1:8000/v2
  pyrt serve model.pte --replicas 4 --budget 50%     four replicas, half of each engine's streamable weights
  pyrt serve model.pte --address auto --host 0.0.0.0 join the Ray cluster this machine belongs to
  PYRT_SIMULATED_GPUS=2 pyrt serve model.pte --replicas 2
  pyrt serve llm.pte --tokenizer ./tokenizer        an LLM: OpenAI's API at /v1, Triton's generate routes"""


def _budget(text: str) -> Any:
    """``--budget``: :func:`pyrt.streaming.budget_argument`, its ValueError as a usage error."""
    try:
        return budget_argument(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_parser(subparsers: Any, parents: Sequence[argparse.ArgumentParser] = ()) -> argparse.ArgumentParser:
    """Add ``serve`` to a command line's subparsers; the parsed namespace's ``func`` runs it."""
    p = subparsers.add_parser("serve", parents=list(parents), formatter_class=argparse.RawDescriptionHelpFormatter,
                              epilog=EXAMPLES, help="serve a .pte over the Open Inference Protocol (Ray Serve)",
                              description="Serve a .pte program on Ray Serve, speaking KServe v2 / Triton's HTTP "
                                          "protocol, with dynamic batching and one Program per replica.")
    p.add_argument("path", help="the .pte file")
    p.add_argument("--name", nargs="+", default=[""], metavar="NAME",
                   help="model name (default: the file's stem; org/Model ids too) and more names clients may use for "
                        "it (vLLM's --served-model-name a b); methods serve as NAME.METHOD")
    p.add_argument("--replicas", type=whole_argument(1), default=1,
                   help="replicas, each with its own Program (default 1)")
    p.add_argument("--gpus-per-replica", type=number_argument,
                   help="GPUs Ray assigns each replica (default: 1 when the program has TensorRT delegates, else 0)")
    p.add_argument("--cpus-per-replica", type=number_argument, default=1.0,
                   help="CPUs Ray reserves per replica (default 1)")
    p.add_argument("--budget", type=_budget, help="weight-streaming budget per replica: bytes, 50%%, auto, 0=1GiB")
    p.add_argument("--data", action="append", default=[], metavar="PTD", help="a .ptd file of external weights")
    p.add_argument("--kernels", choices=("torch", "numpy"), help="kernels for non-delegated operators")
    p.add_argument("--max-batch-size", type=whole_argument(1), default=8,
                   help="most rows in one batched run (1: no batching)")
    p.add_argument("--batch-wait-ms", type=number_argument, default=2.0,
                   help="how long a batch waits to fill (default 2)")
    p.add_argument("--max-request-bytes", type=whole_argument(1), default=DEFAULT_MAX_REQUEST_BYTES,
                   help="larger request bodies are refused with 413 (default 64 MiB)")
    p.add_argument("--max-queued-requests", type=whole_argument(1), metavar="N",
                   help="requests each replica holds waiting for its run thread (more are refused at once with 503 "
                        "and Retry-After), and generations waiting for a KV-cache slot (more get 429) (default: no "
                        "limit)")
    p.add_argument("--request-timeout-s", type=seconds_argument, metavar="T",
                   help="an infer request not answered within T s of its arrival gets 504 (default: no limit)")
    p.add_argument("--read-timeout-s", type=seconds_argument, default=DEFAULT_READ_TIMEOUT_S, metavar="R",
                   help="a client must send its request (headers and body) within R s, else 408 "
                        f"(default {DEFAULT_READ_TIMEOUT_S:g})")
    p.add_argument("--host", default="127.0.0.1", help="HTTP host (default 127.0.0.1; 0.0.0.0 for every interface)")
    p.add_argument("--port", type=whole_argument(1), default=8000, help="HTTP port (default 8000)")
    p.add_argument("--address", help="join a running Ray cluster: auto or ray://HOST:PORT (default: start one)")
    p.add_argument("--metrics-port", type=whole_argument(1),
                   help="Prometheus port of a Ray this command starts (Ray binds it on every interface; GET /metrics "
                        "on the API port, which listens on --host, has the replica's own)")
    p.add_argument("--tokenizer", metavar="DIR", help="a local Hugging Face tokenizer directory: text in and out "
                                                      "on the generate routes, and OpenAI's /v1 API")
    p.add_argument("--draft", metavar="ngram|D.pte", help="speculative decoding of the generating models: guess "
                   "tokens by prompt lookup (ngram) or with a smaller LLM file of the same vocabulary (loaded fully "
                   "resident on each replica)")
    p.add_argument("--draft-tokens", type=whole_argument(1), default=4, metavar="K",
                   help="--draft: the most tokens a sequence guesses per step (default 4)")
    p.add_argument("--api-key", metavar="KEY", help=f"require 'Authorization: Bearer KEY' on /v1 and /v2/models "
                                                    f"(default ${API_KEY_ENV}; health stays open)")
    p.add_argument("--ray-proxy", action="store_true",
                   help="serve HTTP through Ray Serve's proxy actor instead of HAProxy straight to the replicas "
                        "(a Ray this command starts; a cluster joined with --address keeps its own setting)")
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
    from pyrt.serve.app import deployment, simulated_from_env  # extra: serve

    args.tokenizer = args.tokenizer or find_tokenizer(args.path)  # the one pyrt export kept beside the file
    lifetime.end_orphans(_say)
    sim = simulated_from_env()
    app = deployment(args.path, name=args.name[0], aliases=tuple(args.name[1:]), replicas=args.replicas,
                     gpus_per_replica=args.gpus_per_replica,
                     budget=args.budget, data=args.data, kernels=args.kernels, max_batch_size=args.max_batch_size,
                     batch_wait_ms=args.batch_wait_ms, max_request_bytes=args.max_request_bytes,
                     simulated_gpus=sim, num_cpus=args.cpus_per_replica, tokenizer=args.tokenizer,
                     api_key=args.api_key or api_key_from_env(), max_queued_requests=args.max_queued_requests,
                     request_timeout_s=args.request_timeout_s, read_timeout_s=args.read_timeout_s,
                     draft=args.draft, draft_tokens=args.draft_tokens)
    owner = None if args.address else lifetime.owner_token()  # marks the processes of the Ray started here
    watchdog = lifetime.start_watchdog(owner) if owner else None
    try:
        finished = _serve(args, app, sim, owner)
    finally:
        if watchdog is not None:
            watchdog.close()
    if not finished:  # a thread is stuck in a Ray that is gone: Ray's exit handlers would wait on it too
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _serve(args: argparse.Namespace, app: Any, sim: int | None, owner: str | None) -> bool:
    """Serve until stopped; False when the stop had to abandon a step (:func:`pyrt.serve.lifetime.shutdown`)."""
    import ray  # extra: serve
    from ray import serve  # extra: serve

    from pyrt.serve.app import GRACEFUL_SHUTDOWN_S, start  # extra: serve
    from pyrt.serve.app import run as deploy  # extra: serve

    stop = threading.Event()
    previous = signal.getsignal(signal.SIGTERM)
    try:
        via = start(address=args.address, host=args.host, port=args.port,
                    num_gpus=sim if not args.address else None, metrics_port=args.metrics_port,
                    ray_proxy=args.ray_proxy, owner=owner, read_timeout_s=args.read_timeout_s,
                    request_timeout_s=args.request_timeout_s)
        # after ray.init, whose own SIGTERM handler exits; SIGINT too, whatever this process inherited (a job
        # started with `cmd &` in a script has SIGINT ignored, and Python then installs no KeyboardInterrupt)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
        deploy(app, app_name=APP_NAME, path=args.path)
        openai = f", OpenAI API at http://{args.host}:{args.port}/v1" if args.tokenizer else ""
        _say(f"pyrt serve: {args.path} at http://{args.host}:{args.port}/v2{openai} ({args.replicas} replica(s), "
             f"HTTP via {via}); Ctrl-C or SIGTERM drains and stops")
        _wait_for_stop(stop)
        _say("pyrt serve: draining requests in flight")
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # the stop is bounded: a second signal does not cut it short
            signal.signal(sig, signal.SIG_IGN)

        def drain() -> None:
            with contextlib.suppress(Exception):  # the ingress answers while the replicas finish their requests
                serve.delete(APP_NAME)
            serve.shutdown()

        finished = lifetime.shutdown(drain, ray.shutdown, owner, GRACEFUL_SHUTDOWN_S + 30, _say)
        signal.signal(signal.SIGTERM, previous)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    return finished
