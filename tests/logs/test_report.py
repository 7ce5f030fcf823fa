"""parse_log end to end in the library: exports (CSV/JSON/JSONL), plots, --fail-on, follow."""
import csv
import json
import math

import pytest

from mftk.errors import AnomaliesFound, InputError
from mftk.logs.parse import parse_run
from mftk.logs.report import ParseOptions, follow_log, parse_log
from tests.helpers.logsynth import SEED_LINES, synth_lines


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "worker_0.log"
    path.write_text("\n".join(synth_lines(120, nan_at=(60,), spike_at=(90,), noise_every=7)) + "\n")
    return path


def test_injected_nan_and_spike_flagged_at_right_steps(log):
    report = parse_log([log])
    found = [(a.kind, a.step, a.field) for a in report.runs[0].anomalies]
    assert found == [("nan", 60, "loss"), ("nan", 60, "grad_norm"), ("spike", 90, "loss")]
    assert report.matched == []


def test_fail_on_raises_after_report(log):
    report = parse_log([log], ParseOptions(fail_on=["spike", "divergence"]))
    assert report.matched == ["spike"]
    with pytest.raises(AnomaliesFound) as info:
        report.raise_for_anomalies()
    assert info.value.kinds == ["spike"] and "steps 90" in info.value.message
    with pytest.raises(InputError, match="unknown --fail-on kind"):
        parse_log([log], ParseOptions(fail_on=["nans"]))


def test_json_export_shape_and_nan_as_null(log, tmp_path):
    out = tmp_path / "run.json"
    parse_log([log], ParseOptions(json=out))
    data = json.loads(out.read_text())  # strict JSON: no bare NaN
    assert set(data) >= {"steps", "summary", "anomalies"}
    step1, step60 = data["steps"][0], data["steps"][59]
    assert step1["step"] == 1 and step1["rank"] == 0 and step1["per_step_time"] == 5000
    assert set(step1) >= {"loss", "lr", "grad_norm", "throughput", "load_balancing_loss", "consumed_samples"}
    assert step60["loss"] is None and step60["grad_norm"] is None
    assert {"step": 60, "kind": "nan"}.items() <= data["anomalies"][0].items()
    assert data["summary"]["steps"] == 120 and data["summary"]["loss_first"] == step1["loss"]


def test_csv_and_jsonl_round_trip(log, tmp_path):
    csv_out, jsonl_out = tmp_path / "s.csv", tmp_path / "s.jsonl"
    parse_log([log], ParseOptions(csv=csv_out, jsonl=jsonl_out, metrics=["loss", "lr"]))
    rows = list(csv.DictReader(csv_out.open()))
    assert list(rows[0]) == ["step", "rank", "loss", "lr"] and len(rows) == 120
    assert rows[59]["loss"] == "NaN"
    again = parse_run([jsonl_out])  # our JSONL export is readable as an mftk metrics log
    assert again.files[0].format == "mftk" and len(again.records) == 120
    original = parse_run([log]).records
    assert again.records[5]["loss"] == original[5]["loss"] and math.isnan(again.records[59]["loss"])


def test_unknown_metric_is_a_clear_error(log):
    with pytest.raises(InputError, match="--metrics: los not in the log") as info:
        parse_log([log], ParseOptions(metrics=["los"]))
    assert "grad_norm" in info.value.hint


def test_plot_written_and_compare(log, tmp_path):
    other = tmp_path / "b.log"
    other.write_text("\n".join(synth_lines(80, seed=5)) + "\n")
    png = tmp_path / "cmp.png"
    report = parse_log([log, other], ParseOptions(compare=True, plot=png, x="samples"))
    assert len(report.runs) == 2 and png.stat().st_size > 10_000
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(report.to_json()) == {"runs"}
    with pytest.raises(InputError, match="--seq-length"):
        parse_log([log], ParseOptions(plot=tmp_path / "t.png", x="tokens"))
    assert not (tmp_path / "t.png").exists()
    seed = tmp_path / "seed.log"
    seed.write_text("\n".join(SEED_LINES) + "\n")  # no consumed_samples in these lines
    with pytest.raises(InputError, match="no consumed_samples"):
        parse_log([seed], ParseOptions(plot=tmp_path / "s.png", x="samples"))
    assert not list(tmp_path.glob("*s.png*"))  # no temp file or partial PNG left behind


def test_export_to_missing_directory_is_clear(log, tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        parse_log([log], ParseOptions(csv=tmp_path / "nope" / "a.csv"))


def test_follow_sees_lines_appended_between_polls(tmp_path):
    path = tmp_path / "w.log"
    lines = synth_lines(6)
    path.write_text("\n".join(lines[:2]) + "\n")
    seen = []

    def fake_sleep(_):  # the "training" appends two more steps between polls
        done = sum(1 for _ in open(path))
        with open(path, "a") as f:
            f.write("".join(line + "\n" for line in lines[done:done + 2]))

    report = follow_log([path], on_update=lambda r: seen.append(r.runs[0].summary.last_step), poll_s=0,
                        max_updates=3, sleep=fake_sleep)
    assert seen == [2, 4, 6] and report.runs[0].summary.steps == 6


def test_follow_times_out_on_a_log_that_never_gets_steps(tmp_path):
    path = tmp_path / "w.log"
    path.write_text("")
    with pytest.raises(Exception, match="empty"):
        follow_log([path], on_update=lambda r: None, poll_s=0.01, timeout_s=0.05)
