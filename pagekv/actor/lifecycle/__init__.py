"""One live actor instance and its parts: its start (`startup`), the calls it serves (`instance`,
`in_flight`), its proof that it still owns the actor (`owner_check`), the lease entry it keeps
(`lease_keeper`), its due schedules (`schedule_dispatch`), its run handler (`run_handler`) and its
stop (`stopping`). `ActorInstance` creates the parts and is the one object the registry, `ctx`,
the queue, the schedules and the workflow runner hold."""
