"""The server's URLs, one module per surface, each exporting its `ROUTES` for `app.py`:

    gateway.py         actions, create, destroy and queue messages: `/actors/{name}...`
    raw_http.py        an actor's own HTTP handler: `/actors/{name}/request/{path}`
    sockets.py         an actor's connections over WebSocket: `/actors/{name}/connect`
    inspector.py       the inspector API: `/inspect...`
    inspector_page.py  the inspector as a web page (`/`, `/ui/...`; its files in `ui_assets/`)

`/health`, `/metrics` and `/cluster/member` are the app's own (`app.py`).
"""
