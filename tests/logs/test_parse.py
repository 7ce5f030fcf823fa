"""Readers: format detection per file, all line variants, rank merge, bad input, speed."""
import math

import pytest

from mftk.errors import DataFormatError, InputError
import mftk.logs.parse as parse_module
from mftk.logs.format import format_metrics_record, parse_step_line
from mftk.logs.parse import LogReader, parse_megatron_line, parse_run, parse_static_line, rank_from_path
from tests.helpers.logsynth import SEED_LINES, synth_lines

STATIC = ("2025-04-07 15:34:29,173 - [mindformers/core/callback/callback.py:529] - INFO - { Epoch:[  2/  2], "
          "step:[    2/   19], loss: 10.633, per_step_time: 1752ms, lr: 1e-05, overflow cond: False, loss_scale: 1.0, "
          "global_norm: [1.508834], train_throughput_per_npu: 170.738T")
MEGATRON = (" [2024-05-01 10:00:00] iteration       10/    1000 | consumed samples:          640 | elapsed time per "
            "iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 123.4 | learning rate: 1.000000E-04 | global "
            "batch size:    64 | lm loss: 1.234567E+01 | loss scale: 1.0 | grad norm: 12.345 | number of skipped "
            "iterations:   0 | number of nan iterations:   0 |")


def write(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_static_graph_line_global_step_and_renames():
    rec = parse_static_line(STATIC)
    assert rec["step"] == 19 + 2 and rec["total_steps"] == 38 and rec["epoch"] == 2
    assert rec["grad_norm"] == 1.508834 and rec["throughput"] == 170.738 and rec["overflow_cond"] == 0
    # the documented variant without a colon after global_norm
    assert parse_static_line(STATIC.replace("global_norm: [", "global_norm ["))["grad_norm"] == 1.508834


def test_megatron_line():
    rec = parse_megatron_line(MEGATRON)
    assert rec == {"step": 10, "total_steps": 1000, "consumed_samples": 640, "per_step_time": 1234.5,
                   "throughput": 123.4, "lr": 1e-4, "global_batch_size": 64, "loss": 12.34567, "loss_scale": 1.0,
                   "grad_norm": 12.345, "skipped_iterations": 0, "nan_iterations": 0}


@pytest.mark.parametrize("lines,fmt", [
    (SEED_LINES, "mindformers"), ([STATIC], "mindformers"), ([MEGATRON], "megatron"),
    ([format_metrics_record({"step": 1, "loss": 2.0, "per_step_time": 5})], "mftk"),
])
def test_auto_detects_format(tmp_path, lines, fmt):
    run = parse_run([write(tmp_path / "x.log", ["some banner", *lines])])
    assert run.files[0].format == fmt and len(run.records) == len(lines)


def test_malformed_step_lines_are_counted_not_fatal(tmp_path):
    lines = synth_lines(5) + ["2025 - INFO - { step:[    6/   10], loss: garbage, per_step_time: 1ms }"]
    run = parse_run([write(tmp_path / "a.log", lines)])
    f = run.files[0]
    assert len(run.records) == 5 and f.malformed == 1 and f.lines == 6
    assert "line 6" in f.examples[0] and "could not be read" in run.warnings[0]


def test_workers_merged_by_rank_from_file_names(tmp_path):
    d = tmp_path / "msrun_log"
    d.mkdir()
    for rank in (1, 0):  # written out of order on purpose
        write(d / f"worker_{rank}.log", synth_lines(4, seed=rank))
    run = parse_run([d])
    assert run.ranks == [0, 1] and len(run.records) == 8
    assert [f.rank for f in run.files] == [0, 1]
    assert rank_from_path(tmp_path / "output/log/rank_3/info.log") == 3


def test_non_last_stage_rank_is_not_primary(tmp_path):
    non_last = ("{ step:[    1/   10], consumed_samples: None, global_batch_size: None, loss: N/A (non-last PP "
                "stage, refer to last stage for real loss), per_step_time:    900ms, grad_norm: NaN }")
    write(tmp_path / "worker_0.log", [non_last])
    write(tmp_path / "worker_1.log", synth_lines(1))
    run = parse_run([tmp_path])
    assert run.primary_rank == 1 and run.series(0)[0]["last_stage"] is False


def test_resumed_run_later_lines_win(tmp_path):
    lines = synth_lines(6, seed=1) + synth_lines(3, start=4, seed=2, total=6)
    run = parse_run([write(tmp_path / "w.log", lines)])
    series = run.series(0)
    assert [r["step"] for r in series] == [1, 2, 3, 4, 5, 6]
    assert series[3]["loss"] == run.records[6]["loss"]  # the resumed step 4, not the first one


def test_follow_reader_waits_for_complete_lines(tmp_path):
    path = tmp_path / "w.log"
    line1, line2 = synth_lines(2)
    path.write_text(line1 + "\n" + line2[:30])
    reader = LogReader(path)
    assert [reader.table[i]["step"] for i in reader.read_new(final=False)] == [1]
    with open(path, "a") as f:
        f.write(line2[30:] + "\n")
    assert [reader.table[i]["step"] for i in reader.read_new(final=False)] == [2]
    assert len(reader.read_new(final=False)) == 0
    reader.close()


# -------------------------------------------------------------- bad input: clear messages

def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="log not found: .*nope.log"):
        parse_run([tmp_path / "nope.log"])


