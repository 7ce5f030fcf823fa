"""Files mftk writes for users: whole or not at all (a temp file beside the target, renamed into place)."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from mftk.errors import InputError


def publish(tmp: str, path: Path) -> None:
    """Give a finished temp file normal permissions (mkstemp makes it 0600) and rename it into place."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, path)


def write_atomic(path: Path, text: str) -> None:
    """Write to a temp file beside `path` and rename it into place: never a half-written export."""
    path = Path(path)
    if path.parent and not path.parent.exists():
        raise InputError(message=f"cannot write {path}: directory {path.parent} does not exist", path=str(path),
                         hint=f"create it first: mkdir -p {path.parent}")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
        publish(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
