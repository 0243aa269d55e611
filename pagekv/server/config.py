"""What a server is configured with; constructing one is where failing closed is enforced."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from pagekv.actor.directory.leases import LEASE_S
from pagekv.actor.realtime.connection import ConnectionLimits
from pagekv.kv import redact_url
from pagekv.protocol import DEFAULT_MAX_BODY_BYTES, TOKEN_ENV

GRACEFUL_S = 10
"""How long a stopping server lets the requests it began finish before it cancels them."""
DEFAULT_INSPECT_MAX_BYTES = 16 * 2**20
DEFAULT_INSPECT_TEMP_BYTES = 512 * 2**20
DEFAULT_INSPECT_CONCURRENCY = 4
MIN_SECRET_CHARS = 16


class ConfigError(ValueError):
    """A server configuration that must not start (the message says what to change)."""


@dataclass(frozen=True)
class ServerConfig:
    """`token` is required unless `unauthenticated` is set explicitly; never both.

    `cors_origins` are exact origins (`https://app.example`) that browsers may call the gateway
    and inspector from; empty means no CORS headers at all.
    """

    token: str | None = None
    unauthenticated: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] | None = None
    """Names a request's `Host` may carry besides the server's own (its loopback names,
    `listen_host`, the advertise URL's host); `*` allows any. None: the own names only on an
    unauthenticated server, any with a token (`guard.py`)."""
    listen_host: str | None = None
    """The address the server listens on (`--host`), when known: a name of its own."""
    query_timeout_s: float = 5.0
    """How long a read-only inspector query may run."""
    inspect_max_bytes: int = DEFAULT_INSPECT_MAX_BYTES
    """The most bytes of values one inspector answer may hold (413 `answer_too_large` past
    it); no value read or built by a query may be longer either."""
    inspect_temp_bytes: int = DEFAULT_INSPECT_TEMP_BYTES
    """The most bytes of temp files on disk one inspector read may write as it sorts or builds
    temporary tables (403 `query_refused`, `limit` `inspect_temp_bytes`, past it): sorting on
    disk keeps a query's memory small (about 32 MiB plus, for each 16 MiB sorted, its largest
    row), and this bounds the disk and that memory."""
    inspect_concurrency: int = DEFAULT_INSPECT_CONCURRENCY
    """Inspector reads that run at once on worker threads: more wait for a turn (up to
    `query_timeout_s`, then 503 `inspector_busy`), so the actors' work never waits behind
    them."""
    header_timeout_s: float = 10.0
    """How long a client may take to send a request's headers (from its first byte, or from
    the connection's opening): past it, 408 and the connection is closed."""
    body_timeout_s: float = 30.0
    """How long a request's body may take to arrive whole (408 past it)."""
    max_header_bytes: int = 64 * 1024
    """The most bytes a request's headers may hold (431 beyond)."""
    max_connections: int = 1024
    """Connections (and requests in flight) served at once; more are answered 503."""
    advertise_url: str | None = None
    """Where the other registries of the store reach this server to forward calls for the
    actors it owns (`pagekv serve --advertise-url`): `http(s)://HOST[:PORT]` and nothing more,
    since they append the route to it. None: it owns actors nobody can forward to, so the
    others take them over, as a process without placement would."""
    forward_timeout_s: float = 30.0
    """How long a forwarded call may take at its owner before its answer begins (503
    `owner_timeout` past it); a streamed answer then lasts as long as its handler makes it."""
    forward_connect_s: float = 1.0
    """How long connecting to an actor's owner may take before it counts as unreachable."""
    forward_keepalive_s: float = 2.0
    """How long a connection to another server stays pooled while idle. A stopping server
    drains for longer than this (`drain`), so no pooled connection is reused as it closes."""
    forward_wait_s: float = 2.0
    """How long a call keeps being routed again while its actor's owner cannot be reached or
    refuses it (503 `owner_unreachable` past it: the client retries)."""
    lease_s: float = LEASE_S
    """The registry's `lease` (`pagekv serve` takes the app's registry's)."""
    ws_max_in_bytes: int = 64 * 1024
    """The largest WebSocket frame a client may send (closed with 1009 past it)."""
    ws_max_out_bytes: int = 1 << 20
    """The largest frame sent to a client: a bigger event is refused to the actor's code, a
    bigger result answered with `answer_too_large`."""
    ws_buffer_bytes: int = 4 << 20
    """Frames waiting for a slow client, per connection: past it the connection is closed
    (4008), so one slow reader never holds unbounded memory."""
    ws_ping_interval_s: float = 20.0
    """How often a silent WebSocket is pinged; one that does not answer within
    `ws_ping_timeout_s` is closed and its `on_disconnect` runs."""
    ws_ping_timeout_s: float = 20.0
    cluster_secret: str | None = field(default=None, repr=False)
    """What the servers of a store prove to each other with (`cluster/peer_auth.py`): every server
    that forwards calls to another needs the same. None: a secret of this process's own, so
    only servers in this process can forward to each other (`pagekv serve` gives one)."""

    def connection_limits(self) -> ConnectionLimits:
        return ConnectionLimits(
            max_in_bytes=self.ws_max_in_bytes,
            max_out_bytes=self.ws_max_out_bytes,
            max_buffered_bytes=self.ws_buffer_bytes,
        )

    def __post_init__(self) -> None:
        if self.token is None and not self.unauthenticated:
            raise ConfigError(
                f"no token: pass --token, set {TOKEN_ENV}, or serve without auth explicitly "
                "with --unauthenticated"
            )
        if self.token is not None and self.unauthenticated:
            raise ConfigError("a token and --unauthenticated contradict each other; pick one")
        if self.token is not None and (not self.token or not self.token.isprintable()):
            raise ConfigError("the token must be non-empty printable text")
        if self.token is not None and any(c.isspace() for c in self.token):
            raise ConfigError("the token must not contain whitespace")
        if self.max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be >= 1, got {self.max_body_bytes}")
        for origin in self.cors_origins:
            if origin == "*" or "://" not in origin or origin.endswith("/"):
                raise ConfigError(
                    f"CORS origin {origin!r} must be an exact origin like https://app.example "
                    "(no wildcard, no trailing slash)"
                )
        for host in self.allowed_hosts or ():
            if host != "*" and not _is_host_name(host):
                raise ConfigError(
                    f"allowed host {host!r} must be a host name or address without a port "
                    "(dev.example, 192.168.1.5, ::1) or *"
                )
        if self.inspect_max_bytes < 1:
            raise ConfigError(f"inspect_max_bytes must be >= 1, got {self.inspect_max_bytes}")
        if self.inspect_temp_bytes < 1:
            raise ConfigError(f"inspect_temp_bytes must be >= 1, got {self.inspect_temp_bytes}")
        if self.inspect_concurrency < 1:
            raise ConfigError(f"inspect_concurrency must be >= 1, got {self.inspect_concurrency}")
        for name in ("header_timeout_s", "body_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.max_header_bytes < 1024:
            raise ConfigError(f"max_header_bytes must be >= 1024, got {self.max_header_bytes}")
        if self.max_connections < 1:
            raise ConfigError(f"max_connections must be >= 1, got {self.max_connections}")
        try:
            self.connection_limits()
        except ValueError as e:
            raise ConfigError(f"WebSocket limits: {e}") from None
        for name in ("ws_ping_interval_s", "ws_ping_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.query_timeout_s <= 0:
            raise ConfigError(f"query_timeout_s must be > 0, got {self.query_timeout_s}")
        for name in (
            "forward_timeout_s",
            "forward_connect_s",
            "forward_wait_s",
            "forward_keepalive_s",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.lease_s <= 0:
            raise ConfigError(f"lease_s must be > 0, got {self.lease_s}")
        if self.advertise_url is not None:
            _check_advertise_url(self.advertise_url)
        if self.cluster_secret is not None and (
            len(self.cluster_secret) < MIN_SECRET_CHARS
            or not self.cluster_secret.isprintable()
            or any(c.isspace() for c in self.cluster_secret)
        ):
            raise ConfigError(
                f"the cluster secret must be at least {MIN_SECRET_CHARS} printable characters "
                "without whitespace"
            )


def _is_host_name(host: str) -> bool:
    if ":" in host.strip("[]"):
        try:
            ipaddress.IPv6Address(host.strip("[]"))
        except ValueError:
            return False
        return True
    return bool(host) and all(c.isalnum() or c in "-._" for c in host) and host.isascii()


def _check_advertise_url(url: str) -> None:
    """An address other servers can append `/actors/...` to: a scheme they speak, a host, at
    most a port. A user or password is refused (and never shown: `redact_url`)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        problem = "it must start with http:// or https://"
    elif not parts.hostname:
        problem = "it needs a host"
    elif any(c.isspace() or not c.isprintable() for c in parts.netloc):
        problem = "its host must not hold spaces or control characters"
    elif "@" in parts.netloc:
        problem = "it must not hold a user or password"
    elif url.partition("://")[2] != parts.netloc:
        problem = "it must have no path, query or fragment (not even a trailing /)"
    else:
        try:
            port = parts.port
        except ValueError:
            port = 0
        if port == 0:
            problem = "its port must be 1..65535"
        else:
            return
    raise ConfigError(
        f"advertise URL {redact_url(url)!r}: {problem}; expected http(s)://HOST[:PORT]"
    )
