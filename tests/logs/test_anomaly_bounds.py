"""Anomalies in bounded memory: runs collapsed where they are found, blocks joined by `Findings`, a cap per kind.

The reference for the collapse is the old pipeline, rewritten here in plain Python: one finding per flagged
step (each rule walked one step at a time), then the old `merge` (kept verbatim below)."""
import math
import random
from collections import defaultdict

import attrs
import numpy as np
import pytest

from mftk.logs import anomalies
from mftk.logs.anomalies import (Anomaly, Findings, MedianWalk, Thresholds, _rank_checks, _Series, _slow_steps,
                                 _spikes, detect, find_anomalies, lr_jumps_in, merge)
from mftk.logs.parse import Run
from mftk.logs.table import TableView

KINDS = ("nan", "spike", "grad_spike", "straggler", "lr_jump", "divergence", "resume", "skipped", "zero_loss",
         "unread", "stopped")


def old_merge(found):
    """`merge` as it was before runs were collapsed at the source (one finding per step in)."""
    groups = defaultdict(list)
    for a in found:
        groups[(a.kind, a.field, a.message if a.kind in ("resume", "stopped") else "", tuple(a.ranks))].append(a)
    runs = []
    for items in groups.values():
        items.sort(key=lambda a: a.step)
        current = None
        for a in items:
            if current is not None and a.kind not in ("resume", "stopped") and a.step == (
                    current.last_step or current.step) + 1:
                current.last_step, current.count = a.step, current.count + 1
                continue
            current = attrs.evolve(a)
            runs.append(current)
    joined = {}
    for a in runs:
        key = (a.kind, a.field, a.step, a.last_step, a.count,
               a.message if a.kind in ("nan", "resume", "stopped") else "")
        if key in joined:
            joined[key].ranks = sorted(set(joined[key].ranks) | set(a.ranks))
        else:
            joined[key] = a
    out = sorted(joined.values(), key=lambda a: (a.step, KINDS.index(a.kind), a.ranks))
    for a in out:
        if a.count > 1:
            a.message += f" (steps {a.step}..{a.last_step}, {a.count} steps)"
    return out


def _median(v):
    v = sorted(v)
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def _walk(values, ratio, t):
    """(index, value, median, history) of each value over `ratio` x the median of the last `window` finite
    values not flagged themselves, one value at a time."""
    out, kept = [], []
    for i, v in enumerate(values):
        if not math.isfinite(v):
            continue
        last = kept[-t.window:]
        if len(last) >= t.min_history:
            med = _median(last)
            if med > 0 and v > ratio * med:
                out.append((i, v, med, len(last)))
                continue
        kept.append(v)
    return out


