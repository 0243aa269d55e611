"""The registry: actor definitions, live instances, addressing by (name, key), idle sleep.

Which actors exist is recorded in a registry namespace of the same KV store, so several
registries (processes, hosts) sharing a store agree on it; each actor's data lives in its own
namespace, `actor_id = name/quoted-key`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

import anyio
import cbor2
from anyio.abc import TaskGroup

from pagekv.actor.definition import ActorDefinition
from pagekv.actor.errors import (
    ActorExists,
    ActorNotFound,
    ActorStopped,
    ActorTakenOver,
    UnknownActor,
)
from pagekv.actor.index import (
    ActorRecord,
    actor_id,
    delete_records_up_to,
    encode_record,
    record_key,
    records_of,
)
from pagekv.actor.instance import ActorInstance, NotServing
from pagekv.actor.queue import prepare_message
from pagekv.actor.workflow.handle import WorkflowHandle
from pagekv.kv import DEFAULT_URL, KeyTooLarge, KvStore, open_kv, prefix_end

REGISTRY_NAMESPACE = "pagekv-registry"
_IDLE_CHECK_S = 0.05
_WAKE_POLL_S = 0.5
LEASE_S = 10.0
"""Default lease of a live instance on its wake entry (see `ActorInstance._wake_time`): other
registries leave the actor alone while the lease runs, and the owner renews it with half of it
to go. It is how late, at most, a schedule of an actor whose process died runs elsewhere; it
must exceed twice the clock difference between hosts."""
_CALL_ATTEMPTS = 3
"""Wakes a call may take when an instance stops before the call reaches it (e.g. its run
handler crashed right after the wake)."""
_WAKE = b"wake/"
_DUE = b"due/"
log = logging.getLogger("pagekv.actor")


class Registry:
    """Serves `actors` on the store `kv`. `lease` (seconds) bounds how late a schedule of
    an actor whose process died runs on another registry of the store; see `LEASE_S`."""

    def __init__(
        self,
        actors: Iterable[ActorDefinition],
        kv: str | KvStore = DEFAULT_URL,
        *,
        lease: float = LEASE_S,
        address: str | None = None,
    ) -> None:
        if lease <= 0:
            raise ValueError(f"lease must be > 0 seconds, got {lease}")
        self.lease = lease
        self.address = address
        """Where other registries of the store forward calls for the actors this one owns."""
        self.id = uuid.uuid4().hex
        """This registry's identity in the store's ownership entries; new on every start."""
        self.definitions: dict[str, ActorDefinition] = {}
        for definition in actors:
            if definition.name in self.definitions:
                raise ValueError(f"two actors are named {definition.name!r}")
            self.definitions[definition.name] = definition
        self._kv = kv
        self.store: KvStore
        self._instances: dict[str, ActorInstance] = {}
        self._locks: dict[str, anyio.Lock] = {}
        self._wake_lock = threading.Lock()
        self._tg: TaskGroup | None = None
        self.counters: Counter[str] = Counter()
        """Wakes, sleeps, destroys, crashes, takeovers, actions, and startup phase times."""

    @asynccontextmanager
    async def run(self) -> AsyncIterator[Client]:
        """Serve the actors while the block runs; put every live instance to sleep at the end."""
        self.id = uuid.uuid4().hex
        self.store = open_kv(self._kv) if isinstance(self._kv, str) else self._kv
        self._index = self.store.namespace(REGISTRY_NAMESPACE)
        try:
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._housekeeping)
                try:
                    yield Client(self)
                finally:
                    with anyio.CancelScope(shield=True):
                        for instance in list(self._instances.values()):
                            await instance.stop(instance.stop_reason())
                    tg.cancel_scope.cancel()
        finally:
            self._tg = None
            if isinstance(self._kv, str):
                self.store.close()

    def spawn(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> None:
        """Run `fn(*args)` in the background; its failure is logged, never the registry's."""
        assert self._tg is not None, "the registry is not running"

        async def guarded() -> None:
            try:
                await fn(*args)
            except Exception:
                log.exception("background task %s failed", getattr(fn, "__qualname__", fn))

        self._tg.start_soon(guarded)

    @property
    def running(self) -> bool:
        """Serving: inside `run()` and its background loop alive."""
        return self._tg is not None

    async def _housekeeping(self) -> None:
        """Put idle instances to sleep, dispatch due schedules, wake sleeping actors on time.

        A round that fails (the store unreachable for a moment, say) is logged and counted
        (`housekeeping_errors`), and the next round tries again: the loop outlives any error,
        since without it no actor would sleep or wake on time again.
        """
        indexed = False
        last_poll = 0.0
        while True:
            await anyio.sleep(_IDLE_CHECK_S)
            poll = time.monotonic() - last_poll >= _WAKE_POLL_S
            if poll:
                last_poll = time.monotonic()
            try:
                self._tend_instances(time.time())
                if poll:
                    if not indexed:
                        await anyio.to_thread.run_sync(self._index_due_times)
                        indexed = True
                    for name, key in await self._due_sleepers(time.time()):
                        self.spawn(self._wake, name, key)
            except Exception:
                self.counters["housekeeping_errors"] += 1
                log.exception("housekeeping failed; the next round tries again")

    def _tend_instances(self, now: float) -> None:
        """Dispatch the due schedules of live instances, renew their wake leases, and put idle
        ones to sleep."""
        for instance in list(self._instances.values()):
            if instance.next_due is not None and instance.next_due <= now:
                self.spawn(instance.dispatch_due)
            if instance.wake_lapsing(now):
                self.spawn(instance.publish_wake)
            if instance.sleepy():
                self.spawn(instance.sleep_if_idle)

    async def _due_sleepers(self, now: float) -> list[tuple[str, str]]:
        """Actors not live here with a wake entry that is due.

        Reads only the due entries up to `now`, so a poll costs the same with ten sleeping
        actors or a million. A due entry counts only if the wake entry it names still holds that
        time. One whose wake entry is gone (a newer generation removed it, or the actor was
        destroyed) is deleted: only a stale writer of that generation could write the wake entry
        again, and the newer generation's own entries decide the wake then.
        """
        rows = await anyio.to_thread.run_sync(
            lambda: self._index.list(
                start=_DUE, end=_due_key(now, _WAKE + b"\xff"), limit=_MAX_WAKES
            )
        )
        due: dict[str, tuple[str, str]] = {}
        keys = [key for key, _ in rows]
        step = self._index.limits.max_batch_entries
        for part in (keys[i : i + step] for i in range(0, len(keys), step)):
            values = await anyio.to_thread.run_sync(self._index.get, list(map(_wake_key, part)))
            orphans = []
            for due_key, value in zip(part, values, strict=True):
                if value is None:
                    orphans.append(due_key)
                    continue
                entry = cbor2.loads(value)
                if entry["due"] is None or _due_key(entry["due"], _wake_key(due_key)) != due_key:
                    continue  # a later time replaced it; the write that did removes it
                aid = actor_id(entry["name"], entry["key"])
                if aid not in self._instances:
                    due[aid] = (entry["name"], entry["key"])
            if orphans:
                await anyio.to_thread.run_sync(self._index.delete, orphans)
        return list(due.values())

    def _index_due_times(self) -> None:
        """Give every wake entry with a due time its due entry (at start: the index may have been
        written by a pagekv that kept no due entries, which then read every wake entry per poll)."""
        present = {key for key, _ in self._index.list(prefix=_DUE)}
        wakes = self._index.list(prefix=_WAKE)
        missing = [(key, b"") for key in _due_keys(wakes) if key not in present]
        step = self._index.limits.max_batch_entries
        for i in range(0, len(missing), step):
            self._index.put(missing[i : i + step])

    async def _wake(self, name: str, key: str) -> None:
        """Wake an actor the poll found due, if it still is (see `_still_due`)."""
        try:
            if await anyio.to_thread.run_sync(self._still_due, actor_id(name, key), time.time()):
                await self.instance(name, key, create=False)
        except ActorNotFound:
            log.info("actor %s/%s was destroyed; its wake entries are removed", name, key)
        except Exception:
            log.exception("could not wake actor %s/%s for its schedule", name, key)

    def _still_due(self, aid: str, now: float) -> bool:
        """Whether the newest generation's wake entry of `aid` is due at `now`.

        Only the newest generation's entry decides: an older one is what a stale instance
        wrote after a newer one took the actor over (a lease it renewed, or its time at
        sleep), and it must not take the actor from the newer owner; it is deleted here with its
        due entry. Read again just before the takeover, so an owner that took the actor, or
        renewed its lease, since the poll read the index is left alone.
        """
        entries = self._index.list(prefix=_wake_prefix(aid))
        if not entries:
            return False
        *older, (_, newest) = entries
        if older:
            self._index.write(delete=[*_due_keys(older), *(key for key, _ in older)])
        due = cbor2.loads(newest)["due"]
        return due is not None and due <= now

    async def write_wake(self, instance: ActorInstance, due: float | None) -> None:
        """Record `instance`'s next wake time under its own generation.

        Entries are per generation, so a stale instance that writes late can never replace a
        newer instance's wake time (no compare-and-set needed), and a poll heeds only the newest
        generation's entry (`_still_due`). Older generations' entries are removed. The due entries
        of this and older generations' wake times go in the same batch as the new one arrives, so
        no due entry outlives its time unless a newer generation wrote it (the poll never has to
        guess what is stale).
        """
        prefix = _wake_prefix(instance.actor_id)
        generation = instance.ctx.db.database.generation
        entry = cbor2.dumps({"due": due, "name": instance.definition.name, "key": instance.key})
        wake_key = prefix + b"%020d" % generation
        puts = {wake_key: entry}
        if due is not None:
            puts[_due_key(due, wake_key)] = b""

        def write() -> None:
            with self._wake_lock:  # the list and the write below see no other writer of ours
                older = _due_keys(self._index.list(start=prefix, end=prefix_end(wake_key)))
                self._index.write(put=puts, delete=[k for k in older if k not in puts])
                self._index.delete_range(prefix, wake_key)

        await anyio.to_thread.run_sync(write)

    # -- addressing -------------------------------------------------------------------------

    def definition(self, name: str) -> ActorDefinition:
        try:
            return self.definitions[name]
        except KeyError:
            known = ", ".join(sorted(self.definitions)) or "none"
            raise UnknownActor(f"no actor named {name!r} (known: {known})") from None

    async def exists(self, name: str, key: str) -> bool:
        """Whether the index records the actor (see `index.py`: the data decides at a wake)."""
        aid = actor_id(name, key)
        return bool(await anyio.to_thread.run_sync(records_of, self._index, aid))

    @asynccontextmanager
    async def _exclusive(self, aid: str) -> AsyncIterator[None]:
        """The actor's lock in this registry: wakes, creates and destroys of one actor run one
        at a time, so in one process they are linearizable (across processes, `index.py`)."""
        try:
            async with self._locks.setdefault(aid, anyio.Lock()):
                yield
        finally:
            self._drop_unused_lock(aid)

    async def instance(
        self, name: str, key: str, *, create: bool, must_be_new: bool = False, input: Any = None
    ) -> ActorInstance:
        """The live instance of (name, key), woken (taken over) if needed."""
        definition = self.definition(name)
        aid = actor_id(name, key)
        self._check_fits(aid)
        async with self._exclusive(aid):
            return await self._instance(definition, key, create, must_be_new, input)

    async def _instance(
        self, definition: ActorDefinition, key: str, create: bool, must_be_new: bool, input: Any
    ) -> ActorInstance:
        """`instance`, the actor's lock held."""
        name, aid = definition.name, actor_id(definition.name, key)
        live = self._instances.get(aid)
        if live is not None:
            if live.serving():
                if must_be_new:  # refused without touching the live instance
                    raise ActorExists(f"actor {name!r} with key {key!r} already exists")
                return live
            await live.stop(live.stop_reason())
        recorded = await anyio.to_thread.run_sync(records_of, self._index, aid)
        if recorded and must_be_new:
            raise ActorExists(f"actor {name!r} with key {key!r} already exists")
        if not recorded and not create:
            raise ActorNotFound(f"no actor {name!r} with key {key!r}")
        namespace = await anyio.to_thread.run_sync(self.store.namespace, aid)
        instance = ActorInstance(self, definition, aid, key, namespace)
        try:
            await instance.start(input, create=create)
        except ActorNotFound:  # recorded, but destroyed: its destroyer died before the index
            await anyio.to_thread.run_sync(self._erase, aid, instance.generation)
            raise
        self.counters["wakes"] += 1
        for phase, ms in instance.metrics.items():
            self.counters[f"{phase}_total"] += ms
        if instance.created or not recorded:
            await anyio.to_thread.run_sync(self._record, instance, recorded)
        self._instances[aid] = instance
        return instance

    def _record(self, instance: ActorInstance, recorded: list[ActorRecord]) -> None:
        """Record an actor this instance created (or found without a record), before it serves
        anything; records of older generations describe data that is gone if it created it."""
        aid, generation = instance.actor_id, instance.generation
        value = encode_record(instance.definition.name, instance.key, generation)
        stale = [record_key(aid, r.generation) for r in recorded if instance.created]
        self._index.write(put={record_key(aid, generation): value}, delete=stale)

    def _check_fits(self, aid: str) -> None:
        """Refuse an actor whose registry entries would not fit the store's keys before anything
        is written: found at the wake write, after the takeover, it left a namespace behind that
        no index entry names. The longest entry is the due entry (its numbers have fixed
        widths)."""
        longest = len(_due_key(0.0, _wake_prefix(aid) + b"%020d" % 0))
        limit = self._index.limits.max_key_bytes
        if longest > limit:
            raise KeyTooLarge(f"registry entry of {longest} bytes for this key", longest, limit)

    def _drop_unused_lock(self, aid: str) -> None:
        """Forget the lock of an actor that is not awake here and that no call waits for, so
        the locks do not grow with every key ever called."""
        lock = self._locks.get(aid)
        if (
            lock is not None
            and aid not in self._instances
            and not lock.locked()
            and not lock.statistics().tasks_waiting
        ):
            del self._locks[aid]

    async def forget(self, instance: ActorInstance, *, how: str, destroyed: bool) -> None:
        if self._instances.get(instance.actor_id) is instance:
            del self._instances[instance.actor_id]
            self._drop_unused_lock(instance.actor_id)
        self.counters[{"sleep": "sleeps", "destroy": "destroys"}.get(how, "crashes")] += 1
        if destroyed:
            await anyio.to_thread.run_sync(self._erase, instance.actor_id, instance.generation)

    def _erase(self, aid: str, generation: int) -> None:
        """Remove what the index holds of an actor whose data is gone, as of `generation`: its
        records and wake entries of that generation and older ones. Newer ones belong to an
        actor created again since (see `index.py`), and stay."""
        prefix = _wake_prefix(aid)
        end = prefix + b"%020d" % (generation + 1)
        dues = _due_keys(self._index.list(start=prefix, end=end))
        self._index.delete_range(prefix, end)
        if dues:
            self._index.delete(dues)
        delete_records_up_to(self._index, aid, generation)

    def live(self) -> list[ActorInstance]:
        return list(self._instances.values())

    def metrics(self) -> dict[str, float]:
        """Counters since the registry started, plus the number of live actors."""
        return {**self.counters, "live": len(self._instances)}

    async def call(
        self,
        name: str,
        key: str,
        action: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        create: bool,
        input: Any = None,
    ) -> Any:
        """Call an action, waking (or creating) the actor; an unknown action, or arguments
        that do not bind to it, are refused before the actor is woken or created."""
        fn = self.definition(name).resolve(action, args, kwargs)
        for _ in range(_CALL_ATTEMPTS - 1):
            instance = await self.instance(name, key, create=create, input=input)
            try:
                return await instance.call(fn, args, kwargs)
            except NotServing:
                continue
        instance = await self.instance(name, key, create=create, input=input)
        return await instance.call(fn, args, kwargs)

    async def destroy(self, name: str, key: str) -> None:
        """Destroy an actor, under its lock: a wake or create of it in this registry waits, and
        finds it destroyed. An instance that was already stopping another way (going to sleep)
        is woken again to be destroyed, and one taken over elsewhere meanwhile is taken back,
        up to `_CALL_ATTEMPTS` times."""
        definition = self.definition(name)
        aid = actor_id(name, key)
        async with self._exclusive(aid):
            for attempt in range(_CALL_ATTEMPTS):
                instance = await self._instance(definition, key, False, False, None)
                try:
                    if await instance.stop("destroy") == "destroy":
                        return
                except ActorTakenOver:
                    if attempt == _CALL_ATTEMPTS - 1:
                        raise
        raise ActorStopped(f"actor {aid} kept stopping another way; not destroyed")

    async def send(
        self, name: str, key: str, queue: str, body: Any, *, create: bool, input: Any = None
    ) -> int:
        """Enqueue a message for an actor, waking it if it sleeps; a message the queue refuses
        is refused before the actor is woken or created. An instance found taken over by
        another process hands the message to a fresh one, as a call does."""
        message = prepare_message(queue, body)
        for attempt in range(_CALL_ATTEMPTS):
            instance = await self.instance(name, key, create=create, input=input)
            try:
                return await instance.send(message)
            except NotServing:
                continue
            except ActorTakenOver:  # the append is one commit, refused by the fence: retry
                if attempt == _CALL_ATTEMPTS - 1:
                    raise
        raise ActorStopped(f"actor {actor_id(name, key)} kept stopping; message not sent")


