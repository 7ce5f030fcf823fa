"""Names on disk (reference §3.1) and how the checkpoint to load is located (§3.7).

```
<save_path>/latest_checkpointed_iteration.txt      decimal step, no trailing newline
<save_path>/iteration_00000100/common.json, metadata.json (world > 1),
    {prefix}-model-{rank:07d}-{world:07d}.safetensors, {prefix}-opt-....safetensors,
    mftk-state-{rank:07d}-{world:07d}.json          mftk's extra state (RNG, data position)
    mftk-config.json                                 mftk's resolved config of the run that saved it
```
Unlike the reference, a path that does not exist, a tracker that names a missing dir, or a
save root without a tracker is an error here, never a silent fresh start.
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import attrs

from mftk.errors import CheckpointError, InputError
from mftk.files import kind_of, read_text

TRACKER = "latest_checkpointed_iteration.txt"
COMMON = "common.json"
METADATA = "metadata.json"
RESOLVED_CONFIG = "mftk-config.json"  # the run's resolved config (mftk's; the reference ignores the file)
TRACKER_LIMIT = 4096  # a decimal step; anything longer is not a tracker
HF_INDEX = "model.safetensors.index.json"
HF_SINGLE = "model.safetensors"
KINDS = ("model", "opt")
# A temp step dir starts with "." so no glob for iteration_* (ours, the reference's) ever sees it.
TMP_PREFIX = ".tmp-"
_ITER_RE = re.compile(r"^iteration_(\d{8,})$")
_FILE_RE = re.compile(r"^(?:(?P<prefix>.*)-)?(?P<kind>model|opt)-(?P<rank>\d{7,})-(?P<world>\d{7,})\.safetensors$")
_STATE_RE = re.compile(r"^mftk-state-(?P<rank>\d{7,})-(?P<world>\d{7,})\.json$")


def iteration_dir_name(step: int) -> str:
    return f"iteration_{step:08d}"


def parse_iteration_dir_name(name: str) -> int | None:
    m = _ITER_RE.match(name)
    return int(m.group(1)) if m else None


def shard_file_name(kind: str, rank: int, world: int, prefix: str | None = "checkpoint") -> str:
    """``{prefix}-model-0000000-0000001.safetensors``; ``prefix=None`` (YAML ``null``) drops the prefix."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    base = f"{kind}-{rank:07d}-{world:07d}.safetensors"
    return f"{prefix}-{base}" if prefix else base


@attrs.frozen
class ShardFileName:
    prefix: str | None
    kind: str
    rank: int
    world: int


def parse_shard_file_name(name: str) -> ShardFileName | None:
    m = _FILE_RE.match(name)
    if not m:
        return None
    return ShardFileName(prefix=m.group("prefix"), kind=m.group("kind"),
                         rank=int(m.group("rank")), world=int(m.group("world")))


def state_file_name(rank: int, world: int) -> str:
    return f"mftk-state-{rank:07d}-{world:07d}.json"


def parse_state_file_name(name: str) -> tuple[int, int] | None:
    m = _STATE_RE.match(name)
    return (int(m.group("rank")), int(m.group("world"))) if m else None


def iteration_dirs(root: str | os.PathLike) -> dict[int, Path]:
    """Every complete ``iteration_*`` dir under ``root`` (by any process or run), keyed by step."""
    out: dict[int, Path] = {}
    try:
        entries = list(os.scandir(root))
    except OSError:
        return out
    for e in entries:
        step = parse_iteration_dir_name(e.name)
        if step is not None and e.is_dir(follow_symlinks=False):
            out[step] = Path(e.path)
    return dict(sorted(out.items()))


def read_tracker(root: str | os.PathLike) -> int | None:
    """The step in ``latest_checkpointed_iteration.txt``, or None when there is no tracker."""
    path = Path(root) / TRACKER
    try:
        text = read_text(path, limit=TRACKER_LIMIT, error=CheckpointError, what="tracker file",
                         hint="write the step of the last complete iteration_* dir into it, or point at that dir")
    except FileNotFoundError:
        return None
    if not text.strip().isdigit():
        raise CheckpointError(message=f"{path}: expected a decimal step, found {text[:40]!r}", path=str(path),
                              hint="write the step of the last complete iteration_* dir into it, or point at that dir")
    return int(text.strip())


@attrs.frozen
class Located:
    """Where a load path leads. ``kind``: "mf" (an iteration dir or a dir of rank files),
    "hf" (Hugging Face weights dir) or "file" (one safetensors file)."""

    given: str
    kind: str
    step_dir: Path | None  # the dir holding the files (None for a lone file)
    file: Path | None = None
    root: Path | None = None  # the save root when reached through the tracker
    step: int | None = None  # from the tracker or the dir name


