"""parse-log on real-world logs (issue 21, item 7): what crashed and shared runs leave behind.

A crashed run's log ends in zero-filled blocks (the file grew; its data never reached the disk); a
followed log gets truncated and rewritten by a restarted job; msrun's console or ``cat worker_*.log``
interleaves several ranks' step lines (which name no rank) in one file; an export goes somewhere it
cannot be written. None of these is an error in the log, and none may end in a traceback.
"""
from __future__ import annotations

import json

import pytest

from mftk.logs.parse import parse_run
from mftk.logs.report import ParseOptions, follow_log
from tests.helpers.hostile import assert_clean_failure, flat, mftk
from mftk.logs.format import format_step_line
from tests.helpers.logsynth import PREFIX, step_metrics, synth_lines


def _text(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode()


# -- a crashed run's NUL tail ------------------------------------------------------------------------

@pytest.mark.parametrize("tail", [b"\0" * 4096, b"\0" * 3, b"\0" * 700 + b"\n"], ids=["block", "short", "line"])
def test_nul_tail_of_a_crashed_run_is_skipped_with_a_note(tmp_path, tail):
    log = tmp_path / "worker_0.log"
    log.write_bytes(_text(synth_lines(20)) + tail)
    r = mftk("parse-log", str(log), "--json", "-")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert [s["step"] for s in data["steps"]] == list(range(1, 21))
    assert f"{tail.count(0):,} NUL byte(s) skipped" in flat(r.stderr) and "Traceback" not in r.stderr


def test_nul_hole_then_a_resumed_writer(tmp_path):
    """The crash left a zero-filled block; the restarted run appended after it (and mid-line)."""
    log = tmp_path / "worker_0.log"
    first, later = synth_lines(10), synth_lines(5, start=8, seed=3, total=12)
    log.write_bytes(_text(first)[:-20] + b"\0" * 4096 + _text(later))
    run = parse_run([log])
    assert [r["step"] for r in run.series(0)] == list(range(1, 13))
    assert run.files[0].nul_bytes == 4096


def test_a_binary_file_is_still_refused(tmp_path):
    for head in (b"MMIDIDX\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00", b"\x48\x01\x00\x00\x00\x00\x00\x00{\"w\"",
                 b"\x00\x01binary"):
        f = tmp_path / "data.bin"
        f.write_bytes(head + b"x" * 100)
        assert_clean_failure(mftk("parse-log", str(f)), 1, "looks like a binary file (NUL byte at offset")


# -- --follow and a truncated log ---------------------------------------------------------------------

def test_follow_drops_rows_from_before_the_file_was_truncated(tmp_path):
    log = tmp_path / "worker_0.log"
    log.write_bytes(_text(synth_lines(30)))
    restarted = _text(synth_lines(4, seed=9, total=4))  # a new job writes a fresh, shorter log in its place
    polls = {"n": 0}

    def sleep(_):
        polls["n"] += 1
        if polls["n"] == 1:
            log.write_bytes(restarted)

    seen = []
    report = follow_log([log], ParseOptions(), on_update=lambda rep: seen.append(rep.runs[0].summary.steps),
                        poll_s=0, max_updates=2, sleep=sleep)
    assert seen == [30, 4]
    run = report.runs[0].run
    assert [r["step"] for r in run.records] == [1, 2, 3, 4]
    assert report.runs[0].anomalies == []  # not a "resume": the old rows are gone, not replayed
    assert any("truncated or replaced while followed" in w for w in run.warnings)


def test_follow_keeps_appending_rows_of_a_growing_log(tmp_path):
    log = tmp_path / "worker_0.log"
    lines = synth_lines(6)
    log.write_bytes(_text(lines[:3]))

    def sleep(_):
        with open(log, "ab") as f:
            f.write(_text(lines[3:]))

    report = follow_log([log], ParseOptions(), on_update=lambda rep: None, poll_s=0, max_updates=2, sleep=sleep)
    assert [r["step"] for r in report.runs[0].run.records] == list(range(1, 7))


# -- several ranks in one file -------------------------------------------------------------------------

def _rank_lines(rank: int, steps: int) -> list[str]:
    """One data-parallel rank's step lines: the (reduced) loss every rank logs, its own step time."""
    out = []
    for step in range(1, steps + 1):
        m = step_metrics(step)
        m["per_step_time"] = 700 + 10 * rank + step % 3
        out.append(PREFIX.format(s=step % 60, ms=rank) + format_step_line(m, total_steps=steps))
    return out


def _interleaved(ranks: int, steps: int, lag: int = 0) -> list[str]:
    """What msrun's console shows: each rank's lines, arriving in lockstep (odd ranks ``lag`` steps late)."""
    per_rank = [_rank_lines(r, steps) for r in range(ranks)]
    events = sorted((i + (lag if r % 2 else 0), r, i) for r in range(ranks) for i in range(steps))
    return [per_rank[r][i] for _, r, i in events]


@pytest.mark.parametrize("ranks,lag", [(2, 0), (4, 0), (2, 1)])
def test_interleaved_ranks_are_split_not_merged(tmp_path, ranks, lag):
    log = tmp_path / "msrun_console.log"
    log.write_bytes(_text(_interleaved(ranks, 25, lag)))
    r = mftk("parse-log", str(log), "--fail-on", "resume", "--json", "-")
    assert r.returncode == 0, r.stderr  # before: dozens of false "step went back" anomalies (exit 3)
    data = json.loads(r.stdout)
    assert data["anomalies"] == [] and data["summary"]["ranks"] == list(range(ranks))
    assert f"read as {ranks} ranks interleaved in one file" in flat(r.stderr)
    run = parse_run([log])
    for rank in range(ranks):  # each rank's own lines, in order
        assert [x["per_step_time"] for x in run.series(rank)] == [700 + 10 * rank + s % 3 for s in range(1, 26)]


def test_a_real_resume_in_one_file_is_still_a_resume(tmp_path):
    log = tmp_path / "w.log"
    log.write_bytes(_text(synth_lines(10) + synth_lines(4, start=7, seed=5, total=10)))
    r = mftk("parse-log", str(log), "--fail-on", "resume")
    assert_clean_failure(r, 3, "anomalies found: resume")
    log.write_bytes(_text(synth_lines(10) + synth_lines(10, seed=5)))  # a restart from scratch in the same file
    run = parse_run([log])
    assert run.ranks == [0] and run.files[0].interleaved == 0


# -- exports that cannot be written ---------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--csv", "--json", "--jsonl", "--plot"])
@pytest.mark.parametrize("where", ["missing-dir", "a-dir", "under-a-file", "proc"])
def test_unwritable_export_is_refused_before_reading(tmp_path, flag, where):
    log = tmp_path / "worker_0.log"
    log.write_bytes(_text(synth_lines(5)))
    (tmp_path / "file").write_text("x")
    target = {"missing-dir": tmp_path / "nope" / "out", "a-dir": tmp_path, "under-a-file": tmp_path / "file" / "out",
              "proc": "/proc/mftk-out"}[where]
    r = mftk("parse-log", str(log), flag, str(target))
    why = {"missing-dir": "does not exist", "a-dir": "it is a directory", "under-a-file": "does not exist",
           "proc": ""}[where]
    assert_clean_failure(r, 2, f"cannot write {target}", why)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "worker_0.log"]


