"""What a checkpoint holds, from headers, ``common.json`` and ``metadata.json`` only.

Tensor data is read only when asked (``read_tensors=True``: NaN/Inf counts and norms), so
inspecting a large checkpoint costs a few small reads per file. Problems are collected, not
raised, so one run lists everything wrong; the command decides the exit code.
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mftk.ckpt import names as opt_names
from mftk.ckpt import safetensors_io as st
from mftk.ckpt.common import CommonInfo, read_common
from mftk.ckpt.extra_state import read_extra_state
from mftk.ckpt.layout import (COMMON, METADATA, RESOLVED_CONFIG, TRACKER, Located, StepFiles, iteration_dirs,
                              locate, parse_state_file_name, scan_step_dir)
from mftk.ckpt.load import hf_weight_files, iter_global
from mftk.ckpt.metadata import GlobalTensor, coverage_problems, read_metadata
from mftk.errors import CheckpointError, InputError
from mftk.progress import NULL_PROGRESS, Progress

@attrs.frozen
class TensorRow:
    name: str
    kind: str  # "model" or "optimizer"
    dtype: str  # safetensors dtype (BF16, F32...)
    shape: tuple[int, ...]  # global shape
    nbytes: int  # one full copy
    shards: int = 1
    layout: str = "whole"  # e.g. "2x1 over 4 ranks"
    norm: float | None = None  # with read_tensors
    nan: int | None = None
    inf: int | None = None


@attrs.frozen
class RankFiles:
    rank: int
    model: str | None
    opt: str | None
    state: str | None
    bytes: int


@attrs.frozen
class Scenario:
    number: int
    name: str
    supported: bool
    reason: str


@attrs.frozen
class CheckpointReport:
    path: str
    kind: str  # "mf", "hf" or "file"
    step_dir: str | None
    step: int | None
    common: dict[str, Any] | None
    world: int
    prefix: str | None
    has_metadata: bool
    has_extra_state: bool
    ranks: list[RankFiles]
    tensors: list[TensorRow]
    model_parameters: int
    optimizer_elements: int
    bytes_by_dtype: dict[str, int]
    file_bytes: int
    scenarios: list[Scenario]
    other_steps: list[int]  # iteration dirs next to this one
    verified: bool
    tensors_read: bool
    problems: list[str]
    unused_optimizer_states: dict[str, list[str]] = attrs.field(factory=dict)  # skipped on resume, by state
    notes: list[str] = attrs.field(factory=list)  # what reading assumed (common.json defaults, kept keys)
    finite_checked: bool = False  # every tensor read and found finite (or its problems listed)
    checksums_checked: bool = False  # every tensor's bytes compared with its recorded CRC-32 (where recorded)
    unchecksummed: list[str] = attrs.field(factory=list)  # files written without checksums

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def tensor_kind(name: str, file_kind: str = "model") -> str:
    if file_kind == "opt" or opt_names.is_optimizer_name(name):
        return "optimizer"
    return "model"


def inspect_checkpoint(path: str | os.PathLike, *, verify: bool = False, read_tensors: bool = False,
                       finite: bool = False, quick: bool = False, progress: Progress = NULL_PROGRESS) -> CheckpointReport:
    """Summarise (and with ``verify`` check) a save root, step dir, HF dir or single file.

    ``verify`` checks headers, offsets and shard coverage, then reads every tensor once: its bytes against
    the CRC-32 recorded at save time and for NaN/Inf (`mftk.ckpt.verify`); ``quick`` stops after the headers.
    ``finite`` reads every tensor once and reports those holding NaN or infinity (a diverged run's
    weights pass every header check); ``read_tensors`` does that too, with counts and norms."""
    loc = locate(path)
    _refuse_bookkeeping_file(loc)
    c = _Collector(loc)
    if loc.kind == "file":
        c.add_files([(loc.file, "model")])
    elif loc.kind == "hf":
        try:
            c.add_files([(p, "model") for p in hf_weight_files(loc.step_dir)])
        except CheckpointError as exc:
            c.fail(exc)
    else:
        c.add_mf_dir(verify)
    readable = not c.problems  # headers sound: tensor data can be read
    checksums = verify and not quick and readable
    if checksums:
        c.check_checksums(progress, finite=not read_tensors)  # --tensors counts NaN/Inf itself
    if read_tensors and readable:
        c.read_tensors(progress)
    elif finite and not checksums and readable:
        c.check_finite(progress)
    return attrs.evolve(c.report(verify, read_tensors), finite_checked=(finite or checksums) and not read_tensors,
                        checksums_checked=checksums)


_BOOKKEEPING = {COMMON: "its step and batch record", TRACKER: "the save root's tracker of the latest step",
                METADATA: "its shard map", RESOLVED_CONFIG: "its saved run config"}


def _refuse_bookkeeping_file(loc: Located) -> None:
    """A checkpoint's own JSON/text file given as the path is named for what it is, not called damaged."""
    if loc.kind != "file" or loc.file is None:
        return
    name = loc.file.name
    what = _BOOKKEEPING.get(name) or ("its mftk extra state (RNG, data position)" if parse_state_file_name(name)
                                      else "")
    if what:
        raise InputError(message=f"{loc.given} is a checkpoint's {name} ({what}), not a weights file",
                         path=loc.given, hint=f"inspect the checkpoint it belongs to: mftk inspect-ckpt "
                                              f"{loc.file.parent}")


