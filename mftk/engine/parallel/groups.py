"""Process groups for every mesh axis of a `Layout`, computed purely and created once per rank.

The dense mesh is C-order (pp, dp_replicate, dp_shard, cp, tp), TP innermost (reference §2.2).
A group "over axes A" holds the ranks that differ from this rank only in the coordinates of A.
The sparse (MoE) mesh flattens (dp_shard, cp, tp) and splits it as (edp, ep) with EP innermost,
so an EP group is `ep` consecutive ranks. Each rank also has an ``embedding`` group: the first and
last stage of its pipeline, which both hold the embedding of a tied output layer or of MTP.

`mesh_groups` is pure (rank lists only) so it is testable without processes; `create_groups`
registers the groups this rank belongs to with MindSpore (size-1 groups are never created: every
collective in `comm.py` is the identity on them, and the full world uses the world group).
"""
from __future__ import annotations

import itertools

import attrs

from mftk.derive import Layout

DENSE_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")

# name -> axes of the dense mesh it spans
DENSE_GROUPS: dict[str, tuple[str, ...]] = {
    "tp": ("tp",),
    "cp": ("cp",),
    "pp": ("pp",),
    "dp_shard": ("dp_shard",),
    "dp_replicate": ("dp_replicate",),
    "dp": ("dp_replicate", "dp_shard"),  # data-parallel replicas: the batch split
    "dp_cp": ("dp_replicate", "dp_shard", "cp"),  # gradient reduction and the logged-loss mean ("loss" mesh)
    "fsdp": ("dp_shard", "cp"),  # parameter shards (dense FSDP mesh)
    "tp_cp": ("cp", "tp"),  # ranks of one model replica within a stage
    "mp": ("cp", "tp", "pp"),  # everything that is not data parallel
}


@attrs.frozen
class AxisGroup:
    """One communication group as seen from one rank."""

    name: str  # MindSpore group name ('' for size 1; the world group name when it spans the world)
    ranks: tuple[int, ...]  # global ranks, in group-rank order
    rank: int  # this process's index inside `ranks`

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def is_trivial(self) -> bool:
        return len(self.ranks) == 1


class StagePosition:
    """``is_first``/``is_last`` of a pipeline stage, for classes holding ``stage`` and ``pp``."""

    stage: int
    pp: int

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.pp - 1


def _mesh_shape(layout: Layout) -> tuple[int, ...]:
    return (layout.pp, layout.dp_replicate, layout.dp_shard, layout.cp, layout.tp)


def coords_of(layout: Layout, rank: int) -> tuple[int, ...]:
    """C-order coordinates (pp, dp_replicate, dp_shard, cp, tp) of a global rank."""
    out = []
    for size in reversed(_mesh_shape(layout)):
        out.append(rank % size)
        rank //= size
    return tuple(reversed(out))


def rank_of(layout: Layout, coords: tuple[int, ...]) -> int:
    rank = 0
    for c, size in zip(coords, _mesh_shape(layout)):
        rank = rank * size + c
    return rank


def dense_group_ranks(layout: Layout, rank: int, axes: tuple[str, ...]) -> tuple[int, ...]:
    """Ranks sharing every coordinate of `rank` except those on `axes`, in C order of `axes`."""
    base = list(coords_of(layout, rank))
    shape = _mesh_shape(layout)
    idx = [DENSE_AXES.index(a) for a in axes]
    idx.sort()
    ranks = []
    for combo in itertools.product(*(range(shape[i]) for i in idx)):
        c = list(base)
        for i, v in zip(idx, combo):
            c[i] = v
        ranks.append(rank_of(layout, tuple(c)))
    return tuple(ranks)