def test_empty_file(tmp_path):
    (tmp_path / "e.log").write_text("")
    with pytest.raises(DataFormatError, match="e.log is empty"):
        parse_run([tmp_path / "e.log"])


def test_binary_file(tmp_path):
    (tmp_path / "b.bin").write_bytes(b"abc\x00\x01\x02" * 100)
    with pytest.raises(DataFormatError, match="binary file .*NUL byte at offset 3"):
        parse_run([tmp_path / "b.bin"])


def test_gzip_file(tmp_path):
    (tmp_path / "g.log.gz").write_bytes(b"\x1f\x8b\x08\x00rest")
    with pytest.raises(DataFormatError, match="gzip") as info:
        parse_run([tmp_path / "g.log.gz"])
    assert "gunzip" in info.value.hint


def test_unknown_format(tmp_path):
    write(tmp_path / "u.log", ["hello", "epoch 1 loss 3.2"])
    with pytest.raises(DataFormatError, match="no training step lines found in 2 lines") as info:
        parse_run([tmp_path / "u.log"])
    assert "--format" in info.value.hint


def test_forced_wrong_format_finds_nothing(tmp_path):
    with pytest.raises(DataFormatError, match="as megatron"):
        parse_run([write(tmp_path / "m.log", SEED_LINES)], fmt="megatron")


def test_unknown_format_name(tmp_path):
    with pytest.raises(InputError, match="unknown log format 'xml'"):
        parse_run([write(tmp_path / "m.log", SEED_LINES)], fmt="xml")


def test_chunked_reading_gives_the_same_steps_as_one_read(tmp_path, monkeypatch):
    """The reader streams a log a chunk at a time (bounded memory, `bench/parse_log.py` has the speed):
    chunk edges cut lines anywhere, and the column reader and the line reader take turns; every step
    comes back exactly as the line-by-line parse of each line (an independent reference) reads it."""
    lines = synth_lines(3000, noise_every=10, nan_at=(500,))
    lines[1500:1500] = ["2025 INFO { step:[ 1501/ 3000], loss: N/A (non-last PP stage, refer to last stage for "
                        "real loss), per_step_time: 5ms, grad_norm: NaN }"]  # a line only the line reader reads
    path = write(tmp_path / "big.log", lines)
    expected = [rec for line in lines if (rec := parse_step_line(line)) is not None]
    monkeypatch.setattr(parse_module, "READ_CHUNK", 4099)  # a prime: edges fall mid-line, mid-number
    run = parse_run([path])
    assert run.files[0].lines == len(lines) and len(run.records) == len(expected) == 3001
    for got, want in zip(run.records, expected):
        assert {k: v for k, v in got.items() if k != "rank"} == pytest.approx(want, nan_ok=True)
    clean = parse_run([write(tmp_path / "clean.log", synth_lines(3000))]).records
    # compact columns: 8 bytes per float field and 4 per int field (constant and counting fields: nothing),
    # not a dict per step (~1 KB)
    assert clean.nbytes() == 3000 * (5 * 8 + 4)
