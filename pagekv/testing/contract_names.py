"""Contract clauses of namespace names: every str of 1 to `max_name_bytes` UTF-8 bytes without
NUL names a namespace of its own (composed and decomposed forms are different names); any other
name is refused by `store.namespace` with `InvalidArgument`, or `NameTooLarge` past the limit the
store was made with. They need a factory returning stores.
"""

from __future__ import annotations

import random

from pagekv.kv import InvalidArgument, NameTooLarge
from pagekv.testing.clauses import Trial, clause
from pagekv.testing.contract_data import at_least, boundary
from pagekv.testing.contract_limits import limit_error


def incompressible_name(size: int, seed: int = 5) -> str:
    """A name of exactly `size` UTF-8 bytes of random 3-byte characters (a database that
    compresses a repetitive one would hide the size its index must hold)."""
    rnd = random.Random(seed)
    chars = [chr(rnd.randrange(0x4E00, 0xA000)) for _ in range(size // 3)]
    return "".join(chars) + "x" * (size % 3)


def good_names(max_name_bytes: int) -> list[str]:
    """Namespace names every store keeps apart, the longest of exactly `max_name_bytes` bytes."""
    return [
        "a",
        "A",
        " ",
        "_x",
        "a/b",
        "counter/room%201",
        "\x01\x7f",
        "a\u0301",  # "á" decomposed, a name of its own ...
        "\u00e1",  # ... and composed
        "\U0001f600",
        "x" * max_name_bytes,
        "\u00e9" * (max_name_bytes // 2) + "x" * (max_name_bytes % 2),
        incompressible_name(max_name_bytes),
    ]


def bad_names(max_name_bytes: int) -> list[tuple[object, type[Exception]]]:
    """Namespace names outside the contract, with the error each is refused with."""
    return [
        ("", InvalidArgument),
        ("a\x00b", InvalidArgument),
        ("a\udcffb", InvalidArgument),  # a lone surrogate: no UTF-8 form
        (b"bytes", InvalidArgument),
        (42, InvalidArgument),
        (None, InvalidArgument),
        ("x" * (max_name_bytes + 1), NameTooLarge),
        ("\u00e9" * (max_name_bytes // 2) + "xx"[: max_name_bytes % 2 + 1], NameTooLarge),
        (incompressible_name(max(2800, max_name_bytes + 1)), NameTooLarge),
    ]


@clause(
    "every str of 1 to max_name_bytes UTF-8 bytes without NUL names a namespace of its own: "
    "names differing in any code point (composed or not) are different namespaces"
)
def namespace_names_are_kept_apart(t: Trial) -> None:
    store = t.store()
    max_name_bytes = boundary(t, t.handle(store, "first"), "max_name_bytes").max_name_bytes
    names = good_names(max_name_bytes)
    handles = [t.handle(store, name) for name in names]
    at_least(t.limits(handles[0]), max_batch_bytes=2, max_storage_bytes=2)
    for n, kv in enumerate(handles):  # one byte each: any key and value limit takes them
        kv.put({b"n": bytes([n])})
    for n, (name, kv) in enumerate(zip(names, handles, strict=True)):
        t.expect(
            kv.get([b"n"]),
            [bytes([n])],
            f"the namespace {name[:16]!r} ({len(name.encode())} bytes) holds only what was "
            "written to it",
        )


@clause(
    "store.namespace(name) refuses a name that is not a non-empty str, holds NUL, has no UTF-8 "
    "form (InvalidArgument), or is over max_name_bytes (NameTooLarge)"
)
def a_namespace_name_outside_the_contract_is_refused(t: Trial) -> None:
    store = t.store()
    max_name_bytes = boundary(t, t.handle(store, "existing"), "max_name_bytes").max_name_bytes
    for name, error in bad_names(max_name_bytes):
        shown = repr(name)
        if isinstance(name, str) and len(name) > 16:
            shown = f"{name[:16]!r}... ({len(name)} chars)"
        with t.raises(
            error, requires=f"store.namespace({shown}) raises {error.__name__}"
        ) as caught:
            t.handle(store, name)
        t.check(
            "name" in str(caught[0]),
            f"the {error.__name__} of store.namespace({shown}) says it is the name",
            caught[0],
        )
        if isinstance(name, str) and error is NameTooLarge:
            size = len(name.encode())
            what = f"store.namespace({shown}) of {size} UTF-8 bytes"
            limit_error(t, caught[0], NameTooLarge, size, max_name_bytes, what)


@clause(
    "a store made with limits= refuses a namespace name over its max_name_bytes, in UTF-8 bytes"
)
def a_store_applies_the_name_limit_it_was_opened_with(t: Trial) -> None:
    store = t.store(max_name_bytes=8)
    t.handle(store, "x" * 8)
    t.handle(store, "\u00e9" * 4)
    for name in ("x" * 9, "\u00e9" * 4 + "x"):
        with t.raises(
            NameTooLarge, requires=f"with max_name_bytes=8, namespace({name!r}) raises"
        ) as caught:
            t.handle(store, name)
        limit_error(t, caught[0], NameTooLarge, 9, 8, f"namespace({name!r}) of 9 UTF-8 bytes")