def per_step_findings(rows_by_rank, t):
    """One finding per flagged step, in the detectors' order, each rule walked a step at a time."""
    found = []
    for rank, rows in rows_by_rank.items():
        steps = [r["step"] for r in rows]
        for key in ("loss", "grad_norm", "lr"):
            for r in rows:
                if not math.isfinite(r[key]):
                    word = "NaN" if math.isnan(r[key]) else "Inf"
                    found.append(Anomaly("nan", r["step"], key, f"{key} is {word}", [rank]))
        for key, kind, ratio in (("loss", "spike", t.spike), ("grad_norm", "grad_spike", t.grad_spike)):
            for i, v, med, hist in _walk([r[key] for r in rows], ratio, t):
                found.append(Anomaly(kind, steps[i], key, f"{key} {v:.4g} is {v / med:.2f}x the median {med:.4g} "
                                                          f"of the previous {hist} steps", [rank], v, med))
        skip = t.skip_warmup
        for i, v, med, _ in _walk([float(r["per_step_time"]) for r in rows[skip:]], t.straggler, t):
            found.append(Anomaly("straggler", steps[skip + i], "per_step_time",
                                 f"step took {v:g} ms, {v / med:.1f}x the median {med:g} ms", [rank], v, med))
        lr = [r["lr"] for r in rows]
        for i in range(2, len(rows)):
            la, lb, lc = lr[i - 2], lr[i - 1], lr[i]
            local = max(abs(lb), abs(lc))
            if not (abs(lc - lb) > t.lr_jump * local and abs(lc - (2 * lb - la)) > t.lr_jump * local and local > 0
                    and math.isfinite(la) and steps[i] == steps[i - 1] + 1 == steps[i - 2] + 2):
                continue
            large = abs(lc - lb) > t.lr_jump * max(abs(x) for x in lr[max(i - t.window + 1, 0):i + 1])
            if large or (lb - la) * (lc - lb) < 0 or (lb == la and lc > lb):
                found.append(Anomaly("lr_jump", steps[i], "lr", f"lr jumped from {lb:.3e} to {lc:.3e}", [rank], lc, lb))
    ranks = list(rows_by_rank)
    n = len(rows_by_rank[ranks[0]])
    for i in range(n):  # divergence (steps aligned across ranks here)
        step = rows_by_rank[ranks[0]][i]["step"]
        losses = [rows_by_rank[r][i]["loss"] for r in ranks]
        finite = [v for v in losses if math.isfinite(v)]
        if len(finite) < 2:
            continue
        med = _median(finite)
        devs = [abs(v - med) if math.isfinite(v) else -1.0 for v in losses]
        j = devs.index(max(devs))
        if devs[j] > t.divergence_rtol * max(1.0, abs(med)):
            others = [v for k, v in enumerate(losses) if k != j and math.isfinite(v)]
            found.append(Anomaly("divergence", step, "loss", f"rank {ranks[j]} loss {losses[j]:.6f} differs from the "
                                 f"other ranks' {_median(others):.6f} (data-parallel ranks should agree)",
                                 [ranks[j]], losses[j], med))
    for j, rank in enumerate(ranks):  # a rank slower than the others
        for i in range(n):
            times = [float(rows_by_rank[r][i]["per_step_time"]) for r in ranks]
            others = [v for k, v in enumerate(times) if k != j]
            med = _median(others)
            if med > 0 and times[j] > t.straggler * med:
                found.append(Anomaly("straggler", rows_by_rank[rank][i]["step"], "per_step_time",
                                     f"rank {rank} took {times[j]:g} ms, {times[j] / med:.1f}x the other ranks' {med:g} ms",
                                     [rank], times[j], med))
    return found


