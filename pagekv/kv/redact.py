"""`redact_url`: how a store URL is shown. Apart from `url.py` because the backends that
`open_kv` imports on demand (PostgreSQL's) show URLs too, and importing `url.py` back would be an
import circle."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

_QUERY_PASSWORD = re.compile(r"(^|&)(password=)[^&]*")
"""libpq takes a password as a query parameter too (`?password=...`)."""


def redact_url(url: str) -> str:
    """`url` with its passwords, if any, replaced by `***`, the one in the user part and any
    `password=` query parameter: the one form in which a store URL is printed, logged or put in
    an error message."""
    parts = urlsplit(url)
    query = _QUERY_PASSWORD.sub(r"\1\2***", parts.query)
    if parts.password is None and query == parts.query:
        return url
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        netloc = f"{user.partition(':')[0]}:***@{host}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))
