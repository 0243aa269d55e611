"""The address a `serve` process advertises to the other registries of its store, which forward
it the calls for the actors it owns: its default, each worker's own, and the check, once the
process listens, that the address reaches it.

A wrong address fails only when it matters: while no other process shares the store, nobody
forwards anything, so a process alone is warned and serves on; one with peers stops at once
rather than owning actors whose calls the others cannot deliver.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from urllib.parse import urlsplit

import anyio
import httpx

from pagekv.actor import Registry
from pagekv.actor.directory.leases import Member
from pagekv.server.cluster.peer_auth import (
    ANY_SERVER,
    CLUSTER_SECRET_ENV,
    MEMBER_PATH,
    ClusterKey,
    PeerTransport,
    UnprovenAnswer,
)

CHECK_TIMEOUT_S = 3.0
WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})
ADVERTISE_ENV = "PAGEKV_ADVERTISE_URL"
log = logging.getLogger("pagekv.server")


def http_url(host: str, port: int, scheme: str = "http") -> str:
    """`scheme://host:port`, an IPv6 address in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def default_url(host: str, port: int) -> str:
    """The address bound (`--host`, `--port`), or on a wildcard address (0.0.0.0, ::) this
    machine's hostname, the name its peers most likely resolve to it."""
    return http_url(socket.gethostname() if host in WILDCARD_HOSTS else host, port)


def worker_url(url: str, port: int) -> str:
    """`url`'s scheme and host with `port`: a worker of `serve --workers` is reached on a
    socket of its own, since a call forwarded to it must not land on another worker."""
    parts = urlsplit(url)
    assert parts.hostname is not None, "a checked advertise URL has a host"
    return http_url(parts.hostname, port, parts.scheme)


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name: what it resolves to elsewhere is unknown here


async def check_address(
    registry: Registry, url: str, cluster_secret: str | None, fix: str
) -> str | None:
    """None if this process may serve with `url` as its advertise address; else the one line
    saying why not, ending with `fix` (what to pass instead).

    `url` must answer `GET /cluster/member` with this registry's id, or no other registry may
    share the store (then a warning is logged); and it must not be a loopback address while a
    peer runs on another host.
    """
    reason = await _unreached(registry.id, url, cluster_secret)
    peers = await registry.peers()
    if reason is not None and peers:
        return (
            f"the advertise URL {url} does not reach this process ({reason}), but "
            f"{_count(peers)} sharing the store would forward calls to it there: {fix}"
        )
    if reason is not None:
        log.warning(
            "the advertise URL %s does not reach this process (%s); no other process shares "
            "the store yet, but one that does could not forward calls here",
            url,
            reason,
        )
        return None
    elsewhere = sorted({p.host for p in peers if p.host != socket.gethostname()})
    if is_loopback(url) and elsewhere:
        return (
            f"the advertise URL {url} is a loopback address, which the processes on "
            f"{', '.join(elsewhere)} sharing the store cannot reach: {fix}"
        )
    return None


async def check_peers(registry: Registry, cluster_secret: str | None) -> None:
    """Log an error for each process sharing the store that does not prove this process's
    cluster secret (`_warn_if_unproven`), so a mismatch shows at start, not at the first
    forwarded call."""
    async with anyio.create_task_group() as tg:
        for peer in await registry.peers():
            tg.start_soon(_warn_if_unproven, peer, cluster_secret)


async def _warn_if_unproven(peer: Member, cluster_secret: str | None) -> None:
    """Log an error if `peer` answers at its address without the proof of this cluster secret:
    no call can be forwarded between it and this process (a peer that cannot be reached is
    none of this check's business: its lease runs out)."""
    if peer.address is None:
        return
    transport = PeerTransport(ClusterKey(cluster_secret), ANY_SERVER)
    try:
        async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_S, transport=transport) as http:
            await http.get(f"{peer.address}{MEMBER_PATH}")
    except UnprovenAnswer:
        log.error(
            "the process at %s (registry %s) shares the store but not this process's cluster "
            "secret: no call can be forwarded between them; give every process of the store "
            "the same --cluster-secret (or $%s)",
            peer.address,
            peer.id,
            CLUSTER_SECRET_ENV,
        )
    except httpx.HTTPError as e:
        log.debug("peer %s at %s not checked: %r", peer.id, peer.address, e)


async def _unreached(registry_id: str, url: str, cluster_secret: str | None) -> str | None:
    """Why `url` does not lead to the registry `registry_id`, or None if it does. Asked with
    the cluster secret's proof, not the token, which a process there that is no server of the
    store (a mistyped address) would learn."""
    headers = {"accept": "application/json"}
    transport = PeerTransport(ClusterKey(cluster_secret), ANY_SERVER)
    try:
        async with httpx.AsyncClient(timeout=CHECK_TIMEOUT_S, transport=transport) as http:
            response = await http.get(f"{url}{MEMBER_PATH}", headers=headers)
    except httpx.HTTPError as e:
        return f"{type(e).__name__}: {' '.join(str(e).split())}" if str(e) else type(e).__name__
    if response.status_code != 200:
        return f"it answered {response.status_code}"
    try:
        answered = response.json().get("registry")
    except (ValueError, AttributeError):
        return "it answered something other than a pagekv server"
    if answered != registry_id:
        return f"another pagekv server answers there (registry {answered})"
    return None


def _count(peers: list[Member]) -> str:
    return "1 other process" if len(peers) == 1 else f"{len(peers)} other processes"
