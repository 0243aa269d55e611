"""The directory: the registry namespace every registry of a store shares. It holds which actors
exist (`records`), who owns each awake actor and when each sleeping one must wake (`leases`),
and the entries a tool writes for an actor it made (`enroll`). Its keys are documented in
docs/FORMAT.md, since export, import and copy read and write them."""
