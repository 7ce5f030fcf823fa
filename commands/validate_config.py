"""`mftk validate-config` (not built yet: its issue replaces this placeholder)."""
from __future__ import annotations

from mftk.errors import NotBuiltError

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def validate_config() -> None:
    """Not built yet in this version of mftk."""
    raise NotBuiltError(message="'mftk validate-config' is not built yet in this version of mftk.",
                        hint="see the README for the commands available now")