# -- a rotated followed log, and two ranks' logs concatenated (issue 35) -------------------------------

def test_follow_a_rotated_log_keeps_every_step_and_says_so(tmp_path):
    log = tmp_path / "f.log"
    lines = synth_lines(10)
    log.write_bytes(_text(lines[:4]))
    polls = {"n": 0}

    def sleep(_):
        polls["n"] += 1
        if polls["n"] == 1:
            with open(log, "ab") as f:  # written after the last read, just before the rotation
                f.write(_text(lines[4:7]))
            log.rename(tmp_path / "f.log.1")  # mv f.log f.log.1; the job goes on in a new f.log
            log.write_bytes(_text(lines[7:]))

    report = follow_log([log], ParseOptions(), on_update=lambda rep: None, poll_s=0, max_updates=2, sleep=sleep)
    run = report.runs[0].run
    assert [r["step"] for r in run.records] == list(range(1, 11))  # before: 1..4 then nothing (old offset)
    assert run.files[0].rotations == 1 and report.runs[0].anomalies == []
    assert any("rotated while followed" in w and "new one from its start" in w for w in run.warnings)


def test_two_ranks_logs_concatenated_are_two_ranks_not_a_resume(tmp_path):
    log = tmp_path / "all.log"
    rank0, rank1 = _rank_lines(0, 12), _rank_lines(1, 12)  # one job: both logs span the same minutes
    log.write_bytes(_text(rank0 + rank1))  # cat worker_0.log worker_1.log > all.log
    r = mftk("parse-log", str(log), "--fail-on", "resume", "--json", "-")
    assert r.returncode == 0, r.stderr  # before: "step went back from 12 to 1: a resumed run" (exit 3)
    data = json.loads(r.stdout)
    assert data["summary"]["ranks"] == [0, 1] and data["anomalies"] == []
    assert "several logs appended into one file" in flat(r.stderr) and "read from there as rank 1" in flat(r.stderr)
    run = parse_run([log])
    assert [x["per_step_time"] for x in run.series(1)] == [710 + s % 3 for s in range(1, 13)]
