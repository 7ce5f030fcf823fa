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

MAX_CANDIDATES = 1_000_000  # layouts one search checks (~30 s here); a 98,304-device MoE job has 550,188

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
    """Every divisor of ``n`` ascending, built from its prime factorisation (counting 1..n would take
    ``n`` steps: minutes for a world size of 10^9)."""
    out = [1]
    for p, e in prime_factors(n).items():
        out = [d * p ** k for d in out for k in range(e + 1)]
    return sorted(out)


def prime_factors(n: int) -> dict[int, int]:
    """{prime: exponent} of ``n`` ≥ 1: trial division by small primes, then Pollard's rho (Brent) on what
    is left, each part proven prime by a deterministic Miller-Rabin test (exact below 3.3·10^24)."""
    if n < 1:
        raise ValueError(f"prime_factors needs n ≥ 1, got {n}")
    found: dict[int, int] = {}
    for p in _SMALL_PRIMES:
        while n % p == 0:
            found[p] = found.get(p, 0) + 1
            n //= p
    stack = [n] if n > 1 else []
    while stack:
        m = stack.pop()
        if _is_prime(m):
            found[m] = found.get(m, 0) + 1
            continue
        d = _rho(m)
        stack += [d, m // d]
    return dict(sorted(found.items()))


_SMALL_PRIMES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47)


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _SMALL_PRIMES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def _rho(n: int) -> int:
    """A non-trivial factor of the odd composite ``n`` (Brent's cycle finding, deterministic seeds)."""
    from math import gcd

    for c in range(1, n):
        y, m, g, r, q = 2, 128, 1, 1, 1
        x = ys = y
        while g == 1:
            x = y
            for _ in range(r):
                y = (y * y + c) % n
            k = 0
            while k < r and g == 1:
                ys = y
                for _ in range(min(m, r - k)):
                    y = (y * y + c) % n
                    q = q * abs(x - y) % n
                g = gcd(q, n)
                k += m
            r *= 2
        if g == n:
            g = 1
            while g == 1:
                ys = (ys * ys + c) % n
                g = gcd(abs(x - ys), n)
        if g != n:
            return g
    raise ValueError(f"no factor found for {n}")  # pragma: no cover - unreachable for composite n


def count_factorisations(n: int, k: int) -> int:
    """How many ordered k-tuples multiply to ``n`` (what `factorisations` would yield), without listing them."""
    from math import comb, prod

    return prod(comb(e + k - 1, k - 1) for e in prime_factors(n).values())


def count_layouts(world: int, *, moe: bool, max_interleave: int = 1) -> int:
    """How many layouts `candidate_layouts` yields, from the prime exponents alone (multiplicative per prime:
    an exponent e is split over (rep, shard, cp, tp, pp), and ep takes any part of shard·cp·tp's share)."""
    from math import comb, prod

    def per_prime(e: int, pp_free: bool) -> int:
        return sum(((e - s + 1) if pp_free else 1) * comb(s + 2, 2) * ((s + 1) if moe else 1) for s in range(e + 1))

    exps = list(prime_factors(world).values())
    every, no_pp = prod(per_prime(e, True) for e in exps), prod(per_prime(e, False) for e in exps)
    return every + (max(max_interleave, 1) - 1) * (every - no_pp)


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


def check_layout(layout: Layout, inputs: PlanInputs, *, nodes: int | None = None,
                 engine: bool = True) -> list[Rejection]:
    """Every rule the layout breaks for this model and batch (empty: valid and runnable): the node topology,
    then `config.runnable.layout_refusals` — the same function `validate-config` and `train` apply.
    ``engine=False`` (plans for an accelerator cluster) leaves out what only mftk's engine does not implement."""
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
                              rampup=inputs.rampup, track_max_logits=inputs.track_max_logits,
                              muon=inputs.muon, qk_clip=inputs.qk_clip, update_on_device=inputs.update_on_device)
    from mftk.config.support import NOT_IN_ENGINE

    out += [Rejection(r.rule, r.message) for r in layout_refusals(inputs.model, layout, settings)
            if engine or NOT_IN_ENGINE not in r.message]
    return out


def search(world: int, inputs: PlanInputs, *, nodes: int | None = None, max_interleave: int = 1,
           engine: bool = True) -> list[Candidate]:
    """All candidate layouts for `world` ranks with their rejections (valid ones have none)."""
    moe = inputs.model.is_moe()
    count = count_layouts(world, moe=moe, max_interleave=max_interleave)
    if count > MAX_CANDIDATES:
        from mftk.errors import PlanError

        raise PlanError(message=f"world size {world} has {count:,} candidate layouts, more than the "
                        f"{MAX_CANDIDATES:,} a search checks", rule="search_size", values={"world_size": world},
                        hint="check one layout instead: --check (the YAML's own) or --explain dps4.tp2")
    return [Candidate(lay, tuple(check_layout(lay, inputs, nodes=nodes, engine=engine)))
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
