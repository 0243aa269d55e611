"""`pagekv.server`'s names, each loaded from its module on first use."""

import pagekv.server


def test_every_export_resolves() -> None:
    for name in pagekv.server.__all__:
        assert getattr(pagekv.server, name) is not None, name
