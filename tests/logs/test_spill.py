"""A log longer than a segment is spilled to disk and analyzed a segment at a time (mftk.logs.spill, .stream):
the held state stays under a fixed bound whatever the number of steps, and the outputs are those of the
in-memory path (the reference here: the same log read with no spilling)."""
import json
import random

import numpy as np
import pytest

from mftk.logs import parse
from mftk.logs.report import ParseOptions, parse_log
from mftk.logs.stream import Downsample, HeadTail, _Times, percentiles, select
from mftk.logs.summary import percentile
from mftk.logs.table import TableView, as_table
from tests.helpers.logsynth import synth_lines

SEGMENT = 256  # rows per segment in these tests (the real one is 1M)


@pytest.fixture
def small_segments(monkeypatch):
    """Segments of `SEGMENT` rows, read 16 KiB at a time (about 60 lines), so a few thousand steps spill."""
    monkeypatch.setattr(parse, "SEGMENT_ROWS", SEGMENT)
    monkeypatch.setattr(parse, "READ_CHUNK", 16 << 10)


def _spills(run):
    return [spill for spills in run.spills.values() for spill in spills]


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def _report(log, tmp_path, tag, **kw):
    out = tmp_path / tag
    out.mkdir()
    options = ParseOptions(csv=out / "s.csv", jsonl=out / "s.jsonl", json=out / "s.json", **kw)
    return parse_log([log], options), out


def _same_report(log, tmp_path, monkeypatch, **kw):
    """The in-memory report, then the spilled one; their exports and findings compared."""
    exact, exact_out = _report(log, tmp_path, "exact", **kw)
    assert not exact.runs[0].run.spilled
    monkeypatch.setattr(parse, "SEGMENT_ROWS", SEGMENT)
    monkeypatch.setattr(parse, "READ_CHUNK", 16 << 10)
    spilled, spilled_out = _report(log, tmp_path, "spilled", **kw)
    run = spilled.runs[0].run
    assert run.spilled and sum(len(s.paths) for s in _spills(run)) >= 5
    for name in ("s.csv", "s.jsonl"):
        assert (spilled_out / name).read_text() == (exact_out / name).read_text()
    a, b = json.loads((exact_out / "s.json").read_text()), json.loads((spilled_out / "s.json").read_text())
    assert b["steps"] == a["steps"] and b["anomalies"] == a["anomalies"]
    assert spilled.runs[0].anomalies == exact.runs[0].anomalies
    s, e = spilled.runs[0].summary, exact.runs[0].summary
    for field in ("steps", "first_step", "last_step", "total_steps", "ranks", "warmup_skipped", "loss_first",
                  "loss_last", "loss_min", "loss_min_step", "throughput_coarse"):
        assert getattr(s, field) == getattr(e, field), field
    for key in ("p50", "p90", "p99", "max"):
        assert s.step_time_ms[key] == e.step_time_ms[key], key
    assert s.step_time_ms["mean"] == pytest.approx(e.step_time_ms["mean"], rel=1e-12)
    assert s.throughput_tflops == pytest.approx(e.throughput_tflops, rel=1e-12)
    assert s.samples_per_s == pytest.approx(e.samples_per_s, rel=1e-12)
    notes = [n for n in s.notes if "held in memory" not in n]  # (what the spilled run could not spill)
    assert notes[:-1] == e.notes and "a segment at a time" in notes[-1]
    rows_e, rows_s = exact.runs[0].series, spilled.runs[0].series
    assert len(rows_s) == len(rows_e)
    assert rows_s[:8] == rows_e[:8] and rows_s[-8:] == rows_e[-8:]
    return exact, spilled


def test_spilled_outputs_equal_the_in_memory_ones(tmp_path, monkeypatch):
    # spikes every 37 steps (some in the first steps of a segment, where the rolling median needs the previous
    # segment's values), two in a row, and NaN
    spikes = {*range(150, 3000, 37), 700, 701}
    lines = synth_lines(3000, nan_at=(500, 1201), spike_at=spikes, noise_every=9)
    exact, _ = _same_report(_write(tmp_path / "worker_0.log", lines), tmp_path, monkeypatch)
    kinds = {(a.kind, a.step) for a in exact.runs[0].anomalies}
    assert {("spike", 150), ("spike", 187), ("spike", 700), ("nan", 500)} <= kinds


