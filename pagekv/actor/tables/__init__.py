"""The internal tables: the runtime's own `_pagekv_*` tables inside each actor's database (state,
queue, schedules, workflow history, realtime connections). `schema` creates them, versions and
migrates them and reserves their prefix; `sql` holds every statement on their rows and returns
them typed. Documented in docs/FORMAT.md, since export, import and upgrades depend on them."""