def random_rows(seed, n=600):
    """Two ranks' steps: NaN runs, spike runs, a stretch of alternating spikes, a diverging stretch, lr jumps,
    isolated slow steps (a run of slow steps would be flagged by two rules at once: see below)."""
    rng = random.Random(seed)
    base = [{"step": s, "loss": 6.0 + 4.0 * math.exp(-s / 150), "grad_norm": 1.0 + 0.01 * (s % 7),
             "per_step_time": 5000 if s == 1 else 700, "lr": 1e-4 * min(1.0, s / 10)} for s in range(1, n + 1)]
    rows = {0: [dict(r) for r in base], 1: [dict(r) for r in base]}
    for _ in range(4):  # NaN runs: loss on both ranks, grad_norm on one
        a = rng.randrange(20, n - 40)
        for r in rows[0][a:a + rng.randrange(1, 30)]:
            r["loss"] = math.nan
        for r in rows[1][a:a + rng.randrange(1, 30)]:
            r["loss"] = math.nan if rng.random() < 0.9 else math.inf
        b = rng.randrange(20, n - 40)
        for r in rows[rng.randrange(2)][b:b + rng.randrange(1, 20)]:
            r["grad_norm"] = math.nan
    for _ in range(5):  # spikes, alone or in runs, on both ranks alike or on one
        a = rng.randrange(60, n - 20)
        for rank in (0, 1) if rng.random() < 0.5 else (rng.randrange(2),):
            for r in rows[rank][a:a + rng.randrange(1, 6)]:
                r["loss"] *= 3
    a = rng.randrange(60, n - 120)  # alternating spikes
    for r in rows[0][a:a + 100:2]:
        r["loss"] *= 2
    for r in rows[1][rng.randrange(60, n - 50):][:rng.randrange(5, 40)]:  # grad spikes in a row
        r["grad_norm"] *= 10
    a = rng.randrange(60, n - 40)  # rank 1 diverges for a while
    for r in rows[1][a:a + rng.randrange(1, 25)]:
        r["loss"] += 0.5
    for _ in range(3):  # lr jumps: one step up, then back
        i = rng.randrange(30, n - 5)
        for rank in (0, 1):
            rows[rank][i]["lr"] *= 10
    for _ in range(4):  # isolated slow steps (at least two steps apart)
        i = rng.randrange(10, n // 4) * 4
        rows[rng.randrange(2)][i]["per_step_time"] = 2500
    return rows


def run_of(rows_by_rank):
    return Run(name="t", files=[], records=[{"rank": rank, **r} for rank, rows in rows_by_rank.items() for r in rows])


def as_data(found):
    return [attrs.asdict(a) for a in found]


@pytest.fixture
def no_cap(monkeypatch):
    monkeypatch.setattr(anomalies, "MAX_LISTED", 10 ** 9)


@pytest.mark.parametrize("seed", range(8))
def test_collapsed_at_the_source_equals_one_finding_per_step_then_the_old_merge(seed, no_cap):
    rows = random_rows(seed)
    t = Thresholds()
    expected = old_merge(per_step_findings(rows, t))
    got = find_anomalies(run_of(rows), thresholds=t)
    assert as_data(got) == as_data(expected)
    assert max(a.count for a in got) > 1 and {a.kind for a in got} >= {"nan", "spike", "divergence", "lr_jump"}


def test_a_run_of_a_rank_slow_against_its_history_and_the_other_ranks_is_one_finding():
    """The one change from the old merge: a rank slow for several steps, flagged by both straggler rules, was
    reported as four overlapping fragments ([30], [30..31], [31..32], [32]); now it is one run of those steps."""
    rows = {r: [{"step": s, "loss": 5.0, "grad_norm": 1.0, "per_step_time": 700, "lr": 1e-4} for s in range(1, 41)]
            for r in (0, 1)}
    for r in rows[1][29:32]:  # steps 30..32
        r["per_step_time"] = 2500
    (a,) = find_anomalies(run_of(rows))
    assert (a.kind, a.ranks, a.step, a.last_step, a.count) == ("straggler", [1], 30, 32, 3)
    assert a.message.startswith("step took 2500 ms") and a.message.endswith("(steps 30..32, 3 steps)")


class _Counted(Anomaly):
    """An Anomaly that counts how many were made (`attrs.evolve` makes its copies through it too)."""

    made = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        _Counted.made += 1


def test_a_long_nan_run_makes_a_few_objects_not_one_per_step(monkeypatch):
    n = 200_000
    steps = np.arange(1, n + 1)
    loss = np.where(steps >= 1000, np.nan, 3.0)
    rows = {0: [{"step": int(s), "loss": float(v), "grad_norm": 1.0, "per_step_time": 700, "lr": 1e-4}
                for s, v in zip(steps, loss)]}
    run = run_of(rows)
    _Counted.made = 0
    monkeypatch.setattr(anomalies, "Anomaly", _Counted)
    (a,) = find_anomalies(run)
    assert (a.kind, a.step, a.last_step, a.count) == ("nan", 1000, n, n - 999)
    assert a.message == f"loss is NaN (steps 1000..{n}, {n - 999} steps)"
    assert _Counted.made == 2  # the detector's, and the copy `result()` hands out


def _spike_every_other_step(n=5000):
    return {0: [{"step": s, "loss": (10.0 - s * 1e-4) * (3 if s % 2 == 0 and s >= 20 else 1), "grad_norm": 1.0,
                 "per_step_time": 700, "lr": 1e-4} for s in range(1, n + 1)]}


def test_the_list_holds_the_first_findings_of_a_kind_and_counts_the_rest(monkeypatch):
    monkeypatch.setattr(anomalies, "MAX_LISTED", 10)
    run = run_of(_spike_every_other_step())
    findings = detect(run)
    listed = findings.result()
    # a spike at every even step from 20 to 5000: 2491 spikes, never two in a row (hand count)
    assert [(a.kind, a.step, a.count) for a in listed] == [("spike", s, 1) for s in range(20, 40, 2)]
    (omitted,) = findings.omitted().values()
    assert (omitted.kind, omitted.count, omitted.first_step, omitted.last_step) == ("spike", 2481, 40, 5000)
    assert findings.notes() == ["2,481 more spike findings (steps 40..5,000) not listed"]
    assert as_data(find_anomalies(run)) == as_data(listed)


def test_the_note_for_one_finding_left_out():
    assert anomalies.Omitted("nan", 1, 7, 7).note() == "1 more nan finding (step 7) not listed"
    assert anomalies.Omitted("nan", 1, 7, 9).note() == "1 more nan finding (steps 7..9) not listed"


def test_nothing_omitted_under_the_cap():
    findings = detect(run_of(_spike_every_other_step(200)))
    assert len(findings.result()) == 91 and findings.omitted() == {} and findings.notes() == []


def _first_per_kind(found, n):
    """The first `n` of each kind, in order."""
    seen, out = defaultdict(int), []
    for a in found:
        seen[a.kind] += 1
        if seen[a.kind] <= n:
            out.append(a)
    return out


def _blocks_of(items, cuts):
    """`items` (one per step, count 1) cut into blocks at the steps `cuts`; resume/stopped added at the end."""
    once = [a for a in items if a.kind in ("resume", "stopped")]
    rest = [a for a in items if a.kind not in ("resume", "stopped")]
    bounds = [-math.inf, *sorted(cuts), math.inf]
    return [[a for a in rest if lo < a.step <= hi] for lo, hi in zip(bounds, bounds[1:])] + [once]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("limit", [3, 10 ** 9])
def test_findings_fed_blocks_in_step_order_equal_merge_of_everything(seed, limit, monkeypatch):
    monkeypatch.setattr(anomalies, "MAX_LISTED", limit)
    rng = random.Random(seed)
    rows = random_rows(seed)
    items = per_step_findings(rows, Thresholds())
    items += [anomalies.resume(0, 400, 300), anomalies.resume(1, 400, 300), anomalies.resume(0, 500, 450)]
    expected = old_merge([attrs.evolve(a) for a in items])
    f = Findings()
    for block in _blocks_of(items, rng.sample(range(1, 600), rng.randrange(1, 40))):
        f.add(block)
    listed = _first_per_kind(expected, limit)
    by_kind = defaultdict(list)
    for a in expected:
        by_kind[a.kind].append(a)
    assert as_data(f.result()) == as_data(listed)
    left = {k: (len(v) - limit, v[limit].step, max(a.last_step or a.step for a in v[limit:]))
            for k, v in by_kind.items() if len(v) > limit}
    assert {k: (o.count, o.first_step, o.last_step) for k, o in f.omitted().items()} == left
    assert (limit < 10 ** 9) == bool(left)


def _detector_items(run, t):
    """What `detect` hands to `Findings`: each detector's runs over the whole run (no merge)."""
    series = {rank: _Series(run.series(rank)) for rank in run.ranks}
    found = anomalies._resumes(run)
    for rank, recs in series.items():
        found += anomalies._non_finite(rank, recs) + anomalies._flagged(rank, recs)
        found += _spikes(rank, recs, "loss", "spike", t.spike, t)
        found += _spikes(rank, recs, "grad_norm", "grad_spike", t.grad_spike, t)
        found += _slow_steps(rank, recs, t) + anomalies._lr_jumps(rank, recs, t)
    return found + _rank_checks(series, t) + anomalies._stops(run)


@pytest.mark.parametrize("seed", range(4))
def test_runs_reaching_past_their_block_join_the_next_blocks(seed, monkeypatch):
    """Whole-run detector runs cut into blocks by their first step (a run may reach into later blocks), with
    and without each block's last step (`upto`): the same as `merge` of all, cut to the first few per kind."""
    rng = random.Random(seed)
    run, t = run_of(random_rows(seed)), Thresholds()
    items = _detector_items(run, t)
    assert any(a.count > 1 for a in items)
    expected = merge(items)
    monkeypatch.setattr(anomalies, "MAX_LISTED", 5)
    cuts = sorted(rng.sample(range(1, 600), 30))
    for upto in (False, True):
        f = Findings()
        for block, last in zip(_blocks_of([attrs.evolve(a) for a in items], cuts), [*cuts, None, None]):
            f.add(block, upto=last if upto else None)
        listed = _first_per_kind(expected, 5)
        assert as_data(f.result()) == as_data(listed)
        assert sum(o.count for o in f.omitted().values()) == len(expected) - len(listed) > 0


@pytest.mark.parametrize("seed", range(3))
def test_detectors_fed_a_view_at_a_time_into_findings_equal_the_whole_run(seed, monkeypatch):
    """The streamed use: each rank's detectors on a block of steps, their state carried (`MedianWalk`, the lr
    context), the cross-rank checks on the same block, the block's findings added: the same as in memory."""
    monkeypatch.setattr(anomalies, "MAX_LISTED", 4)
    rng = random.Random(seed)
    run = run_of(random_rows(seed))
    t = Thresholds()
    series = {rank: run.series(rank) for rank in run.ranks}
    walks = {rank: (MedianWalk(t.spike, t), MedianWalk(t.grad_spike, t), MedianWalk(t.straggler, t))
             for rank in run.ranks}
    f = Findings()
    cuts = [0, *sorted(rng.sample(range(1, 600), 12)), 600]
    for a, b in zip(cuts, cuts[1:]):
        block, views = [], {}
        for rank, view in series.items():
            recs = _Series(TableView(view.table, view.index[a:b]))
            views[rank] = recs
            loss, grad, time = walks[rank]
            block += anomalies._non_finite(rank, recs) + anomalies._flagged(rank, recs)
            block += _spikes(rank, recs, "loss", "spike", t.spike, t, walk=loss)
            block += _spikes(rank, recs, "grad_norm", "grad_spike", t.grad_spike, t, walk=grad)
            block += _slow_steps(rank, recs, t, walk=time, skip=max(t.skip_warmup - a, 0))
            context = max(a - t.window - 2, 0)
            whole = _Series(TableView(view.table, view.index[context:b]))
            block += lr_jumps_in(rank, whole.steps, whole.view.values("lr"), t, start=a - context)
        block += _rank_checks(views, t)
        f.add(block)
    expected = detect(run, thresholds=t)
    assert as_data(f.result()) == as_data(expected.result())
    assert f.omitted() == expected.omitted() != {}


def test_a_block_out_of_step_order_is_refused():
    f = Findings()
    f.add([Anomaly("nan", 10, "loss", "loss is NaN", [0])])
    f.add([anomalies.resume(0, 20, 5)])  # resume/stopped: any time
    with pytest.raises(ValueError, match="a finding at step 10, but the findings up to step 10 were added before"):
        f.add([Anomaly("nan", 10, "grad_norm", "grad_norm is NaN", [0])])
    f.add([], upto=50)  # a block with nothing found
    with pytest.raises(ValueError, match="a finding at step 50, but the findings up to step 50"):
        f.add([Anomaly("nan", 50, "loss", "loss is NaN", [0])])


def test_merge_adds_counts_of_runs_and_suffixes_once():
    runs = [Anomaly("nan", 1, "loss", "loss is NaN", [0], last_step=3, count=3),
            Anomaly("nan", 4, "loss", "loss is NaN", [0]),
            Anomaly("nan", 5, "loss", "loss is Inf", [0], last_step=9, count=5),
            Anomaly("nan", 1, "loss", "loss is NaN", [1], last_step=9, count=9)]
    (a,) = merge(runs)
    assert (a.step, a.last_step, a.count, a.ranks) == (1, 9, 9, [0, 1])
    assert a.message == "loss is NaN (steps 1..9, 9 steps)"
    assert runs[0].message == "loss is NaN" and runs[0].count == 3  # the inputs are not changed


def test_overlapping_runs_of_one_rank_are_one_run_over_their_steps():
    """Two rules flagging the same rank (slow against its history: 30..32, against the other ranks: 31..33)."""
    history = Anomaly("straggler", 30, "per_step_time", "step took 2500 ms", [1], last_step=32, count=3)
    ranks = Anomaly("straggler", 31, "per_step_time", "rank 1 took 2500 ms", [1], last_step=33, count=3)
    (a,) = merge([history, ranks])
    assert (a.step, a.last_step, a.count) == (30, 33, 4)
    assert a.message == "step took 2500 ms (steps 30..33, 4 steps)"
