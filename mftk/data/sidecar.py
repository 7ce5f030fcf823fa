"""``<prefix>.mftk.json``: what mftk records next to each `.idx`/`.bin` pair it writes.

Two facts the pair itself cannot give cheaply, written once by the builder (`mftk.data.indexed`):

- the tokenizer's vocabulary size and the largest token id in the `.bin`, so `validate-config` and the
  loader can compare them with ``model.vocab_size`` without reading every token (an id past the embedding
  table is otherwise a kernel error deep in the first step);
- a fingerprint of each file (its size and a hash of 17 evenly spaced 256-byte windows), so a `.bin` from
  another corpus of the very same size — which the `.idx` length check cannot tell apart — is refused
  naming both files instead of training on samples cut in the wrong places.

Pairs written by other tools (Megatron, MindSpore Transformers) have no sidecar: those checks are skipped
for them. A sidecar that does not describe its `.idx` any more (the `.idx` was replaced) is refused, since its
vocabulary facts would be another pair's.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from mftk.errors import DataFormatError

SUFFIX = ".mftk.json"
FORMAT = "mftk-indexed-sidecar"
VERSION = 1
WINDOWS = 17
WINDOW_BYTES = 256


def sidecar_path(path_prefix: str | os.PathLike) -> Path:
    return Path(os.fspath(path_prefix) + SUFFIX)


def fingerprint(data: Any) -> str:
    """Size and sampled content of a file's bytes (a memory map or bytes): cheap for any size."""
    n = len(data)
    h = hashlib.blake2b(digest_size=16)
    h.update(n.to_bytes(8, "little"))
    for k in range(WINDOWS):
        start = (n - WINDOW_BYTES) * k // (WINDOWS - 1) if n > WINDOW_BYTES else 0
        h.update(bytes(data[start:start + WINDOW_BYTES]))
    return h.hexdigest()


def fingerprint_file(path: Path) -> str:
    """`fingerprint` of a file read window by window (no map)."""
    n = path.stat().st_size
    h = hashlib.blake2b(digest_size=16)
    h.update(n.to_bytes(8, "little"))
    with open(path, "rb") as f:
        for k in range(WINDOWS):
            f.seek((n - WINDOW_BYTES) * k // (WINDOWS - 1) if n > WINDOW_BYTES else 0)
            h.update(f.read(WINDOW_BYTES))
    return h.hexdigest()


def write(path_prefix: str | os.PathLike, *, vocab_size: int | None, max_id: int | None) -> None:
    """Record the facts of the (complete) pair at ``path_prefix``; written atomically."""
    prefix = os.fspath(path_prefix)
    data = {"format": FORMAT, "version": VERSION, "vocab_size": vocab_size, "max_id": max_id,
            "idx": fingerprint_file(Path(prefix + ".idx")), "bin": fingerprint_file(Path(prefix + ".bin"))}
    target = sidecar_path(prefix)
    tmp = target.with_name(target.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def remove(path_prefix: str | os.PathLike) -> None:
    sidecar_path(path_prefix).unlink(missing_ok=True)


def read_checked(path_prefix: str | os.PathLike, idx: Any, bin_: Any) -> dict | None:
    """The sidecar's facts once its fingerprints match the mapped ``idx`` and ``bin_`` bytes; None without one.

    A `.bin` that does not match is a `DataFormatError` naming both files (the pair is mismatched); a sidecar
    that does not match its `.idx`, or that cannot be read, names the sidecar."""
    prefix = os.fspath(path_prefix)
    path = sidecar_path(prefix)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad_sidecar(path, f"cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except ValueError:
        raise _bad_sidecar(path, "is not JSON") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("idx"), str) \
            or not isinstance(data.get("bin"), str):
        raise _bad_sidecar(path, "is not an mftk data sidecar")
    if fingerprint(idx) != data["idx"]:
        raise _bad_sidecar(path, f"describes another {Path(prefix).name}.idx (the index was replaced after "
                                 "mftk wrote the pair)")
    if fingerprint(bin_) != data["bin"]:
        raise DataFormatError(
            message=f"{prefix}.bin does not belong with {prefix}.idx: the tokens differ from those the index was "
                    f"written with ({path.name} records both), although the sizes agree — a .bin from another "
                    "corpus or another document order?",
            path=f"{prefix}.bin", expected=data["bin"], found=fingerprint(bin_),
            hint="regenerate the pair with 'mftk preprocess' (or restore the .bin written with this .idx)")
    return data


def _bad_sidecar(path: Path, what: str) -> DataFormatError:
    return DataFormatError(message=f"{path} {what}", path=str(path),
                           hint="regenerate the pair with 'mftk preprocess', or delete the sidecar (mftk then "
                                "skips the vocabulary and pairing checks for this pair)")
