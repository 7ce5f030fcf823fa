"""Values derived from a config, in one place: the parallel mesh, accumulation, data blends, layer ranges.

Pure functions over plain values; this module imports nothing of mftk's, so the config rules, the
data loader, the planner and the engine all compute a derived value the same way. Functions that
parse user text raise `DeriveError` (a ValueError with the offending list index and a hint); the
config rules turn it into a `Problem` at the YAML path, and code that runs on a validated config
never sees it.
"""
from __future__ import annotations

import math
import re
from typing import Any

import attrs

MAX_BLEND_DATASETS = 32766  # the blending index is int16 (the reference asserts < 32767)
SPLITS = ("train", "valid", "test")
_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+))?\s*$")


class DeriveError(ValueError):
    """User text that does not parse; ``index`` is the list entry at fault (None: the whole value)."""

    def __init__(self, message: str, *, index: int | None = None, hint: str = "") -> None:
        super().__init__(message)
        self.message, self.index, self.hint = message, index, hint


# ----------------------------------------------------------------------------- the parallel mesh
@attrs.frozen(kw_only=True)
class Layout:
    """A parallel layout over `world` ranks: the mesh is (pp, dp_replicate, dp_shard, cp, tp)."""

    world: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    interleave: int = 1

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def product(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp * self.tp * self.pp

    def describe(self) -> str:
        parts = [f"dp_replicate={self.dp_replicate}", f"dp_shard={self.dp_shard}", f"cp={self.cp}",
                 f"tp={self.tp}", f"pp={self.pp}"]
        if self.ep > 1:
            parts.append(f"ep={self.ep}")
        if self.interleave > 1:
            parts.append(f"interleave={self.interleave}")
        return " × ".join(parts)

    def rank_coords(self, rank: int) -> dict[str, int]:
        """Coordinates of a rank in the C-order mesh (pp, dp_replicate, dp_shard, cp, tp): TP innermost."""
        coords = {}
        for name, size in (("tp", self.tp), ("cp", self.cp), ("dp_shard", self.dp_shard),
                           ("dp_replicate", self.dp_replicate), ("pp", self.pp)):
            coords[name] = rank % size
            rank //= size
        return coords

    def dp_rank(self, rank: int) -> int:
        """Data shard index of a rank: the reference's `(rank % (world/pp)) // tp // cp`."""
        return (rank % (self.world // self.pp)) // self.tp // self.cp


# ----------------------------------------------------------------------------- compiled blocks
JIT_MIN_PARAMS = 10_000_000  # bench/train_step.py: from here a CPU step is bound by its kernels, not dispatch


def compiles_blocks(trainable_params: int, *, one_process: bool) -> bool:
    """Whether `mftk train` compiles the transformer layers (``GPTModel.jit_blocks``): one process and a
    model of at least ``JIT_MIN_PARAMS`` trainable parameters. The trainer applies it and the planner's
    CPU profile counts what the compiled graphs hold (`plan.memory`), so both read this rule."""
    return one_process and trainable_params >= JIT_MIN_PARAMS


def derive_dp(world: int, tp: int, pp: int, cp: int) -> tuple[int, str]:
    """dp = world // (tp·pp·cp), as the reference derives it (0 means the degrees do not fit)."""
    denom = tp * pp * cp
    dp = world // denom if denom > 0 else 0
    return dp, f"dp = world // (tp·pp·cp) = {world} // ({tp}·{pp}·{cp}) = {dp}"


def split_dp(dp: int, data_parallel_shard: int) -> tuple[int, int, str]:
    """(dp_replicate, dp_shard) from data_parallel_shard; -1 shards over all of DP."""
    if data_parallel_shard < 0:
        return 1, dp, f"data_parallel_shard=-1: dp_replicate=1, dp_shard=dp={dp}"
    if data_parallel_shard == 0:
        return 1, dp, "data_parallel_shard=0 is invalid"
    rep = max(dp // data_parallel_shard, 1)
    shard = dp // rep
    return rep, shard, (f"dp_replicate = max(dp // data_parallel_shard, 1) = max({dp} // {data_parallel_shard}, 1) = "
                        f"{rep}; dp_shard = dp // dp_replicate = {dp} // {rep} = {shard}")


def layout_from_config(parallelism: Any, world: int) -> Layout:
    """The layout a ``parallelism:`` section asks for on `world` ranks (no validation; see config.rules)."""
    p = parallelism
    dp, _ = derive_dp(world, p.tensor_parallel, p.pipeline_parallel, p.context_parallel)
    rep, shard, _ = split_dp(max(dp, 1), p.data_parallel_shard)
    return Layout(world=world, tp=p.tensor_parallel, pp=p.pipeline_parallel, cp=p.context_parallel,
                  ep=p.expert_parallel, dp_replicate=rep, dp_shard=shard,
                  interleave=p.pipeline_parallel_interleave_num)


# ----------------------------------------------------------------------------- batches
def accumulation_steps(global_batch_size: int, local_batch_size: int, dp: int) -> tuple[int | None, str]:
    """gbs / (dp·lbs); None when it is not a whole number ≥ 1 (the reference raises too, since 2.1.0)."""
    base = dp * local_batch_size
    text = f"global_batch_size / (dp·local_batch_size) = {global_batch_size} / ({dp}·{local_batch_size})"
    if base <= 0 or global_batch_size % base != 0 or global_batch_size < base:
        return None, text + (f" = {global_batch_size / base:g}, not a whole number ≥ 1" if base > 0 else "")
    return global_batch_size // base, text + f" = {global_batch_size // base}"


def rampup_gbs(consumed_samples: int, start: int, increment: int, rampup_samples: int, maximum: int) -> int:
    """Global batch size at `consumed_samples` under `training.rampup_batch_size` (reference §2.8)."""
    levels = (maximum - start) // increment if increment > 0 else 0
    per_level = rampup_samples / levels if levels > 0 else 0
    if consumed_samples > rampup_samples or per_level <= 0:
        return maximum
    return min(start + int(consumed_samples / per_level) * increment, maximum)


def skip_micro_batches(consumed_samples: int, dp: int, local_batch_size: int) -> int:
    """Micro-batches each data rank has already read after ``consumed_samples`` (the reference's resume rule)."""
    return consumed_samples // (dp * local_batch_size)


# ----------------------------------------------------------------------------- layers and stages
def parse_layer_range(text: Any) -> list[int] | None:
    """'3' or 3 -> [3]; '2-5' -> [2, 3, 4, 5]; anything else -> None."""
    if isinstance(text, bool):
        return None
    match = _RANGE.match(str(text))
    if not match:
        return None
    a = int(match.group(1))
    b = int(match.group(2)) if match.group(2) is not None else a
    return list(range(a, b + 1)) if b >= a else None


def stage_chunks(num_layers: int, pp: int, interleave: int, spec: Any = "auto") -> list[list[list[int]]] | None:
    """Decoder layer ids of each chunk of each pipeline rank (``[rank][chunk]``); None when the split is impossible.

    'auto' puts chunk c of rank r at virtual stage c·pp + r, L/(pp·v) layers each (reference §1.3);
    an explicit list (one string per rank, `v` comma-separated chunks) is taken literally.
    """
    if isinstance(spec, list) and len(spec) == pp:
        out = []
        for stage in spec:
            chunks = str(stage).split(",")
            ids = [parse_layer_range(c) for c in chunks]
            if len(chunks) != interleave or any(x is None for x in ids):
                return None
            out.append([list(x) for x in ids])  # type: ignore[arg-type]
        flat = sorted(i for rank in out for chunk in rank for i in chunk)
        return out if flat == list(range(num_layers)) else None
    if num_layers % (pp * interleave):
        return None
    n = num_layers // (pp * interleave)
    return [[list(range((c * pp + r) * n, (c * pp + r + 1) * n)) for c in range(interleave)] for r in range(pp)]


def stage_layers(num_layers: int, pp: int, interleave: int, spec: Any = "auto") -> list[list[int]] | None:
    """Decoder layer ids held by each pipeline rank (every chunk of `stage_chunks`); None when impossible."""
    chunks = stage_chunks(num_layers, pp, interleave, spec)
    return None if chunks is None else [sorted(i for chunk in rank for i in chunk) for rank in chunks]


# ----------------------------------------------------------------------------- data blends
@attrs.frozen
class Blend:
    """A parsed ``data_path``: prefixes, and their weights (None: weighted by their sizes)."""

    prefixes: tuple[str, ...]
    weights: tuple[float, ...] | None


def parse_data_path(data_path: Any) -> Blend:
    """``[w0, p0, w1, p1, …]`` (weights as numbers or numeric strings) or a plain prefix list.

    As in MindSpore Transformers 2.1.0: an odd length is all prefixes; an even length is pairs when
    every weight parses, all prefixes when none does, and an error when only some do. Weights must
    be finite and > 0 (a zero weight fails the reference's blend assertion). Stricter than the
    reference: an odd-length list holding a number is an error (it would read "0.5" as a prefix).
    """
    items = [data_path] if isinstance(data_path, (str, bytes)) else list(data_path or [])
    if not items:
        raise DeriveError("is empty", hint="list the dataset prefixes (without .bin/.idx)")
    if len(items) % 2 and any(_as_float(x) is not None for x in items):
        raise DeriveError(f"weight/prefix pairs need an even length, got {len(items)} entries",
                          hint="write [weight, prefix, weight, prefix, ...] or only prefixes")
    weights = [_as_float(w) for w in items[0::2]] if len(items) % 2 == 0 else []
    if not any(w is not None for w in weights):
        return Blend(tuple(_prefix(p, i, pairs=False) for i, p in enumerate(items)), None)
    if None in weights:
        bad = weights.index(None)
        raise DeriveError(f"mixes weights and prefixes: {items[2 * bad]!r} is not a weight", index=2 * bad,
                          hint="give either only prefixes, or weight/prefix pairs such as "
                               "[0.3, a_text_document, 0.7, b_text_document]")
    prefixes = tuple(_prefix(p, 2 * i + 1, pairs=True) for i, p in enumerate(items[1::2]))
    if len(prefixes) > MAX_BLEND_DATASETS:
        raise DeriveError(f"{len(prefixes)} datasets; at most {MAX_BLEND_DATASETS} can be blended")
    for i, w in enumerate(weights):
        if not math.isfinite(w) or w <= 0:  # type: ignore[arg-type]
            raise DeriveError(f"weight {items[2 * i]!r} of {prefixes[i]} must be a number > 0", index=2 * i,
                              hint="remove the prefix instead of giving it weight 0")
    return Blend(prefixes, tuple(float(w) for w in weights))  # type: ignore[arg-type]


def _as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _prefix(value: Any, index: int, *, pairs: bool) -> str:
    """A path prefix; in weight/prefix pairs a number where the prefix belongs is an error too."""
    if not isinstance(value, str) or not value.strip() or (pairs and _as_float(value) is not None):
        raise DeriveError(f"{value!r} is not a dataset prefix", index=index,
                          hint="prefixes are paths without extension, e.g. data/wiki_text_document")
    return value.strip()


def parse_split(split: Any) -> list[float]:
    """``"969, 30, 1"`` → normalised [train, valid, test] shares (missing ones are 0), as the reference parses it."""
    if split is None:
        raise DeriveError("is required with data_path", hint="e.g. split: '1, 0, 0' (all for training)")
    text = str(split)
    parts = re.findall(r"[.0-9]+", text)
    leftover = re.sub(r"[.0-9]+", "", text)
    bad = DeriveError(f"{text!r} does not parse as up to three numbers",
                      hint="write it like '98, 2, 0' (train, valid, test proportions)")
    if not parts or re.search(r"[^\s,/]", leftover):
        raise bad
    try:
        values = [float(p) for p in parts]
    except ValueError:
        raise bad from None
    if len(values) > len(SPLITS):
        raise DeriveError(f"{text!r} has {len(values)} numbers; at most 3 (train, valid, test)")
    values += [0.0] * (len(SPLITS) - len(values))
    if sum(values) <= 0:
        raise DeriveError(f"{text!r} sums to 0", hint="give the training split a share > 0")
    if values[0] <= 0:
        raise DeriveError(f"{text!r} gives the training split no data", hint="give the first (train) share > 0")
    total = sum(values)  # left to right, as the reference's Python sum: the split bounds depend on its rounding
    return [v / total for v in values]
