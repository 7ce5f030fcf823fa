"""Every MindSpore Transformers step-line shape since 2023 (issue 36), terminal escapes (issue 35), and the
anomalies those lines carry. Each fixture is written here from the format string MF prints (cited per
fixture); none is copied from anyone's log. Expected values are read off the fixture text by hand."""
from __future__ import annotations

import json

import pytest

from mftk.logs.anomalies import find_anomalies
from mftk.logs.parse import parse_run
from tests.helpers.hostile import flat, mftk

# r0.6-r1.x MFLossMonitor.print_output_info (mindformers/core/callback/callback.py):
#   "Epoch:[%3d/%3d], step:[%5d/%5d], loss:[%5.3f/%5.3f], time:%5.3f ms, lr:%s, overflow cond: %s, loss_scale: %s"
# as the file logger writes it ("[%(levelname)s] %(asctime)s [%(filepath)s:%(lineno)d] %(funcName)s: %(message)s").
FILE_2023 = ("[INFO] 2023-08-01 10:00:{s:02d},000 [mindformers/core/callback/callback.py:318] print_output_info: "
             "Epoch:[  1/  1], step:[{step:5d}/  125], loss:[{loss:.3f}/{mean:.3f}], time:{ms:.3f} ms, "
             "lr:[{lr}], overflow cond: False, loss_scale: 16384.0")
# the same message behind the console logger's "%(asctime)s - mindformers - %(levelname)s - %(message)s"
CONSOLE_2023 = ("2023-08-01 10:00:{s:02d},000 - mindformers - INFO - Epoch:[  1/  2], step:[{step:5d}/    5], "
                "loss:[{loss:.3f}/{mean:.3f}], time:{ms:.3f} ms, lr:[{lr}], overflow cond: False, loss_scale: 1.0")
# r1.3-2.1.0: "{ Epoch:[%3d/%3d], step:[%5d/%5d], loss: %5.6f, per_step_time: %dms, lr: %s, overflow cond: %s,
# loss_scale: %s, global_norm: %s, train_throughput_per_npu: %.3fT" (sink mode), `loss:[%5.6f/%5.6f], ` otherwise
STATIC_2025 = ("2025-03-01 10:00:{s:02d},000 - mindformers[mindformers/core/callback/callback.py:747] - INFO - "
               "{{ Epoch:[  1/  1], step:[{step:5d}/   20], loss: {loss:.6f}, per_step_time: {ms}ms, lr: [{lr}], "
               "overflow cond: False, loss_scale: 1.0, global_norm: [{norm}], train_throughput_per_npu: 12.500T")
# The form of MF's monitor unit tests: an epoch without a total, a plain loss.
MONITOR = "{{Epoch:[  1], step:[{step:4d}/ 100], loss: {loss}, per_step_time: 10ms}}"
# MF's skip-data line (callback.py): "opt_global_step: %d, skip_data_grad_norm_threshold: %s, is_skip: %s"
SKIP = "2025-03-01 10:00:{s:02d},500 - mindformers[callback.py:1060] - INFO - opt_global_step: {step}, " \
       "skip_data_grad_norm_threshold: 3.0, is_skip: [ True]"


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_2023_file_logger_lines(tmp_path):
    lines = [FILE_2023.format(s=i, step=i, loss=2.5 - i / 10, mean=2.45, ms=1951.612 + i, lr="2.4499998e-06")
             for i in (1, 2, 3)]
    run = parse_run([write(tmp_path / "info.log", lines)])
    assert run.files[0].format == "mindformers" and [r["step"] for r in run.records] == [1, 2, 3]
    r = run.records[1]
    assert r["loss"] == 2.3 and r["per_step_time"] == 1953.612 and r["lr"] == 2.4499998e-06
    assert r["overflow_cond"] == 0 and r["loss_scale"] == 16384.0 and r["total_steps"] == 125
    assert find_anomalies(run) == []


def test_static_messages_without_any_logger_prefix(tmp_path):
    bare = [FILE_2023.format(s=0, step=1, loss=2.2, mean=2.2, ms=1951.612, lr="2.4499998e-06").split(": ", 1)[1],
            STATIC_2025.format(s=0, step=2, loss=2.1, ms=1752, lr="1e-05", norm="1.5").split(" - INFO - ")[1]]
    assert bare[0].startswith("Epoch:[") and bare[1].startswith("{ Epoch:[")
    run = parse_run([write(tmp_path / "bare.log", bare)])
    assert [(r["step"], r["loss"], r.get("grad_norm")) for r in run.records] == [(1, 2.2, None), (2, 2.1, 1.5)]


def test_2023_console_lines_make_steps_global_over_epochs(tmp_path):
    lines = [CONSOLE_2023.format(s=i, step=(i - 1) % 5 + 1, loss=3.0, mean=3.0, ms=100.0, lr="1e-05")
             for i in range(1, 8)]  # epoch 1 then the start of epoch 2, all printed `Epoch:[  1/  2]` here
    lines = [line.replace("Epoch:[  1/  2]", "Epoch:[  2/  2]") if i >= 5 else line for i, line in enumerate(lines)]
    run = parse_run([write(tmp_path / "console.log", lines)])
    assert [r["step"] for r in run.records] == [1, 2, 3, 4, 5, 6, 7] and run.records[0]["total_steps"] == 10


