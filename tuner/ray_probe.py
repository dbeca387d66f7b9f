"""Whether anything answers at a Ray cluster's address: a TCP connection to its head's GCS
port, without importing Ray (the dispatcher's Ray watch asks it from its own thread)."""

from __future__ import annotations

import socket
from typing import Final

from tuner.errors import ClusterUnavailableError

__all__ = ["RAY_PROBE_TIMEOUT_S", "probe_ray_address", "tcp_address"]

#: How long :func:`probe_ray_address` waits for the head's GCS port to accept a connection.
RAY_PROBE_TIMEOUT_S: Final = 5.0


def tcp_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address of the form ``host:port`` (the head's GCS); ``None``
    for the other forms (``auto``, ``local``, ``ray://...``, no port), which are Ray's."""
    host, sep, port = address.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or "://" in address:
        return None
    return host.strip("[]"), int(port)


def probe_ray_address(address: str, timeout_s: float = RAY_PROBE_TIMEOUT_S) -> None:
    """Raise :class:`ClusterUnavailableError` at once when nothing accepts a TCP connection at
    ``address`` (``host:port``, the head's GCS). ``ray.init`` would retry such an address for
    minutes (about 12 with Ray's defaults) while the study it was to run sat claimed. Other
    forms (:func:`tcp_address`) are left to Ray."""
    target = tcp_address(address)
    if target is None:
        return
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        raise ClusterUnavailableError(
            f"could not connect to the Ray cluster at RAY_ADDRESS={address}: nothing accepts "
            f"connections there ({exc}); check that the head node is up and the address is right"
        ) from exc
