"""One live actor instance and its parts: its start (`startup`), the calls it serves (`calls`),
its proof that it still owns the actor (`owner_check`), the lease entry it keeps
(`lease_keeper`), its due schedules (`schedule_dispatch`), its run handler (`run_handler`) and its
stop (`stopping`); where it is in its life and how it stops (`phase`), and the protocols across
which the parts see what holds them (`instance_ports`). `ActorInstance` (`instance`) creates the
parts and is the one object the registry, `ctx`, the queue, the schedules and the workflow runner
hold."""
