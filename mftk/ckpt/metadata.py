"""``metadata.json`` for world > 1 (§3.4): global shapes, shard layout and which file holds each shard.

Shards are numbered by one linear index over the fragment grid (``global_offset`` is
``[index]``, not an element offset). We number them row-major over ``axis_fragmentations``
([I]: the reference's own numbering is computed in code we could not run). File names read
from the file are plain names inside the step dir; anything with a path separator, ``..``
or an absolute path is rejected and never opened.
"""
from __future__ import annotations

import ast
import math
import os
from pathlib import Path
from typing import Any, Mapping

import attrs
import numpy as np

from mftk.ckpt.layout import METADATA, shard_file_name
from mftk.errors import CheckpointError
from mftk.files import LARGE_JSON_LIMIT, read_json


@attrs.frozen
class ShardedTensor:
    """How the engine split one tensor: ``holders`` maps each rank holding it to its shard index."""

    global_shape: tuple[int, ...]
    axis_fragmentations: tuple[int, ...]
    holders: Mapping[int, int]
    dtype: str = "Float32"  # str(mindspore dtype), e.g. "BFloat16"
    layout: dict[str, Any] | None = None  # passed through verbatim (key order matters to the reference)
    replica_id: Any = 0

    @property
    def local_shape(self) -> tuple[int, ...]:
        return tuple(g // f for g, f in zip(self.global_shape, self.axis_fragmentations))


@attrs.frozen
class StorageEntry:
    file_name: str
    storage_rank: int
    rank_group: tuple[int, ...]


@attrs.frozen
class GlobalTensor:
    """One tensor as metadata.json describes it."""

    name: str
    dtype: str
    global_shape: tuple[int, ...]
    axis_fragmentations: tuple[int, ...]
    chunks: tuple[tuple[int, tuple[int, ...]], ...]  # (shard index, local shape), as listed
    storage: Mapping[int, tuple[StorageEntry, ...]]  # shard index -> where it is stored

    @property
    def shard_count(self) -> int:
        return math.prod(self.axis_fragmentations)


def build_metadata(model: Mapping[str, ShardedTensor], optimizer: Mapping[str, ShardedTensor], *,
                   world: int, prefix: str | None = "checkpoint") -> dict[str, Any]:
    """The JSON object, in the reference's key order; optimizer states point at ``-opt-`` files."""
    sd: dict[str, Any] = {}
    storage: dict[str, Any] = {}
    for kind, tensors in (("model", model), ("opt", optimizer)):
        for name, t in tensors.items():
            _check_spec(name, t, world)
            shards = sorted(set(t.holders.values()))
            sd[name] = {
                "properties": {"dtype": t.dtype, "replica_id": t.replica_id,
                               "allow_shape_mismatch": False, "allow_to_save": True},
                "global_shape": list(t.global_shape), "axis_fragmentations": list(t.axis_fragmentations),
                "layout": t.layout,
                "chunk": [{"global_offset": [i], "local_shape": list(t.local_shape)} for i in shards],
            }
            for i in shards:
                group = sorted(r for r, s in t.holders.items() if s == i)
                storage[str((name, (i,)))] = [{"file_name": shard_file_name(kind, group[0], world, prefix),
                                               "storage_rank": group[0], "rank_group": group}]
    return {"state_dict_metadata": sd, "storage_data": storage}


def _check_spec(name: str, t: ShardedTensor, world: int) -> None:
    """Engine bugs, not user input: fail loudly before anything is written."""
    if len(t.global_shape) != len(t.axis_fragmentations):
        raise ValueError(f"{name}: {len(t.axis_fragmentations)} fragmentations for a {len(t.global_shape)}-d tensor")
    if any(f < 1 or g % f for g, f in zip(t.global_shape, t.axis_fragmentations)):
        raise ValueError(f"{name}: shape {t.global_shape} does not split evenly by {t.axis_fragmentations}")
    n = math.prod(t.axis_fragmentations)
    if any(not 0 <= r < world for r in t.holders) or set(t.holders.values()) != set(range(n)):
        raise ValueError(f"{name}: holders {dict(t.holders)} must use ranks < {world} and cover shards 0..{n - 1}")


def safe_file_name(name: Any) -> bool:
    """A plain file name inside the step dir: no separators, no '..', not absolute, not hidden."""
    return (isinstance(name, str) and name not in ("", ".", "..") and "/" not in name and "\\" not in name
            and not name.startswith(".") and not os.path.isabs(name) and "\x00" not in name)


def parse_metadata(obj: Any, path: str = METADATA) -> dict[str, GlobalTensor]:
    """Check the structure and every file name; one error listing every problem."""
    problems: list[str] = []
    if not isinstance(obj, dict) or not isinstance(obj.get("state_dict_metadata"), dict) \
            or not isinstance(obj.get("storage_data"), dict):
        raise CheckpointError(message=f"{path}: expected state_dict_metadata and storage_data objects", path=path)
    storage = _parse_storage(obj["storage_data"], problems)
    out: dict[str, GlobalTensor] = {}
    for name, entry in obj["state_dict_metadata"].items():
        t = _parse_tensor(name, entry, storage.get(name, {}), problems)
        if t is not None:
            out[name] = t
    for name in storage.keys() - obj["state_dict_metadata"].keys():
        problems.append(f"storage_data names {name!r}, which state_dict_metadata does not describe")
    if problems:
        raise CheckpointError(message=f"{path}: {len(problems)} problem(s)", path=path, problems=problems,
                              hint="metadata.json is damaged or was not written by a compatible tool")
    return out


def _parse_storage(raw: dict[str, Any], problems: list[str]) -> dict[str, dict[int, tuple[StorageEntry, ...]]]:
    out: dict[str, dict[int, tuple[StorageEntry, ...]]] = {}
    for key, entries in raw.items():
        try:  # keys are Python str((name, (index,))); literal_eval evaluates literals only, never code
            name, (index,) = ast.literal_eval(key)
            if not (isinstance(name, str) and isinstance(index, int)):
                raise ValueError(key)
        except Exception:  # noqa: BLE001 - any malformed key is one problem
            problems.append(f"storage_data key {key[:80]!r} is not ('name', (index,))")
            continue
        parsed = []
        for e in entries if isinstance(entries, list) else [None]:
            if not isinstance(e, dict) or not safe_file_name(e.get("file_name")):
                fn = e.get("file_name") if isinstance(e, dict) else e
                problems.append(f"{name} shard {index}: file name {fn!r} is not a plain file name in the "
                                "checkpoint dir (paths outside it are never followed)")
                continue
            parsed.append(StorageEntry(file_name=e["file_name"], storage_rank=int(e.get("storage_rank", -1)),
                                       rank_group=tuple(e.get("rank_group") or ())))
        if parsed:
            out.setdefault(name, {})[index] = tuple(parsed)
    return out


def _parse_tensor(name: str, e: Any, storage: dict[int, tuple[StorageEntry, ...]],
                  problems: list[str]) -> GlobalTensor | None:
    try:
        shape = tuple(int(d) for d in e["global_shape"])
        frag = tuple(int(f) for f in e["axis_fragmentations"])
        chunks = tuple((int(c["global_offset"][0]), tuple(int(d) for d in c["local_shape"])) for c in e["chunk"])
        dtype = str(e["properties"]["dtype"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        problems.append(f"{name}: malformed entry ({type(exc).__name__}: {exc})")
        return None
    return GlobalTensor(name=name, dtype=dtype, global_shape=shape, axis_fragmentations=frag,
                        chunks=chunks, storage=storage)


def coverage_problems(t: GlobalTensor) -> list[str]:
    """Shards must tile the global tensor exactly once, each with its storage."""
    out: list[str] = []
    if len(t.axis_fragmentations) != len(t.global_shape) or any(
            f < 1 or g % f for g, f in zip(t.global_shape, t.axis_fragmentations)):
        return [f"{t.name}: global shape {list(t.global_shape)} does not split by {list(t.axis_fragmentations)}"]
    local = tuple(g // f for g, f in zip(t.global_shape, t.axis_fragmentations))
    seen: dict[int, int] = {}
    for i, shape in t.chunks:
        seen[i] = seen.get(i, 0) + 1
        if shape != local:
            out.append(f"{t.name}: shard {i} local shape {list(shape)}, expected {list(local)}")
    n = t.shard_count
    if missing := sorted(set(range(n)) - seen.keys()):
        out.append(f"{t.name}: shards {missing[:10]} of {n} are not listed (tensor not fully covered)")
    if extra := sorted(i for i in seen if not 0 <= i < n):
        out.append(f"{t.name}: shard indices {extra[:10]} are outside 0..{n - 1}")
    if twice := sorted(i for i, c in seen.items() if c > 1):
        out.append(f"{t.name}: shards {twice[:10]} are listed more than once")
    if nostore := sorted(i for i in seen if i not in t.storage):
        out.append(f"{t.name}: shards {nostore[:10]} have no storage_data entry")
    return out


def shard_slices(index: int, global_shape: tuple[int, ...], frag: tuple[int, ...]) -> tuple[slice, ...]:
    """Where shard ``index`` (row-major over the fragment grid) sits in the global tensor."""
    coords = np.unravel_index(index, frag) if frag else ()
    local = [g // f for g, f in zip(global_shape, frag)]
    return tuple(slice(int(c) * n, (int(c) + 1) * n) for c, n in zip(coords, local))


def read_metadata(step_dir: str | os.PathLike) -> dict[str, GlobalTensor] | None:
    """The parsed metadata.json, or None for a single-card checkpoint (no file)."""
    path = Path(step_dir) / METADATA
    try:
        obj = read_json(path, limit=LARGE_JSON_LIMIT, error=CheckpointError, what=METADATA)
    except FileNotFoundError:
        return None
    return parse_metadata(obj, str(path))
