"""`pagekv serve` as operating-system processes:

launch.py         one process: settings, store, listening sockets, then uvicorn until a signal
run.py            the app under uvicorn in the current event loop, with a drain on signals
workers.py        `--workers N`: a supervisor and N worker processes sharing one port
loader.py         `app.py[:registry]`: the registry a command names
logs.py           the request id of every record, and the `text` and `json` log formats
http_protocol.py  uvicorn's HTTP protocol with a deadline for each request's headers
"""
