"""A large log read by worker processes gives exactly the table and accounting the line-by-line reader gives.

The workers (mftk.logs.workers) only start on logs over 64 MiB; here the window and the threshold are made
tiny so a few hundred KiB of mixed log crosses many windows. The reference is the line-by-line reader alone
(the column path switched off): an independent reading of every line, kept in one process.
"""
import math
import os

import attrs

import mftk.logs.parse as parse_module
import mftk.logs.workers as workers_module
from tests.helpers.logsynth import synth_lines

ANSI_LINE = ("\x1b[32m2025-06-01 10:00:00,000 - INFO - \x1b[0m{ step:[  401/ 3000], consumed_samples: 3208, "
             "global_batch_size: 8, loss: \x1b[1m  4.100000\x1b[0m, per_step_time:    700ms, grad_norm:   2.1 }")


def mixed_lines() -> list[str]:
    """Step lines of two shapes around every event the reader keeps: NaN, None/N/A values, a skip line, an
    exception then more steps, terminal escapes, a crash's NUL hole (the line before a long line is read:
    it was dropped once), long lines (over a window, inside one), a resume (later clock) and a second
    rank's log appended (earlier clock)."""
    lines = synth_lines(1200, noise_every=7, nan_at=(150, 151))
    lines[300:300] = ["2025 INFO { step:[  300/ 3000], loss: N/A (non-last PP stage, refer to last stage for real "
                      "loss), per_step_time: 5ms, grad_norm: NaN }"]
    lines[320:320] = ["opt_global_step: 318, skip_data_grad_norm_threshold: 10.0, is_skip: [ True]"]
    lines[340:340] = [ANSI_LINE]
    lines[500:500] = ["\0" * 700, "x" * 9000, "Traceback (most recent call last):",
                      "RuntimeError: device lost, stop training"]
    lines[650:650] = ["{ step:[  9/ 3000], consumed_samples: None, loss: 2.5, per_step_time: 10ms, lr: N/A }"]
    # a resume from step 900, a day later, then another rank's log appended (the clock goes back): each
    # starting a window's body, where only the steps before tell a resume from steps going on
    lines = at_window_start(lines) + synth_lines(400, start=900, seed=1, noise_every=5)
    lines = at_window_start(lines) + synth_lines(300, seed=0, spike_at=(20,))
    lines[2000:2000] = ["y" * 3500]  # a long line inside a window
    lines += synth_lines(600, start=2000, seed=2)
    return lines


def at_window_start(lines: list[str], window: int = 4096) -> list[str]:
    """`lines` and short padding lines, so that the next line starts a window (its body too)."""
    need = -len("\n".join(lines) + "\n") % window
    need += window if need < 20 else 0
    pad = []
    while need > 120:
        pad.append("p" * 99)
        need -= 100
    return lines + pad + ["p" * (need - 1)]


def read(path, monkeypatch, *, workers: bool, columns: bool = True):
    with monkeypatch.context() as m:
        m.setattr(parse_module, "READ_CHUNK", 4096)
        m.setattr(parse_module, "MAX_LINE_BYTES", 3000)
        m.setattr(workers_module, "PARALLEL_MIN_BYTES", 0 if workers else 1 << 60)
        if not columns:
            m.setattr(parse_module, "shape_of", lambda line: None)
        return parse_module.parse_run([path])


def same_rows(a, b) -> bool:
    def key(row):
        return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
    return len(a) == len(b) and all(key(x) == key(y) for x, y in zip(a, b))


def test_workers_read_the_same_table_as_the_line_reader(tmp_path, monkeypatch):
    path = tmp_path / "worker_0.log"
    path.write_text("\n".join(mixed_lines()) + "\n", encoding="utf-8")
    bodies = []
    real = workers_module.read_bodies

    def spy(*args, **kwargs):
        for body in real(*args, **kwargs):
            bodies.append(body)
            yield body

    monkeypatch.setattr(workers_module, "read_bodies", spy)
    parallel = read(path, monkeypatch, workers=True)
    assert sum(b is not None and b.read is not None for b in bodies) > 50  # the workers did read columns
    assert any(b is not None and b.read is None for b in bodies)  # and left the odd windows to the reader
    bodies.clear()
    reference = read(path, monkeypatch, workers=False, columns=False)
    alone = read(path, monkeypatch, workers=False)
    assert not bodies
    for other in (reference, alone):
        assert same_rows(list(parallel.records), list(other.records))
        assert [attrs.asdict(f) for f in parallel.files] == [attrs.asdict(f) for f in other.files]
        assert parallel.warnings == other.warnings
    summary = parallel.files[0]
    # the events are there to be compared: a sanity check of the log itself, not of the workers
    assert summary.nul_bytes == 700 and summary.long_lines == 2 and summary.concatenated and summary.malformed == 0
    assert len(parallel.records) == 1200 + 3 + 400 + 300 + 600


def test_a_small_log_starts_no_workers(tmp_path, monkeypatch):
    path = tmp_path / "small.log"
    path.write_text("\n".join(synth_lines(3000)) + "\n", encoding="utf-8")
    monkeypatch.setattr(workers_module, "read_bodies", lambda *a, **k: (_ for _ in ()).throw(AssertionError))
    monkeypatch.setattr(parse_module, "READ_CHUNK", 4096)
    assert len(parse_module.parse_run([path]).records) == 3000


def dying_window(k: int):
    """A worker killed while reading window 30 (the kernel's OOM killer, say)."""
    if k == 30:
        os._exit(9)
    return REAL_READ_WINDOW(k)


REAL_READ_WINDOW = workers_module._read_window


def test_a_dead_worker_leaves_the_rest_to_the_reader(tmp_path, monkeypatch):
    path = tmp_path / "worker_0.log"
    path.write_text("\n".join(mixed_lines()) + "\n", encoding="utf-8")
    reference = read(path, monkeypatch, workers=False, columns=False)
    monkeypatch.setattr(workers_module, "_read_window", dying_window)
    parallel = read(path, monkeypatch, workers=True)
    assert same_rows(list(parallel.records), list(reference.records))
    assert [attrs.asdict(f) for f in parallel.files] == [attrs.asdict(f) for f in reference.files]
