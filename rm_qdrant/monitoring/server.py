"""Serving a registry of metrics over HTTP in Prometheus' text format (``rmq migrate
--metrics-port``): on a thread of this process, from the moment the port is bound until
:meth:`MetricsServer.close`, which releases the port."""

from __future__ import annotations

import errno
import logging
import socket

from prometheus_client import CollectorRegistry, start_http_server

from rm_qdrant.errors import ConfigError

log = logging.getLogger(__name__)

#: Where the metrics are served by default: every interface, so that Prometheus can scrape a pod
#: or a machine from outside, as exporters do (``--metrics-host 127.0.0.1`` keeps them local).
DEFAULT_HOST = "0.0.0.0"


def check_port(port: object) -> int:
    """``port`` if it is a whole number from 1 to 65535.

    Raises:
        ConfigError: it is not.
    """
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ConfigError(f"metrics port (--metrics-port) is a whole number from 1 to 65535, got {port!r}")
    return port


class MetricsServer:
    """An HTTP server of ``registry`` (a fresh one by default) on ``host:port``, on a daemon thread;
    the port is bound when this is made. A context manager: leaving it closes the server.

    Args:
        port: 1 to 65535.
        host: the address to listen on (default :data:`DEFAULT_HOST`, every interface).
        registry: what to serve; None: a new :class:`prometheus_client.CollectorRegistry`, never
            the process's global one (an application's own metrics stay its own).

    Raises:
        ConfigError: a port outside 1..65535, in use, or not allowed (below 1024 without the
            privilege), or a host that does not resolve or is not this machine's.

    Example:
        >>> with MetricsServer(9108) as server:  # doctest: +SKIP
        ...     SearchMetrics(server.registry)
    """

    def __init__(
        self, port: int, *, host: str = DEFAULT_HOST, registry: CollectorRegistry | None = None
    ) -> None:
        check_port(port)
        if not isinstance(host, str) or not host:
            raise ConfigError(f"metrics host (--metrics-host) is an address or a host name, got {host!r}")
        self.registry = CollectorRegistry() if registry is None else registry
        self.host = host
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(_refusal(exc, host, port)) from exc
        except UnicodeError as exc:  # a name the resolver cannot encode: 'a..b', a label over 63 characters
            raise ConfigError(f"metrics host (--metrics-host) {host!r} is not a host name: {exc}") from exc
        self.port: int = self._server.server_port
        log.info("serving metrics on http://%s:%d/metrics", host, self.port)

    @property
    def url(self) -> str:
        """Where the metrics are scraped (``0.0.0.0`` shown as ``127.0.0.1``: this machine)."""
        host = "127.0.0.1" if self.host == DEFAULT_HOST else self.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop serving and release the port (waits for the server's loop: up to half a second)."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_metrics(port: int | None, host: str | None = None) -> MetricsServer | None:
    """A :class:`MetricsServer` on ``port`` (None: no metrics, and no ``host`` either).

    Raises:
        ConfigError: see :class:`MetricsServer`; a host without a port.
    """
    if port is None:
        if host is not None:
            raise ConfigError("metrics host (--metrics-host): only with a metrics port (--metrics-port)")
        return None
    return MetricsServer(port, host=DEFAULT_HOST if host is None else host)


def _refusal(exc: OSError, host: str, port: int) -> str:
    """Why the metrics server could not listen on ``host:port``, in one line, with a way out."""
    where = f"metrics port {port} on {host}"
    if isinstance(exc, socket.gaierror):
        return f"metrics host (--metrics-host) {host!r} does not resolve: {exc.strerror or exc}"
    if exc.errno == errno.EADDRINUSE:
        return f"{where} is in use: pick another (--metrics-port); nothing was started"
    if exc.errno == errno.EACCES:
        return (
            f"{where} is not allowed (ports below 1024 need privileges): pick another "
            "(--metrics-port); nothing was started"
        )
    if exc.errno == errno.EADDRNOTAVAIL:
        return f"metrics host (--metrics-host) {host} is not an address of this machine"
    return f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}"
