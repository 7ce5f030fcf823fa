"""Pure parallel-degree arithmetic: the derived sizes of the reference's §2.2, shown with their sums.

Derived values (dp, dp_replicate, dp_shard, accumulation) are computed here and never stored
as fields a user could contradict. Every function returns its result plus the arithmetic as
text, so `validate-config` and `plan-parallel` can show *why*.
"""
from __future__ import annotations

import attrs


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
    return rep, shard, (f"dp_replicate = max(dp // data_parallel_shard, 1) = max({dp} // {data_parallel_shard}, 1) = {rep}; "
                        f"dp_shard = dp // dp_replicate = {dp} // {rep} = {shard}")


def layout_from_config(parallelism, world: int) -> Layout:
    """The layout a config asks for on `world` ranks (no validation; see rules.check)."""
    p = parallelism
    dp, _ = derive_dp(world, p.tensor_parallel, p.pipeline_parallel, p.context_parallel)
    rep, shard, _ = split_dp(max(dp, 1), p.data_parallel_shard)
    return Layout(world=world, tp=p.tensor_parallel, pp=p.pipeline_parallel, cp=p.context_parallel,
                  ep=p.expert_parallel, dp_replicate=rep, dp_shard=shard,
                  interleave=p.pipeline_parallel_interleave_num)


def accumulation_steps(global_batch_size: int, local_batch_size: int, dp: int) -> tuple[int | None, str]:
    """gbs / (dp·lbs); None when it does not divide (MindSpore Transformers 2.1.0 refuses it too)."""
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