def test_a_resume_into_spilled_steps_keeps_the_later_lines(tmp_path, monkeypatch):
    lines = synth_lines(1500, spike_at=(1400,)) + synth_lines(1000, start=1001, total=2000, seed=1)
    exact, spilled = _same_report(_write(tmp_path / "worker_0.log", lines), tmp_path, monkeypatch)
    assert [a.step for a in exact.runs[0].anomalies if a.kind == "resume"] == [1001]
    assert exact.runs[0].summary.steps == 2000  # the replaced steps 1001..1500 counted once


def _held(run):
    """What a spilled run keeps in memory: the rows read since its last segment."""
    return run.records.n


@pytest.mark.parametrize("steps", [1_000, 8_000])
def test_rows_held_stay_bounded_whatever_the_steps(tmp_path, small_segments, steps):
    log = _write(tmp_path / "worker_0.log", synth_lines(steps))
    report = parse_log([log], ParseOptions())
    run = report.runs[0].run
    assert sum(s.rows for s in _spills(run)) + _held(run) == steps  # every step read, nearly all of them on disk
    assert _held(run) < SEGMENT + 100  # a segment plus one 16 KiB read (~60 lines): not growing with `steps`
    rows = report.runs[0].series
    assert len(rows) == steps and len(rows.head) + len(rows.tail) <= 2 * rows.keep


