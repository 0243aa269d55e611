"""Several servers on one store, each owning some of its actors, as one service:

advertise.py    the address a process gives the others, and the check that it reaches it
peer_auth.py    the shared cluster secret: forwarded calls and their answers signed (HMAC)
forward.py      a call that arrived here, sent on to the server that owns its actor
owner_calls.py  an actor's `ctx.client` calls and connections to actors another server owns
"""
