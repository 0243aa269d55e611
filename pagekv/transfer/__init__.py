"""Moving actors' data in and out of a store, offline: `export_actor` (an actor's database as a
plain SQLite file, from a snapshot), `import_actor` (an actor made from a SQLite file) and
`copy_store` (every actor and the registry's index into another store).

These are tools over the runtime, not part of it: they use the actor runtime's public pieces
(the directory, the internal tables, the VFS) and nothing in the runtime imports them.
"""

from pagekv.transfer.exporter import Exported, FileShared, export_actor, export_all
from pagekv.transfer.importer import (
    Imported,
    ImportRefused,
    ImportStopped,
    ManifestFileShared,
    SchemaTooNew,
    import_actor,
    import_all,
)
from pagekv.transfer.store_copy import (
    CopyMismatch,
    CopyProgress,
    CopyRefused,
    CopyResult,
    copy_store,
)

__all__ = [
    "CopyMismatch",
    "CopyProgress",
    "CopyRefused",
    "CopyResult",
    "Exported",
    "FileShared",
    "ImportRefused",
    "ImportStopped",
    "Imported",
    "ManifestFileShared",
    "SchemaTooNew",
    "copy_store",
    "export_actor",
    "export_all",
    "import_actor",
    "import_all",
]