def locate(path: str | os.PathLike) -> Located:
    """Resolve a save root (via the tracker), a step dir, an HF dir or one file (§3.7, but strict)."""
    p = Path(path)
    if not p.exists():
        raise InputError(message=f"checkpoint path {p} does not exist", path=str(p),
                         hint="check the path; mftk never silently starts from scratch")
    if p.is_file():
        return Located(given=str(p), kind="file", step_dir=None, file=p)
    if (p / HF_INDEX).is_file() or (p / HF_SINGLE).is_file():
        return Located(given=str(p), kind="hf", step_dir=p)
    step = read_tracker(p)
    if step is not None:
        d = p / iteration_dir_name(step)
        if not d.is_dir():
            raise CheckpointError(message=f"{p / TRACKER} names step {step} but {d.name}/ does not exist",
                                  path=str(p), hint=_available_hint(p))
        return Located(given=str(p), kind="mf", step_dir=d, root=p, step=step)
    if any(parse_shard_file_name(f.name) for f in p.glob("*.safetensors")):
        return Located(given=str(p), kind="mf", step_dir=p, step=parse_iteration_dir_name(p.name))
    if iteration_dirs(p):
        raise CheckpointError(message=f"{p} has iteration dirs but no {TRACKER}", path=str(p),
                              hint=_available_hint(p))
    if list(p.glob("*.safetensors")):
        return Located(given=str(p), kind="hf", step_dir=p)
    raise CheckpointError(message=f"{p} holds no checkpoint (no tracker, no iteration dirs, no *.safetensors)",
                          path=str(p), hint="point at the save_path of a run, an iteration_* dir or a .safetensors file")


def looks_complete(step_dir: Path) -> bool:
    """A step dir that holds a common.json and at least one model file (a dir with only metadata.json, or an
    emptied one, is not offered as complete)."""
    try:
        names = [e.name for e in os.scandir(step_dir)]
    except OSError:
        return False
    return COMMON in names and any((p := parse_shard_file_name(n)) is not None and p.kind == "model" for n in names)


def _available_hint(root: Path) -> str:
    dirs = iteration_dirs(root)
    steps = [s for s, d in dirs.items() if looks_complete(d)]
    if not steps:
        partial = ", ".join(d.name for d in list(dirs.values())[-3:])
        return ("no complete iteration_* dirs are present" + (f" ({partial}: no common.json or no model files)"
                                                               if partial else ""))
    shown = ", ".join(iteration_dir_name(s) for s in steps[-3:])
    return f"complete dirs present: {shown}; pass one of them explicitly"


def _foreign(f: Path, own: str) -> list[str]:
    """A step dir's files are its own: a regular file inside it. A symlink to another step's shard would
    pass every header check and resume the wrong weights; a FIFO or device would hang or never end."""
    target = os.path.realpath(f)
    if os.path.dirname(target) != own:
        return [f"{f.name}: a symlink to {target}, outside this checkpoint dir (a step dir's files must be its own)"]
    try:
        mode = os.stat(f).st_mode
    except OSError as exc:
        return [f"{f.name}: cannot be read ({exc.strerror or exc})"]
    if not stat.S_ISREG(mode):
        return [f"{f.name}: {kind_of(mode)}, not a regular file"]
    return []


@attrs.frozen
class StepFiles:
    """The rank files found in one step dir, keyed by rank; ``problems`` lists inconsistencies."""

    step_dir: Path
    prefix: str | None
    world: int
    model: dict[int, Path]
    opt: dict[int, Path]
    state: dict[int, Path]
    problems: tuple[str, ...] = ()

    @property
    def missing_model_ranks(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.model]

    @property
    def missing_opt_ranks(self) -> list[int]:
        return [r for r in range(self.world) if r not in self.opt]


def scan_step_dir(step_dir: str | os.PathLike) -> StepFiles:
    """Group ``*-model-*`` / ``*-opt-*`` / ``mftk-state-*`` files by rank; mixed worlds or prefixes are problems."""
    d = Path(step_dir)
    model: dict[int, Path] = {}
    opt: dict[int, Path] = {}
    state: dict[int, Path] = {}
    worlds: set[int] = set()
    prefixes: set[str | None] = set()
    problems: list[str] = []
    own = os.path.realpath(d)
    for f in sorted(d.iterdir()):
        parsed = parse_shard_file_name(f.name)
        if parsed is None:
            if (rw := parse_state_file_name(f.name)) is not None:
                state[rw[0]] = f
                problems += _foreign(f, own)
            continue
        problems += _foreign(f, own)
        worlds.add(parsed.world)
        prefixes.add(parsed.prefix)
        target = model if parsed.kind == "model" else opt
        if parsed.rank in target:
            problems.append(f"two {parsed.kind} files for rank {parsed.rank}: {target[parsed.rank].name}, {f.name}")
        target[parsed.rank] = f
        if parsed.rank >= parsed.world:
            problems.append(f"{f.name}: rank {parsed.rank} is not below world size {parsed.world}")
    if len(worlds) > 1:
        problems.append(f"files from different world sizes mixed: {sorted(worlds)}")
    if len(prefixes) > 1:
        problems.append(f"files with different prefixes mixed: {sorted(str(p) for p in prefixes)}")
    world = max(worlds) if worlds else 0
    return StepFiles(step_dir=d, prefix=next(iter(prefixes)) if len(prefixes) == 1 else None, world=world,
                     model=model, opt=opt, state=state, problems=tuple(problems))