@pytest.mark.parametrize("n", [5_000, 50_000])
def test_plot_buckets_stay_bounded_and_keep_a_spike(n):
    loss = np.linspace(5, 3, n)
    loss[n // 3] = 50.0  # one step's spike
    table = as_table([{"step": i + 1, "loss": float(v)} for i, v in enumerate(loss)])
    sample = Downsample(buckets=16)
    for start in range(0, n, 1000):  # views of 1000 rows, as segments are fed
        sample.feed(TableView(table, np.arange(start, min(start + 1000, n))))
    assert len(sample.buckets) <= 32 and len(sample.series()) <= 64
    steps = [r["step"] for r in sample.series()]
    assert n // 3 + 1 in steps and steps == sorted(steps)
    assert max(r["loss"] for r in sample.series()) == 50.0 and min(r["loss"] for r in sample.series()) == 3.0


def test_head_tail_holds_both_ends_only():
    table = as_table([{"step": i} for i in range(1, 5001)])
    rows = HeadTail(keep=10)
    for start in range(0, 5000, 700):
        rows.feed(TableView(table, np.arange(start, min(start + 700, 5000))))
    assert len(rows) == 5000 and len(rows.head) == len(rows.tail) == 10
    assert [r["step"] for r in rows[:3]] == [1, 2, 3] and [r["step"] for r in rows[-2:]] == [4999, 5000]
    assert [i for i, _ in rows.indexed()] == list(range(10)) + list(range(4990, 5000))
    with pytest.raises(IndexError):
        rows[2500]


@pytest.mark.parametrize("kind", ["float", "int"])
def test_percentiles_from_disk_equal_numpy(kind):
    rng = random.Random(3)
    if kind == "int":
        values = np.array([rng.randint(-5, 900) for _ in range(30_001)], dtype=np.float64)  # many equal values
    else:
        values = np.array([rng.gauss(0, 1e3) for _ in range(30_001)] + [0.0, -0.0, 1e-300, -1e300])
    times = _Times()
    for chunk in np.array_split(values, 7):
        times.add(chunk)
    got = percentiles(times, (0, 50, 90, 99, 100))
    ordered = np.sort(values)  # the order statistics from NumPy's sort; the in-memory path's interpolation
    for q in (0, 50, 90, 99, 100):
        assert got[f"p{q}"] == percentile(ordered, q)
        assert got[f"p{q}"] == pytest.approx(np.percentile(values, q), rel=1e-14)
    assert select(times.chunks, [0, len(values) - 1]) == {0: values.min(), len(values) - 1: values.max()}
    times.file.close()


def test_cli_on_a_spilled_log_table_every_and_plot(tmp_path, small_segments):
    from commands.app import app
    from tests.helpers.cli import runner

    log = _write(tmp_path / "worker_0.log", synth_lines(3000, spike_at=(2000,)))
    png = tmp_path / "run.png"
    result = runner.invoke(app, ["parse-log", str(log), "--rows", "3", "--plot", str(png)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "3000" in result.output and "2998" in result.output and "a segment at a time" in result.output
    assert png.stat().st_size > 10_000
    result = runner.invoke(app, ["parse-log", str(log), "--every", "500"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    shown = [int(line.split()[1]) for line in result.output.splitlines()
             if line.startswith("│") and line.split()[1].isdigit()]
    # held rows only, the first and last 1000 (the note says so); then the anomaly table's spike
    assert shown == [1, 501, 2001, 2501, 3000, 2000]
    result = runner.invoke(app, ["parse-log", str(log), "--json", "-"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [r["step"] for r in data["steps"]] == list(range(1, 3001))  # every step, read back from the segments
    assert [(a["kind"], a["step"]) for a in data["anomalies"]] == [("spike", 2000)]


@pytest.mark.parametrize("indent", [1, 2])
def test_json_written_lazily_is_json_dumps_text(indent):
    import io

    from mftk.logs.export import write_json

    payload = {"runs": [{"name": "a", "steps": [{"step": 1, "loss": 2.5}, {"step": 2, "v": [1, {"x": None}]}],
                         "summary": {"p50": 1.0}}, {"name": "b", "steps": [], "warnings": []}]}
    lazy = {"runs": [{**run, "steps": iter(run["steps"])} for run in payload["runs"]]}
    out = io.StringIO()
    write_json(out, lazy, indent)
    assert out.getvalue() == json.dumps(payload, indent=indent) + "\n"


def _odd_lines(n):
    """Step lines with lr jumps on every step of a range, grad-norm spikes and slow steps every few dozen steps
    (some on segment edges)."""
    from mftk.logs.format import format_step_line
    from tests.helpers.logsynth import prefix_at, step_metrics

    out = []
    for step in range(1, n + 1):
        m = step_metrics(step)
        if 300 <= step <= 1500 and step % 2:
            m["lr"] *= 4  # up and down every step, across several segment edges: one long run of lr jumps
        if step % 53 == 0:
            m["grad_norm"] *= 10
        if step % 59 == 0:
            m["per_step_time"] *= 5
        out.append(prefix_at(step) + format_step_line(m, total_steps=n))
    return out


def test_spilled_lr_grad_and_time_checks_equal_the_in_memory_ones(tmp_path, monkeypatch):
    exact, _ = _same_report(_write(tmp_path / "worker_0.log", _odd_lines(2500)), tmp_path, monkeypatch)
    kinds = {a.kind for a in exact.runs[0].anomalies}
    assert {"lr_jump", "grad_spike", "straggler"} <= kinds
    assert [(a.step, a.last_step) for a in exact.runs[0].anomalies if a.kind == "lr_jump"] == [(301, 1500)]  # up at 301 (odd), down at 1500


def test_compare_of_spilled_runs_exports_as_in_memory(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = _write(tmp_path / "a" / "worker_0.log", synth_lines(900))
    b = _write(tmp_path / "b" / "worker_0.log", synth_lines(700, seed=2, spike_at=(400,)))

    def exports(tag):
        out = tmp_path / tag
        out.mkdir()
        report = parse_log([a, b], ParseOptions(compare=True, csv=out / "s.csv", jsonl=out / "s.jsonl"))
        return report, (out / "s.csv").read_text(), (out / "s.jsonl").read_text()

    exact = exports("exact")
    monkeypatch.setattr(parse, "SEGMENT_ROWS", SEGMENT)
    monkeypatch.setattr(parse, "READ_CHUNK", 16 << 10)
    spilled = exports("spilled")
    assert all(r.run.spilled for r in spilled[0].runs)
    assert spilled[1:] == exact[1:] and ",run," in spilled[1].splitlines()[0]
    assert [r.anomalies for r in spilled[0].runs] == [r.anomalies for r in exact[0].runs]


def test_spilling_goes_on_after_resumes_with_the_in_memory_outputs(tmp_path, monkeypatch):
    # a run to 1500, a resume from 1001 that dies at 1200, a resume from 1101 to 3000 (every step replaced);
    # then one from 2401 logging every other step: the even steps 2402..3000 of the run before stay in the series
    lines = (synth_lines(1500, spike_at=(1400,)) + synth_lines(200, start=1001, total=3000, seed=1)
             + synth_lines(1900, start=1101, total=3000, seed=2, spike_at=(2000,))
             + synth_lines(1200, start=2401, total=3600, seed=3)[::2])
    exact, spilled = _same_report(_write(tmp_path / "worker_0.log", lines), tmp_path, monkeypatch)
    resumes = [(a.reference, a.step) for a in exact.runs[0].anomalies if a.kind == "resume"]
    assert resumes == [(1500, 1001), (1200, 1101), (3000, 2401)]
    assert exact.runs[0].summary.steps == 3000 + 300  # 1..3000 once, and the odd steps 3001..3599
    run = spilled.runs[0].run
    assert run.spills[0][0].sequence == 3 and run.spills[0][0].resumes == resumes  # every resume spilled, none held
    assert _held(run) < SEGMENT + 100
    steps = [r["step"] for r in json.loads((tmp_path / "spilled" / "s.json").read_text())["steps"]]
    assert steps == [*range(1, 3001), *range(3001, 3600, 2)]


@pytest.mark.parametrize("steps", [1_000, 8_000])
def test_rows_held_stay_bounded_across_resumes(tmp_path, small_segments, steps):
    # three runs, each resumed from the middle of the one before
    half = steps // 2
    lines = (synth_lines(steps) + synth_lines(steps, start=half + 1, seed=1)
             + synth_lines(steps, start=steps + 1, seed=2))
    run = parse_log([_write(tmp_path / "worker_0.log", lines)], ParseOptions()).runs[0].run
    assert sum(s.rows for s in _spills(run)) + _held(run) == 3 * steps
    assert run.spills[0][0].resumes == [(steps, half + 1), (half + steps, steps + 1)]
    assert _held(run) < SEGMENT + 100  # not growing with `steps`, resumes or not


def _rank_dir(tmp_path, logs):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for rank, lines in enumerate(logs):
        _write(run_dir / f"worker_{rank}.log", lines)
    return run_dir


def test_several_files_spill_with_the_in_memory_outputs(tmp_path, monkeypatch):
    # one log per rank (msrun's worker_N.log): each file spills its share; rank 0's spike at 300 and rank 1's at
    # 900 are divergences found across spilled segments; rank 2 stops early with a NaN
    run_dir = _rank_dir(tmp_path, [synth_lines(1500, spike_at=(300,)), synth_lines(1500, spike_at=(900,)),
                                   synth_lines(1400, nan_at=(1000,))])
    exact, spilled = _same_report(run_dir, tmp_path, monkeypatch)
    run = spilled.runs[0].run
    assert run.ranks == exact.runs[0].run.ranks == [0, 1, 2] and sorted(run.spills) == [0, 1, 2]
    found = {(a.kind, a.step, tuple(a.ranks)) for a in exact.runs[0].anomalies}
    assert {("divergence", 300, (0,)), ("divergence", 900, (1,)), ("nan", 1000, (2,))} <= found
    assert not [n for n in spilled.runs[0].summary.notes if "held in memory" in n]


def test_a_non_last_stage_spilled_first_is_not_primary(tmp_path, monkeypatch):
    # rank 0 is a non-last pipeline stage (its loss is `N/A`): rank 1 is the primary rank, spilled or not
    rank0 = [line.replace("loss: ", "loss: N/A, was: ") for line in synth_lines(1200)]
    exact, spilled = _same_report(_rank_dir(tmp_path, [rank0, synth_lines(1200)]), tmp_path, monkeypatch)
    assert spilled.runs[0].summary.primary_rank == exact.runs[0].summary.primary_rank == 1


@pytest.mark.parametrize("steps", [1_000, 8_000])
def test_rows_held_stay_bounded_for_several_files(tmp_path, small_segments, steps):
    run = parse_log([_rank_dir(tmp_path, [synth_lines(steps, seed=r) for r in range(3)])],
                    ParseOptions()).runs[0].run
    assert sum(s.rows for s in _spills(run)) + _held(run) == 3 * steps
    assert _held(run) < 3 * (SEGMENT + 100)  # each file's share: not growing with `steps`


def _interleaved(a, b, late_every=10):
    """Two ranks' lines in one file as a console shows them: rank 1's line of every `late_every`-th step comes
    after rank 0's next one (the lockstep lag `split_interleaved` allows)."""
    out, late = [], None
    for i, line in enumerate(a):
        out.append(line)
        if late is not None:
            out.append(late)
            late = None
        if i < len(b):
            if i % late_every == 3:
                late = b[i]
            else:
                out.append(b[i])
    return out + ([late] if late else [])


@pytest.mark.parametrize("steps", [1_500, 8_000])
def test_interleaved_ranks_spill_with_the_in_memory_outputs(tmp_path, monkeypatch, steps):
    # msrun's console: two ranks' step lines in one file, rank 1 a step late now and then, its loss spiking at 700;
    # rank 0 logs one more step than rank 1 (a stop cuts the last one short)
    lines = _interleaved(synth_lines(steps + 1), synth_lines(steps, spike_at=(700,)))
    exact, spilled = _same_report(_write(tmp_path / "console.log", lines), tmp_path, monkeypatch)
    run = spilled.runs[0].run
    assert run.ranks == exact.runs[0].run.ranks == [0, 1] and sorted(run.spills) == [0, 1]
    found = {(a.kind, a.step, tuple(a.ranks)) for a in exact.runs[0].anomalies}
    assert ("spike", 700, (1,)) in found and 700 in {a.step for a in exact.runs[0].anomalies if a.kind == "divergence"}
    assert run.files[0].interleaved == exact.runs[0].run.files[0].interleaved == 2
    assert _held(run) < 2 * SEGMENT + 100
    assert not [n for n in spilled.runs[0].summary.notes if "held in memory" in n]


def test_what_is_not_bounded_says_so(tmp_path, small_segments):
    # steps that go back every third line, not in lockstep: neither resumes nor ranks to tell apart as they
    # are read, so they are held, and the summary says why
    lines = [line for k in range(300) for line in synth_lines(3, start=k + 1, seed=k)]
    log = _write(tmp_path / "w.log", lines)
    report = parse_log([log], ParseOptions())
    assert [n for n in report.runs[0].summary.notes if "held in memory" in n] == [
        f"{log}: 900 steps held in memory (steps that go back too often to be a resume, and not ranks in "
        "lockstep): parse-log bounds memory for files of one rank (resumes allowed), ranks interleaved in lockstep "
        "and logs appended one after another"]
    assert not report.runs[0].run.spilled


def test_a_log_appended_after_spilled_steps_is_another_rank(tmp_path, monkeypatch):
    # rank 1's log appended (`cat`) after 1500 steps of rank 0, which were spilled: rank 1 is told apart (the
    # clock went back) and checked against rank 0's spilled steps (its spike at 900 is a divergence)
    lines = synth_lines(1500, spike_at=(1400,)) + synth_lines(1200, spike_at=(900,))
    exact, spilled = _same_report(_write(tmp_path / "worker_0.log", lines), tmp_path, monkeypatch)
    assert exact.runs[0].run.ranks == spilled.runs[0].run.ranks == [0, 1]
    assert ("divergence", 900) in {(a.kind, a.step) for a in spilled.runs[0].anomalies}
    run = spilled.runs[0].run
    assert sorted(run.spills) == [0, 1] and _held(run) < SEGMENT + 100  # both logs' steps spilled
    assert not [n for n in spilled.runs[0].summary.notes if "held in memory" in n]
    assert run.files[0].concatenated == exact.runs[0].run.files[0].concatenated == [
        "step 1500 -> 1 with the time going back: read from there as rank 1"]


def test_follow_of_rank_logs_spills_with_the_outputs_of_one_parse(tmp_path, small_segments):
    # `--follow` on a directory of two rank logs growing 400 steps a poll: both spill their share as they grow,
    # and the last report equals one parse of the finished logs (summary and anomalies)
    from mftk.logs.report import follow_log

    logs = [synth_lines(2000, spike_at=(1500,)), synth_lines(2000, nan_at=(300,))]
    run_dir = _rank_dir(tmp_path, [lines[:400] for lines in logs])

    def grow(_):
        for rank, lines in enumerate(logs):
            path = run_dir / f"worker_{rank}.log"
            done = sum(1 for _ in open(path))
            with open(path, "a") as f:
                f.write("".join(line + "\n" for line in lines[done:done + 400]))

    followed = follow_log([run_dir], on_update=lambda r: None, poll_s=0, max_updates=5, sleep=grow)
    assert followed.runs[0].run.spilled and sorted(followed.runs[0].run.spills) == [0, 1]
    once = parse_log([run_dir], ParseOptions())
    assert followed.runs[0].anomalies == once.runs[0].anomalies
    a, b = followed.runs[0].summary, once.runs[0].summary
    assert (a.steps, a.last_step, a.ranks, a.loss_last, a.step_time_ms) == (b.steps, b.last_step, b.ranks,
                                                                              b.loss_last, b.step_time_ms)


def test_findings_past_the_cap_are_counted_alike_spilled_or_not(tmp_path, monkeypatch):
    # a loss spike every other step (never consecutive: one finding each): 10 listed per kind, the rest counted
    # with their step range, the same whether the log was read whole or a segment at a time
    from mftk.logs import anomalies

    monkeypatch.setattr(anomalies, "MAX_LISTED", 10)
    exact, spilled = _same_report(_write(tmp_path / "worker_0.log", synth_lines(3000, spike_at=range(100, 3000, 2))),
                                  tmp_path, monkeypatch)
    spikes = [a.step for a in spilled.runs[0].anomalies if a.kind == "spike"]
    assert spikes == list(range(100, 120, 2))
    assert "1,440 more spike findings (steps 120..2,998) not listed" in spilled.runs[0].summary.notes
