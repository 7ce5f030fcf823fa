"""`mftk inspect-ckpt` (not built yet: its issue replaces this placeholder)."""
from __future__ import annotations

from mftk.errors import NotBuiltError

CONTEXT_SETTINGS = {"allow_extra_args": True, "ignore_unknown_options": True}


def inspect_ckpt() -> None:
    """Not built yet in this version of mftk."""
    raise NotBuiltError(message="'mftk inspect-ckpt' is not built yet in this version of mftk.",
                        hint="see the README for the commands available now")