def test_2025_static_line_and_non_sink_loss(tmp_path):
    sink = STATIC_2025.format(s=1, step=1, loss=10.5, ms=1752, lr="1e-05", norm="1.508834")
    non_sink = sink.replace("loss: 10.500000", "loss:[10.400000/10.450000]").replace("step:[    1/", "step:[    2/")
    run = parse_run([write(tmp_path / "w.log", [sink, non_sink])])
    assert [(r["step"], r["loss"], r["grad_norm"], r["throughput"]) for r in run.records] == [
        (1, 10.5, 1.508834, 12.5), (2, 10.4, 1.508834, 12.5)]


def test_monitor_form_without_epoch_total(tmp_path):
    run = parse_run([write(tmp_path / "m.log", [MONITOR.format(step=s, loss=2.5) for s in (10, 20)])])
    assert [(r["step"], r["loss"], r["epoch"]) for r in run.records] == [(10, 2.5, 1), (20, 2.5, 1)]
    assert "total_steps" not in run.records[0]


def test_auto_format_still_picks_each(tmp_path):
    json_line = '{"step": 1, "loss": 2.0, "per_step_time": 5}'
    for lines, fmt in (([MONITOR.format(step=1, loss=2.5)], "mindformers"), ([json_line], "mftk")):
        run = parse_run([write(tmp_path / "x.log", ["banner Epoch starts", *lines])])
        assert run.files[0].format == fmt


@pytest.mark.parametrize("colour", ["around-value", "before-head", "whole-line"])
def test_ansi_colour_codes_are_stripped(tmp_path, colour):
    line = STATIC_2025.format(s=1, step=3, loss=4.25, ms=100, lr="1e-05", norm="2.0")
    coloured = {"around-value": line.replace("4.250000", "\x1b[1;31m4.250000\x1b[0m"),
                "before-head": line.replace("{ Epoch", "\x1b[32m{ \x1b[0mEpoch").replace("step:[", "\x1b[33mstep:["),
                "whole-line": "\x1b[36m" + line + "\x1b[0m\x1b]0;title\x07"}[colour]
    run = parse_run([write(tmp_path / "c.log", [coloured])])
    assert [(r["step"], r["loss"]) for r in run.records] == [(3, 4.25)] and run.files[0].malformed == 0


def test_a_field_that_is_not_one_number_is_left_out_and_flagged(tmp_path):
    good = STATIC_2025.format(s=1, step=1, loss=3.0, ms=100, lr="1e-05", norm="2.5")
    odd = STATIC_2025.format(s=2, step=2, loss=2.9, ms=100, lr="1e-05", norm="1 31049")
    run = parse_run([write(tmp_path / "w.log", [good, odd])])
    assert run.records[1]["grad_norm"] is None  # not 1
    (a,) = find_anomalies(run)
    assert (a.kind, a.step, a.field) == ("unread", 2, "global_norm") and "[1 31049]" in a.message


def test_skipped_steps_zero_loss_and_stop_at_the_end(tmp_path):
    lines = [STATIC_2025.format(s=s, step=s, loss=3.0 - s / 10, ms=100, lr="1e-05", norm="1.0") for s in (1, 2, 3)]
    lines.insert(2, SKIP.format(s=2, step=1))  # after step 2's line: step 2 was skipped
    lines.append(STATIC_2025.format(s=4, step=4, loss=0.0, ms=100, lr="1e-05", norm="1.0").replace(
        "global_norm: [1.0]", "global_norm: [9.0], is_skip: [ True]"))
    lines += ["Traceback (most recent call last):", '  File "run_mindformer.py", line 9, in <module>',
              "ValueError: Current global norm [9.] of step 4 has been 2 consecutive times greater than threshold "
              "3.0, stop training..."]
    run = parse_run([write(tmp_path / "w.log", lines)])
    found = {(a.kind, a.step) for a in find_anomalies(run)}
    assert found == {("skipped", 2), ("skipped", 4), ("zero_loss", 4), ("stopped", 4)}
    stop = next(a for a in find_anomalies(run) if a.kind == "stopped")
    assert "ValueError: Current global norm" in stop.message and "line 8" in stop.message


def test_an_exception_followed_by_more_steps_is_not_a_stop(tmp_path):
    lines = [STATIC_2025.format(s=1, step=1, loss=3.0, ms=100, lr="1e-05", norm="1.0"),
             "RuntimeError: a transient error the run recovered from",
             STATIC_2025.format(s=2, step=2, loss=2.9, ms=100, lr="1e-05", norm="1.0")]
    assert find_anomalies(parse_run([write(tmp_path / "w.log", lines)])) == []


def test_cli_fail_on_the_new_kinds(tmp_path):
    lines = [STATIC_2025.format(s=s, step=s, loss=0.0 if s == 3 else 2.0, ms=100, lr="1e-05", norm="1.0")
             for s in (1, 2, 3)]
    log = write(tmp_path / "w.log", lines)
    r = mftk("parse-log", str(log), "--fail-on", "zero_loss", "--json", "-")
    assert r.returncode == 3 and "anomalies found: zero_loss (steps 3)" in flat(r.stderr)
    assert [a["kind"] for a in json.loads(r.stdout)["anomalies"]] == ["zero_loss"]
