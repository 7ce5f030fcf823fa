"""Every factorisation of a world size into a parallel layout, each judged by the layout rules.

The mesh is (pp, dp_replicate, dp_shard, cp, tp) as in the reference's §2.2, with expert
parallelism laid over dp_shard·cp·tp and pipeline interleave as a per-layout choice. Nothing is
filtered silently: a layout that breaks a rule comes back with the rule's name and the arithmetic,
so "why is there no layout for 7 devices?" has an answer per dimension.
"""
from __future__ import annotations

from typing import Iterator

import attrs

from mftk.config.runnable import RULES as RUNNABLE_RULES
from mftk.config.runnable import LayoutSettings, layout_refusals
from mftk.derive import Layout
from mftk.plan.memory import PlanInputs

# rule name -> (mesh dimension it constrains, what it says): config.runnable's rules, plus the node topology
RULES: dict[str, tuple[str, str]] = {**RUNNABLE_RULES, "tp_in_node": ("tp", "a tp group stays inside one node (--nodes)")}


@attrs.frozen
class Rejection:
    rule: str
    message: str

    @property
    def dimension(self) -> str:
        return RULES[self.rule][0]


@attrs.frozen
class Candidate:
    layout: Layout
    rejections: tuple[Rejection, ...]

    @property
    def valid(self) -> bool:
        return not self.rejections


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def factorisations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Ordered k-tuples of positive integers whose product is n."""
    if k == 1:
        yield (n,)
        return
    for d in divisors(n):
        for rest in factorisations(n // d, k - 1):
            yield (d, *rest)


def candidate_layouts(world: int, *, moe: bool, max_interleave: int = 1) -> Iterator[Layout]:
    """(dp_replicate, dp_shard, cp, tp, pp) × ep | dp_shard·cp·tp (MoE only) × interleave ≤ max (pp > 1 only)."""
    for rep, shard, cp, tp, pp in factorisations(world, 5):
        eps = divisors(shard * cp * tp) if moe else [1]
        inters = range(1, max_interleave + 1) if pp > 1 else [1]
        for ep in eps:
            for v in inters:
                yield Layout(world=world, dp_replicate=rep, dp_shard=shard, cp=cp, tp=tp, pp=pp, ep=ep, interleave=v)


def check_layout(layout: Layout, inputs: PlanInputs, *, nodes: int | None = None) -> list[Rejection]:
    """Every rule the layout breaks for this model and batch (empty: valid and runnable): the node topology,
    then `config.runnable.layout_refusals` — the same function `validate-config` and `train` apply."""
    out = []
    if nodes:
        per_node = layout.world // nodes
        if per_node % layout.tp:
            out.append(Rejection("tp_in_node", f"{per_node} devices per node % tp = {per_node} % {layout.tp} = "
                                 f"{per_node % layout.tp}: a tp group would span nodes"))
    settings = LayoutSettings(sequence_parallel=inputs.sequence_parallel, cp_method=inputs.cp_method.lower(),
                              ulysses_degree=inputs.ulysses_degree,
                              layers_per_stage=inputs.layers_per_stage, schedule=inputs.schedule,
                              global_batch_size=inputs.global_batch_size, local_batch_size=inputs.local_batch_size,
                              rampup=inputs.rampup, track_max_logits=inputs.track_max_logits)
    out += [Rejection(r.rule, r.message) for r in layout_refusals(inputs.model, layout, settings)]
    return out


def search(world: int, inputs: PlanInputs, *, nodes: int | None = None, max_interleave: int = 1) -> list[Candidate]:
    """All candidate layouts for `world` ranks with their rejections (valid ones have none)."""
    moe = inputs.model.is_moe()
    return [Candidate(lay, tuple(check_layout(lay, inputs, nodes=nodes)))
            for lay in candidate_layouts(world, moe=moe, max_interleave=max_interleave)]


def why_none(candidates: list[Candidate]) -> list[str]:
    """One line per rule that rejected something: how often, and the first arithmetic seen."""
    seen: dict[str, tuple[int, str]] = {}
    for c in candidates:
        for r in c.rejections:
            count, first = seen.get(r.rule, (0, r.message))
            seen[r.rule] = (count + 1, first)
    return [f"{RULES[rule][0]}: {RULES[rule][1]} — e.g. {first} ({count} layout(s))"
            for rule, (count, first) in sorted(seen.items(), key=lambda kv: RULES[kv[0]][0])]
