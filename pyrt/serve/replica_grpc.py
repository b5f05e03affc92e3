"""A replica on a loopback-only Ray node keeps Ray Serve's inter-deployment gRPC server on the loopback too.

Ray Serve 2.x starts that server in each replica on ``[::]:0`` (every interface; written into
``ray/serve/_private/replica.py``'s ``_on_initialized``, with no setting to change it), after the replica's own
class is made. ``pyrt serve --host 127.0.0.1`` starts its Ray with every other process on 127.0.0.1, so there
the only way to this server is the loopback anyway; :func:`bind_like_the_node` (called from the replica's
constructor) makes Serve's bind helper, in this replica process only, put ``[::]`` addresses on 127.0.0.1 when
the node's own address is 127.0.0.1. On any other node, or a Ray without that helper, nothing changes (and
``tests/serve/test_serve_stop.py`` shows a Ray that listens wider again).

>>> loopback_address("[::]:0"), loopback_address("10.0.0.2:9000")
('127.0.0.1:0', '10.0.0.2:9000')
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("pyrt.serve")
_ANY6 = "[::]:"


def loopback_address(address: str) -> str:
    """``[::]:PORT`` as ``127.0.0.1:PORT``; any other address as it is."""
    return "127.0.0.1:" + address[len(_ANY6):] if isinstance(address, str) and address.startswith(_ANY6) else address


def bind_like_the_node(node_ip: str | None = None) -> bool:
    """On a node whose address is 127.0.0.1 (default: this Ray worker's), Serve's replica gRPC server binds there.

    Returns whether the bind helper now does so.
    """
    try:
        import ray
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return False
    if (node_ip or ray.util.get_node_ip_address()) != "127.0.0.1":
        return False
    bind = getattr(serve_replica, "add_port_to_grpc_server", None)
    if bind is None:
        log.debug("Ray Serve's replica has no add_port_to_grpc_server: its gRPC server binds as Ray chose")
        return False
    if getattr(bind, "pyrt_loopback", False):
        return True

    def on_loopback(server: Any, address: str) -> Any:
        return bind(server, loopback_address(address))

    on_loopback.pyrt_loopback = True  # type: ignore[attr-defined]
    serve_replica.add_port_to_grpc_server = on_loopback
    return True


__all__ = ["bind_like_the_node", "loopback_address"]