def expert_group_ranks(layout: Layout, rank: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ep ranks, edp ranks) of `rank` on the sparse mesh (pp, dp_replicate, edp, ep).

    The block of one (pp, dp_replicate) coordinate is `dp_shard·cp·tp` consecutive ranks; EP takes
    consecutive runs of `ep` inside it and EDP the ranks `ep` apart.
    """
    block = layout.dp_shard * layout.cp * layout.tp
    start = (rank // block) * block
    local = rank - start
    ep = max(layout.ep, 1)
    ep_ranks = tuple(start + (local // ep) * ep + i for i in range(ep))
    edp_ranks = tuple(start + (local % ep) + j * ep for j in range(block // ep))
    return ep_ranks, edp_ranks


def embedding_group_ranks(layout: Layout, rank: int) -> tuple[int, ...]:
    """The first- and last-stage ranks of `rank`'s pipeline (same other coordinates), which both hold the
    embedding when the output layer is tied or MTP embeds; just `rank` on the stages in between."""
    coords = list(coords_of(layout, rank))
    if layout.pp == 1 or coords[0] not in (0, layout.pp - 1):
        return (rank,)
    return tuple(rank_of(layout, tuple([stage] + coords[1:])) for stage in (0, layout.pp - 1))


def check_layout(layout: Layout) -> None:
    """Reject a layout whose mesh does not cover the world exactly (callers validate configs earlier)."""
    from mftk.errors import PlanError

    if layout.product != layout.world:
        raise PlanError(message=(f"parallel degrees do not multiply to the world size: {layout.describe()} "
                                 f"= {layout.product} ranks, but world = {layout.world}"),
                        rule="mesh_product", values={"product": layout.product, "world": layout.world})
    block = layout.dp_shard * layout.cp * layout.tp
    if layout.ep > 1 and block % layout.ep:
        raise PlanError(message=(f"expert_parallel={layout.ep} must divide dp_shard·cp·tp = "
                                 f"{layout.dp_shard}·{layout.cp}·{layout.tp} = {block}"),
                        rule="ep_divides", values={"ep": layout.ep, "block": block})


@attrs.frozen
class ParallelGroups:
    """Every group this rank belongs to, by axis name; `groups.tp.size`, `groups.dp.rank`, ..."""

    layout: Layout
    rank: int
    by_name: dict[str, AxisGroup]

    def __getattr__(self, name: str) -> AxisGroup:
        by_name = object.__getattribute__(self, "by_name")
        if name in by_name:
            return by_name[name]
        raise AttributeError(name)

    @property
    def world(self) -> AxisGroup:
        return self.by_name["world"]

    @property
    def coords(self) -> dict[str, int]:
        return dict(zip(DENSE_AXES, coords_of(self.layout, self.rank)))

    @property
    def dp_rank(self) -> int:
        """Index of this rank's data shard: equal on the cp/tp/pp ranks of one replica."""
        return self.dp.rank

    @property
    def is_first_stage(self) -> bool:
        return self.pp.rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp.rank == self.pp.size - 1


def group_name(ranks: tuple[int, ...]) -> str:
    """Named by its members only, so axes that coincide (tp and tp_cp when cp=1) share one group."""
    return "mftk_" + "_".join(str(r) for r in ranks)


def context_group_ranks(layout: Layout, rank: int, ulysses: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(ulysses ranks, ring ranks) of `rank` inside its CP group: CP index c is ring c // u, ulysses c % u, so
    a ulysses group is `u` consecutive CP ranks (u = cp: the CP group; u = 1: each rank alone)."""
    cp = dense_group_ranks(layout, rank, ("cp",))
    u = max(1, ulysses)
    c = cp.index(rank)
    ring, uly = divmod(c, u)
    return cp[ring * u:(ring + 1) * u], tuple(cp[i * u + uly] for i in range(len(cp) // u))


def mesh_groups(layout: Layout, rank: int, *, world_name: str = "world", ulysses: int = 1) -> ParallelGroups:
    """The groups of `rank` without creating anything (pure; names are what `create_groups` uses).
    ``ulysses``: the all-to-all degree inside CP (`context_parallel`'s ulysses / hybrid methods)."""
    check_layout(layout)
    world = tuple(range(layout.world))
    by_name: dict[str, AxisGroup] = {}

    def add(axis: str, ranks: tuple[int, ...]) -> None:
        if len(ranks) == 1:
            name = ""
        elif ranks == world:
            name = world_name
        else:
            name = group_name(ranks)
        by_name[axis] = AxisGroup(name=name, ranks=ranks, rank=ranks.index(rank))

    add("world", world)
    for axis, axes in DENSE_GROUPS.items():
        add(axis, dense_group_ranks(layout, rank, axes))
    ep_ranks, edp_ranks = expert_group_ranks(layout, rank)
    add("ep", ep_ranks)
    add("edp", edp_ranks)
    add("embedding", embedding_group_ranks(layout, rank))
    uly, ring = context_group_ranks(layout, rank, ulysses)
    add("cp_ulysses", uly)
    add("cp_ring", ring)
    return ParallelGroups(layout=layout, rank=rank, by_name=by_name)


def create_groups(layout: Layout, *, ulysses: int = 1) -> ParallelGroups:
    """Build and register (with MindSpore) every group of this process's rank; call once after init."""
    from mindspore import communication
    from mindspore.communication.management import GlobalComm

    rank, world = communication.get_rank(), communication.get_group_size()
    if world != layout.world:
        from mftk.errors import PlanError

        raise PlanError(message=f"the layout is for {layout.world} ranks but this job has {world} workers",
                        rule="world_size", values={"layout": layout.world, "world": world})
    groups = mesh_groups(layout, rank, world_name=GlobalComm.WORLD_COMM_GROUP, ulysses=ulysses)
    todo = {g.ranks: g.name for g in groups.by_name.values()
            if not g.is_trivial and g.name != GlobalComm.WORLD_COMM_GROUP}
    # one global order (sorted member lists) on every rank, so no two ranks wait on each other in a cycle
    for ranks in sorted(todo):
        communication.create_group(todo[ranks], list(ranks))
    return groups