def _wake_prefix(aid: str) -> bytes:
    return _WAKE + aid.encode() + b"/"


_DUE_DIGITS = 16
_MAX_WAKES = 1000
"""Due entries read per poll; the next poll, 0.5 s later, reads on."""


def _due_key(due: float, wake_key: bytes) -> bytes:
    """The due entry of wake entry `wake/<actor id>/<generation>` due at `due`:
    `due/<milliseconds>/<actor id>/<generation>`. Due entries sort by time, so a poll reads only
    the due ones. Rounded down: a wake can come up to 1 ms early, which is harmless (the actor
    runs only the schedules that are due)."""
    millis = max(0, int(due * 1000))
    return b"%s%0*d/%s" % (_DUE, _DUE_DIGITS, millis, wake_key[len(_WAKE) :])


def _due_keys(wakes: Iterable[tuple[bytes, bytes]]) -> list[bytes]:
    """The due entries that wake entries `(key, value)` call for."""
    dues = ((key, cbor2.loads(value)["due"]) for key, value in wakes)
    return [_due_key(due, key) for key, due in dues if due is not None]


def _wake_key(due_key: bytes) -> bytes:
    return _WAKE + due_key[len(_DUE) + _DUE_DIGITS + 1 :]


class ActorHandle:
    """Calls actions of one actor by name; re-resolves the actor on every call."""

    def __init__(self, registry: Registry, name: str, key: str, *, create: bool, input: Any):
        self._registry = registry
        self.name = name
        self.key = key
        self._create = create
        self._input = input

    async def call(self, action: str, *args: Any, **kwargs: Any) -> Any:
        return await self._registry.call(
            self.name, self.key, action, args, kwargs, create=self._create, input=self._input
        )

    async def send(self, queue: str, body: Any) -> int:
        """Append a message to the actor's queue `queue`; returns the message id."""
        return await self._registry.send(
            self.name, self.key, queue, body, create=self._create, input=self._input
        )

    @property
    def workflow(self) -> WorkflowHandle:
        """The actor's durable workflow (its run handler)."""
        return WorkflowHandle(
            self._registry, self.name, self.key, create=self._create, input=self._input
        )

    def __getattr__(self, action: str) -> Callable[..., Awaitable[Any]]:
        if action.startswith("_"):
            raise AttributeError(action)

        async def invoke(*args: Any, **kwargs: Any) -> Any:
            return await self.call(action, *args, **kwargs)

        return invoke


class Client:
    """In-process client of a running registry."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def get(self, name: str, key: str) -> ActorHandle:
        self.registry.definition(name)
        return ActorHandle(self.registry, name, key, create=False, input=None)

    def get_or_create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        self.registry.definition(name)
        return ActorHandle(self.registry, name, key, create=True, input=input)

    async def create(self, name: str, key: str, *, input: Any = None) -> ActorHandle:
        await self.registry.instance(name, key, create=True, must_be_new=True, input=input)
        return ActorHandle(self.registry, name, key, create=False, input=None)

    async def destroy(self, name: str, key: str) -> None:
        await self.registry.destroy(name, key)
