"""A memory store whose actor namespaces are wrapped in `FaultyKv` over `CountingKv`, so a test
can count an actor's KV writes in a clean run and then fail exactly one of them."""

from __future__ import annotations

from pagekv.actor.registry import REGISTRY_NAMESPACE
from pagekv.kv import ActorKv, CountingKv, FaultyKv, MemoryStore


class FaultyStore:
    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.faulty: dict[str, FaultyKv] = {}
        self.counting: dict[str, CountingKv] = {}

    def namespace(self, actor_id: str) -> ActorKv:
        kv = self.inner.namespace(actor_id)
        if actor_id == REGISTRY_NAMESPACE:
            return kv
        counting = self.counting.setdefault(actor_id, CountingKv(kv))
        self.faulty[actor_id] = self.faulty.get(actor_id) or FaultyKv(counting)
        return self.faulty[actor_id]

    def close(self) -> None:
        pass