class _Collector:
    def __init__(self, loc: Located) -> None:
        self.loc = loc
        self.problems: list[str] = []
        self.rows: dict[str, TensorRow] = {}
        self.headers: dict[Path, st.SafetensorsHeader] = {}
        self.files: StepFiles | None = None
        self.meta: dict[str, GlobalTensor] | None = None
        self.common: CommonInfo | None = None
        self.has_extra = False
        self.unchecksummed: list[str] = []  # files without recorded checksums (checked for NaN/Inf only)

    def fail(self, exc: CheckpointError) -> None:
        self.problems += [f"{exc.message}: {p}" for p in exc.problems] if exc.problems else [exc.message]

    def header(self, p: Path) -> st.SafetensorsHeader | None:
        if p not in self.headers:
            try:
                self.headers[p] = st.read_header(p)
            except CheckpointError as exc:
                self.fail(exc)
                return None
        return self.headers[p]

    def add_files(self, files: list[tuple[Path, str]]) -> None:
        """Tensors stored whole (single card, HF, one file): a name in two files is a problem."""
        where: dict[str, str] = {}
        for p, file_kind in files:
            h = self.header(p)
            for t in (h.tensors.values() if h else ()):
                if t.name in where:
                    self.problems.append(f"{t.name}: in both {where[t.name]} and {p.name}")
                    continue
                where[t.name] = p.name
                self.rows[t.name] = TensorRow(name=t.name, kind=tensor_kind(t.name, file_kind), dtype=t.dtype,
                                              shape=t.shape, nbytes=t.nbytes)

    def add_mf_dir(self, verify: bool) -> None:
        d = self.loc.step_dir
        self.files = files = scan_step_dir(d)
        self.problems += list(files.problems)
        try:
            self.common = read_common(d)
        except CheckpointError as exc:
            self.fail(exc)
        self.problems += _step_dir_problems(self.loc, self.common)
        try:  # resume reads it (architecture, LR schedule) and refuses a damaged one: so does inspection
            from mftk.ckpt.run_config import read_run_config

            read_run_config(d)
        except CheckpointError as exc:
            self.fail(exc)
        self._check_rank_files(files)
        try:
            self.meta = read_metadata(d)
        except CheckpointError as exc:
            self.fail(exc)
            return
        if self.meta is None:
            if files.world > 1:
                self.problems.append(f"world size {files.world} but no metadata.json: shards cannot be placed")
            self.add_files([(p, "model") for p in files.model.values()] + [(p, "opt") for p in files.opt.values()])
        else:
            self._add_sharded(d, verify)
        self._check_extra_state(files)

    def _check_rank_files(self, files: StepFiles) -> None:
        if files.world == 0:
            self.problems.append(f"{self.loc.step_dir}: no *-model-*.safetensors files")
            return
        self.problems += [f"rank {r}: model file missing" for r in files.missing_model_ranks]
        if files.opt and files.missing_opt_ranks:
            self.problems += [f"rank {r}: opt file missing (other ranks have one)" for r in files.missing_opt_ranks]

    def _add_sharded(self, d: Path, verify: bool) -> None:
        for name, t in self.meta.items():
            if verify:
                self.problems += coverage_problems(t)
            dtype, file_kind = self._check_storage(d, t, verify)
            holders = sorted({r for entries in t.storage.values() for e in entries for r in e.rank_group})
            frag = "x".join(map(str, t.axis_fragmentations)) or "scalar"
            self.rows[name] = TensorRow(
                name=name, kind=tensor_kind(name, file_kind), dtype=dtype, shape=t.global_shape,
                nbytes=math.prod(t.global_shape) * st.DTYPES.get(dtype, (0, None))[0], shards=t.shard_count,
                layout="whole" if t.shard_count == 1 else f"{frag} over {len(holders)} ranks")

    def _check_storage(self, d: Path, t: GlobalTensor, verify: bool) -> tuple[str, str]:
        """Each shard's file exists and holds the tensor with the local shape; returns (dtype, file kind)."""
        dtype, file_kind = _MS_DTYPES.get(t.dtype, t.dtype), "model"
        local = dict(t.chunks)
        read_by: dict[str, int] = {}  # file → the shard index read from it (a file holds one slice per name)
        for index, entries in sorted(t.storage.items()):
            for e in entries[: None if verify else 1]:
                p = d / e.file_name
                if read_by.setdefault(e.file_name, index) != index:
                    self.problems.append(f"{t.name} shards {read_by[e.file_name]} and {index}: both mapped to "
                                         f"{t.name} in {e.file_name}, the same bytes (each shard needs its own)")
                    continue
                file_kind = "opt" if "-opt-" in e.file_name else file_kind
                if not p.is_file():
                    self.problems.append(f"{t.name} shard {index}: file {e.file_name} does not exist")
                    continue
                h = self.header(p)
                info = h.tensors.get(t.name) if h else None
                if h and info is None:
                    self.problems.append(f"{t.name} shard {index}: not in {e.file_name}")
                elif info is not None:
                    dtype = info.dtype
                    if index in local and info.shape != local[index]:
                        self.problems.append(f"{t.name} shard {index}: {e.file_name} holds {list(info.shape)}, "
                                             f"metadata.json says {list(local[index])}")
        return dtype, file_kind

    def _check_extra_state(self, files: StepFiles) -> None:
        self.has_extra = bool(files.state) and all(r in files.state for r in range(files.world))
        for r in files.state:
            try:
                read_extra_state(self.loc.step_dir, r, files.world)
            except CheckpointError as exc:
                self.fail(exc)

    def read_tensors(self, progress: Progress) -> None:
        """Whole tensors one at a time: NaN/Inf counts and L2 norms (float64 accumulation)."""
        def one(name: str, arr: np.ndarray) -> None:
            a = arr.astype(np.float64, copy=False) if arr.dtype.kind in "fiub" else arr
            finite = np.isfinite(a)
            nan, inf = int(np.isnan(a).sum()), int((~finite).sum() - np.isnan(a).sum())
            norm = float(np.sqrt(np.sum(np.square(a[finite]))))
            self.rows[name] = attrs.evolve(self.rows[name], norm=norm, nan=nan, inf=inf)
            if nan or inf:
                self.problems.append(f"{name}: {nan} NaN and {inf} Inf value(s)")

        self._each_tensor("reading tensors", one, progress)

    def check_checksums(self, progress: Progress, finite: bool = True) -> None:
        """Every file's tensors once: bytes against the recorded CRC-32, and (``finite``) no NaN/Inf
        (`mftk.ckpt.verify`)."""
        from mftk.ckpt.verify import check_files

        paths = self._files()
        progress.start("verifying checksums", total=len(paths))
        try:
            for p in paths:
                checked = check_files(p.parent, [p], finite=finite)
                self.problems += list(checked.problems)
                self.unchecksummed += list(checked.unchecksummed)
                progress.advance(1)
        finally:
            progress.done()

    def _files(self) -> list[Path]:
        """Every safetensors file of the checkpoint: the step dir's rank files, the HF dir's, or the one file."""
        if self.files is not None:
            return [p for _, p in sorted(self.files.model.items())] + [p for _, p in sorted(self.files.opt.items())]
        return list(self.headers)

    def check_finite(self, progress: Progress) -> None:
        """Every tensor once, whole: a problem for each that holds NaN or infinity (no counts, no copies)."""
        from mftk.ckpt.save import non_finite

        def one(name: str, arr: np.ndarray) -> None:
            if non_finite({name: arr}):
                self.problems.append(f"{name}: holds NaN or infinity")

        self._each_tensor("checking tensors are finite", one, progress)

    def _each_tensor(self, label: str, fn: Any, progress: Progress) -> None:
        progress.start(label, total=len(self.rows))
        try:
            for name, arr in iter_global(self.loc.given if self.loc.kind != "mf" else self.loc.step_dir):
                if name in self.rows:
                    fn(name, arr)
                    progress.advance(1)
        except CheckpointError as exc:
            self.fail(exc)
        finally:
            progress.done()

    def report(self, verify: bool, read: bool) -> CheckpointReport:
        rows = sorted(self.rows.values(), key=lambda r: (r.kind != "model", r.name))
        by_dtype: dict[str, int] = {}
        for r in rows:
            by_dtype[r.dtype] = by_dtype.get(r.dtype, 0) + r.nbytes
        files, loc = self.files, self.loc
        step = loc.step if loc.step is not None else (self.common.global_step if self.common else None)
        return CheckpointReport(
            path=loc.given, kind=loc.kind, step_dir=str(loc.step_dir) if loc.step_dir else None, step=step,
            common=self.common.to_dict() if self.common else None, world=files.world if files else 1,
            prefix=files.prefix if files else None, has_metadata=self.meta is not None, has_extra_state=self.has_extra,
            ranks=self._ranks(), tensors=rows,
            model_parameters=sum(math.prod(r.shape) for r in rows if r.kind == "model"),
            optimizer_elements=sum(math.prod(r.shape) for r in rows if r.kind == "optimizer"),
            bytes_by_dtype=by_dtype, file_bytes=sum(h.file_bytes for h in self.headers.values()),
            scenarios=resume_scenarios(self), other_steps=self._other_steps(), verified=verify,
            tensors_read=read, problems=self.problems, unused_optimizer_states=self.unused_states(),
            notes=(self.common.notes() if self.common else []) + self._checksum_notes(),
            unchecksummed=list(self.unchecksummed))

    def _checksum_notes(self) -> list[str]:
        if not self.unchecksummed:
            return []
        shown = ", ".join(self.unchecksummed[:3]) + (" ..." if len(self.unchecksummed) > 3 else "")
        return [f"{len(self.unchecksummed)} file(s) carry no checksums ({shown}; saved by an older mftk or another "
                "tool): their bytes cannot be verified, only checked for NaN/Inf"]

    def unused_states(self) -> dict[str, list[str]]:
        """Optimizer tensors mftk's AdamW does not use (skipped by a resume), grouped by state."""
        return opt_names.unused_states(r.name for r in self.rows.values() if r.kind == "optimizer")

    def muon_only_params(self) -> list[str]:
        """Parameters with Muon momentum but no AdamW moments: a standard resume cannot continue them."""
        names = {r.name for r in self.rows.values() if r.kind == "optimizer"}
        return sorted(p for p in map(opt_names.param_of, self.unused_states().get("muon_m", []))
                      if not all(opt_names.state_name(s, p) in names for s in opt_names.ADAMW_STATES))

    def _ranks(self) -> list[RankFiles]:
        f = self.files
        if f is None:
            return []
        out = []
        for r in range(f.world):
            paths = [p for p in (f.model.get(r), f.opt.get(r), f.state.get(r)) if p is not None]
            out.append(RankFiles(rank=r, model=_name(f.model.get(r)), opt=_name(f.opt.get(r)),
                                 state=_name(f.state.get(r)), bytes=sum(map(_size, paths))))
        return out

    def _other_steps(self) -> list[int]:
        d = self.loc.step_dir
        if self.loc.kind != "mf" or d is None:
            return []
        return list(iteration_dirs(d.parent))


