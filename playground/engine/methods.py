"""Every method module, imported once so that each registers itself (see :mod:`.registry`)."""

from . import eagle  # noqa: F401  (registers "eagle")
