"""Realtime connections: clients attached to an actor over a socket (state, subscriptions,
events), the process's hub of them, which outlives instances, and the leases kept for sleeping
actors whose sockets this process holds."""
