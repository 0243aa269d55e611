"""The internal tables: the runtime's own `_pagekv_*` tables inside each actor's database (state,
queue, schedules, workflow history), their schema version and migrations. Documented in
docs/FORMAT.md, since export, import and upgrades depend on them."""
