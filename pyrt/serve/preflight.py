"""What ``pyrt serve`` checks before it starts Ray (which takes 20 s and more): failures it can name at once.

- the file is there;
- the HTTP port is free on ``--host`` (:func:`check_port`): a port in use is one line naming it, exit 1, not
  Ray's HAProxy actor failing 20 s later;
- the tokenizer folder loads (:func:`pyrt.serve.text.load_tokenizer`): what is wrong with it, named, not a
  replica failing to start 30 s later.

A cluster joined with ``--address`` is left to its own checks: its Serve ingress holds the port already, and
the tokenizer's path is the replicas' hosts' to read.

>>> import socket
>>> with socket.socket() as s:
...     s.bind(("127.0.0.1", 0)); s.listen()
...     check_port("127.0.0.1", s.getsockname()[1])  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
pyrt.errors.PyrtError: --port ...: 127.0.0.1:... is in use (another server listens there): stop it, or pick ...
"""

from __future__ import annotations

import errno
import os
import socket

from pyrt.errors import InputError, PyrtError
from pyrt.serve.config import ServeConfig, StartOptions
from pyrt.serve.text import load_tokenizer, read_chat_template


def check_port(host: str, port: int, flag: str = "--port") -> None:
    """PyrtError naming ``host:port`` when a listener holds it (or the host has no such address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise PyrtError(f"--host {host!r}: not an address of this machine ({exc.strerror or exc})") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to listen on
        try:
            s.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PyrtError(f"{flag} {port}: {host}:{port} is in use (another server listens there): stop it, "
                                f"or pick another {flag}") from None
            if exc.errno == errno.EACCES:
                raise PyrtError(f"{flag} {port}: {host}:{port} needs privileges to listen on (ports below 1024): "
                                f"pick another {flag}") from None
            raise PyrtError(f"--host {host!r}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def check_before_ray(cfg: ServeConfig, where: StartOptions) -> None:
    """The checks of a start: the file; for one that begins a local Ray (not ``--address``) the ports, then the
    tokenizer."""
    if not os.path.isfile(cfg.path):
        raise InputError(f"{cfg.path}: no such file" if not os.path.exists(cfg.path) else f"{cfg.path}: not a file")
    if where.address:
        return
    check_port(where.host, where.port)
    if where.metrics_port is not None:
        check_port("0.0.0.0", where.metrics_port, "--metrics-port")  # Ray binds it on every interface
    if cfg.tokenizer:
        load_tokenizer(cfg.tokenizer)
    if cfg.chat_template:
        read_chat_template(cfg.chat_template)