def _name(p: Path | None) -> str | None:
    return p.name if p else None


def _size(p: Path) -> int:
    """A file's size; 0 for one that cannot be stat'ed (a symlink loop: scan_step_dir lists it as a problem)."""
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _step_dir_problems(loc: Located, common: CommonInfo | None) -> list[str]:
    """A step dir that is a symlink (to another step: its number would be reported with the target's
    contents), or whose name and common.json disagree on the step."""
    d, out = loc.step_dir, []
    if d is None:
        return out
    if d.is_symlink():
        out.append(f"{d.name} is a symlink to {os.path.realpath(d)}: a step dir must be its own (its step would be "
                   "reported with the target's contents)")
    if loc.step is not None and common is not None and common.global_step not in (None, loc.step):
        out.append(f"{d.name} is step {loc.step} but its common.json says global_step {common.global_step}")
    return out


_MS_DTYPES = {"Float32": "F32", "BFloat16": "BF16", "Float16": "F16", "Int32": "I32", "Int64": "I64",
              "Float64": "F64", "Int8": "I8", "UInt8": "U8", "Bool": "BOOL", "Int16": "I16"}


def _balanced_reason(units: int) -> str:
    return (f"{units} unique shards, each read once by one of the loading ranks and broadcast to the others "
            "(load_balanced: true with --nproc > 1)")


