"""`redact_url`: how a store URL is shown. Apart from `url.py` because the backends that
`open_kv` imports on demand (PostgreSQL's) show URLs too, and importing `url.py` back would be an
import circle."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def redact_url(url: str) -> str:
    """`url` with its password, if any, replaced by `***`: the one form in which a store URL is
    printed, logged or put in an error message."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user, _, host = parts.netloc.rpartition("@")
    name = user.partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{name}:***@{host}"))
