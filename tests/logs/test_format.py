"""The MF step line: writer vs the reference's documented example, and the round trip."""
import logging
import math
import re

import pytest

from mftk.logs.format import (NON_LAST_STAGE_LOSS, format_metrics_record, format_step_line, mf_formatter,
                              parse_metrics_record, parse_number, parse_step_line)
from tests.helpers.logsynth import SEED_LINES

# Reference §2.9's example line, character for character.
REF_LINE = ("{ step:[    1/   10], consumed_samples: 2, global_batch_size: 2, loss:  11.855703, per_step_time:   1234ms, "
            "load_balancing_loss:   1.000512, mtp_1_loss:   3.556100, lr: 1.000000e-05, grad_norm:   4.123456, "
            "throughput:   0.53T }")
REF_METRICS = {"step": 1, "consumed_samples": 2, "global_batch_size": 2, "loss": 11.855703, "per_step_time": 1234,
               "load_balancing_loss": 1.000512, "mtp_1_loss": 3.5561, "lr": 1e-5, "grad_norm": 4.123456,
               "throughput": 0.53}


def test_writer_matches_reference_example():
    assert format_step_line(REF_METRICS, total_steps=10) == REF_LINE


def test_reference_system_test_regex_finds_main_loss():
    # the reference's own tests: re.search(r"loss:\s+(\d+\.\d+)") must hit the main loss first
    line = format_step_line({**REF_METRICS, "load_balancing_loss": 0.5}, total_steps=10)
    assert re.search(r"loss:\s+(\d+\.\d+)", line).group(1) == "11.855703"


def test_round_trip():
    parsed = parse_step_line("2025-06-01 10:00:00,001 - mindformers[x.py:337] - INFO - " + REF_LINE)
    assert parsed == {**REF_METRICS, "total_steps": 10}


def test_field_order_and_optional_fields():
    m = {"step": 3, "consumed_samples": 6, "global_batch_size": 2, "loss": 2.5, "per_step_time": 7,
         "mtp_2_loss": 0.2, "mtp_1_loss": 0.1, "indexer_loss": 0.3, "grad_norm": 1.0}
    line = format_step_line(m, total_steps=5)
    keys = re.findall(r"(\w+):", line)
    assert keys == ["step", "consumed_samples", "global_batch_size", "loss", "per_step_time", "indexer_loss",
                    "mtp_1_loss", "mtp_2_loss", "grad_norm"]
    assert "lr:" not in line and "throughput" not in line and line.endswith("   1.000000 }")


def test_missing_grad_norm_prints_NaN_and_reads_back_as_nan():
    line = format_step_line({**REF_METRICS, "grad_norm": None}, total_steps=10)
    assert "grad_norm: NaN," in line
    assert math.isnan(parse_step_line(line)["grad_norm"])


def test_non_last_stage_line():
    line = format_step_line({"step": 4, "per_step_time": 900, "loss": None, "lr": 1e-5}, total_steps=10)
    assert line == ("{ step:[    4/   10], consumed_samples: None, global_batch_size: None, loss: "
                    + NON_LAST_STAGE_LOSS + ", per_step_time:    900ms, grad_norm: NaN }")
    rec = parse_step_line(line)
    assert rec["loss"] is None and rec["last_stage"] is False and rec["grad_norm"] is None
    assert rec["per_step_time"] == 900 and rec["consumed_samples"] is None


def test_seed_document_lines():
    a, b = (parse_step_line(line) for line in SEED_LINES)
    assert a == {"step": 1, "total_steps": 10, "loss": 11.813965, "per_step_time": 13570,
                 "load_balancing_loss": 1.093977, "lr": 1e-05, "grad_norm": 13.831877, "throughput": 1.36}
    assert b["step"] == 2 and b["per_step_time"] == 710 and b["throughput"] == 25.92


def test_malformed_step_line_raises():
    with pytest.raises(ValueError):
        parse_step_line("{ step:[ x/10], loss: 1.0 }")
    with pytest.raises(ValueError):
        parse_step_line("{ step:[    1/   10], loss: abc, per_step_time: 5ms }")
    assert parse_step_line("INFO - Start training loop...") is None


@pytest.mark.parametrize("text,expected", [("  13570ms", 13570), ("1.36T", 1.36), ("None", None),
                                           ("[44.313248]", 44.313248), ("[10.649/10.633]", 10.649),
                                           ("False", 0), ("1.000000E-04", 1e-4)])
def test_parse_number(text, expected):
    assert parse_number(text) == expected


def test_logger_prefix_formats():
    rec = logging.LogRecord("mftk", logging.INFO, "/x/trainer.py", 337, "hello", None, None, func="on_step_end")
    rec.created = 1_700_000_000.123
    rec.msecs = 123.0
    out = mf_formatter("stdout").format(rec)
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,123 - mindformers\[mindformers/pynative/callback/"
                        r"loss_callback.py:337\] - INFO - hello", out)
    out = mf_formatter("file").format(rec)
    assert re.fullmatch(r"\[INFO\] \d{4}-\d\d-\d\d \d\d:\d\d:\d\d,123 \[mindformers/pynative/callback/"
                        r"loss_callback.py:337\] on_step_end: hello", out)


def test_metrics_record_round_trip_keeps_nan_and_precision():
    m = {"step": 7, "loss": 1.0000000001, "grad_norm": float("nan"), "lr": float("inf")}
    line = format_metrics_record(m, rank=3)
    assert "NaN" in line and '"rank":3' in line
    back = parse_metrics_record(line)
    assert back["loss"] == 1.0000000001 and math.isnan(back["grad_norm"]) and back["lr"] == math.inf
    assert parse_metrics_record('{"step": 1, "micro_step": 1, "local_loss": 2.0}') is None  # MF monitor line
    assert parse_metrics_record("{not json") is None