def resume_scenarios(c: _Collector) -> list[Scenario]:
    """Which of the reference's four resume scenarios (§4.2) this checkpoint can serve, and why not."""
    from mftk.ckpt.resume import ResumeScenario

    names = [s.title for s in ResumeScenario]
    if c.loc.kind == "file":
        why = "a single file is not a checkpoint dir: pass its directory"
        return [Scenario(i + 1, n, False, why) for i, n in enumerate(names)]
    if c.loc.kind == "hf":
        ok = not c.problems and bool(c.rows)
        return [Scenario(1, names[0], False, "Hugging Face weights hold no optimizer state or step"),
                Scenario(2, names[1], ok, "through the HF name mapping" if ok else "the weight files have problems"),
                Scenario(3, names[2], False, "needs scenario 1"),
                Scenario(4, names[3], ok, _balanced_reason(len(c.rows)) if ok else "needs scenario 2")]
    f, common = c.files, c.common
    broken = [p for p in c.problems if "opt file missing" not in p]
    weights_ok = common is not None and f is not None and f.world > 0 and not broken
    has_opt = f is not None and f.world > 0 and not f.missing_opt_ranks
    muon = c.muon_only_params()
    full_ok = weights_ok and has_opt and common.global_step is not None and not muon
    s1 = ("bit-exact continuation (mftk extra state present)" if c.has_extra
          else "not bit-exact: no mftk extra state, RNG re-seeded") if full_ok else (
        "no common.json or damaged files" if not weights_ok else
        "no optimizer files (saved with no_save_optim)" if not has_opt else
        f"{len(muon)} parameter(s) have Muon momentum (muon_m.*) and no adam_m/adam_v: mftk's AdamW cannot "
        "continue them" if muon else
        "common.json has no global_step" if "global_step" in common.missing else "global_step is null (step 0)")
    if full_ok and (unused := c.unused_states()):
        s1 += f"; skips {sum(map(len, unused.values()))} optimizer state(s) mftk's AdamW does not use " \
              f"({', '.join(k + '.*' for k in unused)})"
    s2 = "model weights into a fresh optimizer" if weights_ok else (
        "common.json is required even for weights-only" if common is None else "model files have problems")
    gbs_ok = full_ok and common.global_batch_size is not None and common.consumed_samples is not None
    s3 = (f"step rescaled as int({common.global_step}·{common.global_batch_size}/new_gbs), "
          f"consumed_samples {common.consumed_samples} kept") if gbs_ok else (
        "needs scenario 1" if not full_ok else "global_batch_size or consumed_samples is null")
    any_ok = weights_ok
    if not any_ok:
        s4 = "needs scenario 1 or 2"
    elif f.world > 1 and c.meta is None:
        any_ok, s4 = False, "needs metadata.json to know the shards and their replicas"
    else:  # the units of mftk.ckpt.balance: one per unique shard, or per tensor when stored whole
        s4 = _balanced_reason(sum(len(t.chunks) for t in c.meta.values()) if c.meta is not None else len(c.rows))
    return [Scenario(1, names[0], full_ok, s1), Scenario(2, names[1], weights_ok, s2),
            Scenario(3, names[2], gbs_ok, s3), Scenario(4, names[3], any_ok, s4)]
