"""Crash safety not tuned to one moment (issue 21, item 9): SIGKILL at many seeded random points
inside checkpoint saves.

A tiny single-process run saves every step (``save_max`` 4, so retention deletes too). Each segment
is a fresh process (`tests.helpers.crash_child`) that continues from the newest checkpoint and kills
itself at a random checkpoint I/O event of its first three saves: part-way through a tensor file,
the extra state, ``common.json``, the resolved config or the tracker, or just before or after a
step-dir rename, a directory fsync or a retention pass. After every kill: every published
``iteration_*`` dir verifies, the tracker names a complete one, and the next segment continues from
it: every step any segment logs equals the uninterrupted run's bit for bit, and so do the final
weights and optimizer state.
"""
from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mftk.ckpt.inspect import inspect_checkpoint
from mftk.ckpt.layout import TRACKER, iteration_dirs, read_tracker
from mftk.ckpt.load import load_global
from tests.helpers.hostile import ENV, ROOT
from tests.helpers.tiny import tiny_raw

pytestmark = [pytest.mark.slow, pytest.mark.engine]
STEPS, KILLS, SEED = 40, 20, 2021


def _config(tmp_path: Path, corpus: Path, save: Path, name: str) -> Path:
    raw = tiny_raw("qwen3_tiny.yaml", corpus, save, steps=STEPS, gbs=2)
    raw["checkpoint"].update({"save_interleaved_steps": 1, "save_max": 4})
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def _child(cfg: Path, out: Path, kill_at: int, seed: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tests.helpers.crash_child", str(cfg), str(out), str(kill_at),
                           str(seed)], capture_output=True, text=True, cwd=ROOT, env=ENV, timeout=600)


def _steps(out: Path) -> dict[int, tuple[float, float]]:
    """step -> (loss, grad_norm) from a segment's metrics.jsonl (a line cut by the kill is dropped)."""
    path = out / "log" / "rank_0" / "metrics.jsonl"
    rows = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        rows[r["step"]] = (r["loss"], r["grad_norm"])
    return rows


def _check_published(save: Path) -> int | None:
    """Every visible iteration dir is complete and verifies; the tracker (if any) names one of them."""
    dirs = iteration_dirs(save) if save.exists() else {}
    for step, d in dirs.items():
        problems = inspect_checkpoint(d, verify=True).problems
        assert problems == [], (d.name, problems)
    tracked = read_tracker(save) if (save / TRACKER).exists() else None
    if tracked is not None:
        assert tracked in dirs, (tracked, sorted(dirs))
    return tracked


def test_sigkill_at_random_points_during_saves(tmp_path, corpus):
    ref_cfg = _config(tmp_path, corpus, tmp_path / "ref_ckpt", "ref.yaml")
    ref = _child(ref_cfg, tmp_path / "ref_out", 0, 0)
    assert ref.returncode == 0, ref.stderr[-3000:]
    expected = _steps(tmp_path / "ref_out")
    assert sorted(expected) == list(range(1, STEPS + 1))
    per_save = int(ref.stdout.split("EVENTS ")[1].split()[0]) / STEPS  # checkpoint I/O events per save
    assert per_save > 10

    save = tmp_path / "ckpt"
    cfg = _config(tmp_path, corpus, save, "run.yaml")
    rng = random.Random(SEED)
    kills, seen, segment = [], {}, 0
    while len(kills) < KILLS:
        kill_at = rng.randrange(1, int(3 * per_save) + 1)
        r = _child(cfg, tmp_path / f"seg{segment}", kill_at, rng.randrange(2**31))
        assert r.returncode in (-9, 0), r.stderr[-3000:]
        seen.update(_steps(tmp_path / f"seg{segment}"))
        segment += 1
        if r.returncode == 0:
            break
        kills.append((kill_at, _check_published(save)))
    assert len(kills) >= KILLS, f"the run finished after {len(kills)} kills; raise STEPS"
    # distinct moments: kills landed in many different places of a save
    assert len({k % int(per_save) for k, _ in kills}) >= 10
    while True:  # the rest of the run, undisturbed
        r = _child(cfg, tmp_path / f"seg{segment}", 0, 0)
        assert r.returncode == 0, r.stderr[-3000:]
        seen.update(_steps(tmp_path / f"seg{segment}"))
        segment += 1
        if _check_published(save) == STEPS:
            break
    assert {s: seen[s] for s in sorted(seen)} == {s: expected[s] for s in sorted(seen)}  # bit-exact, every step
    assert sorted(seen) == list(range(1, STEPS + 1))
    final, reference = load_global(save / f"iteration_{STEPS:08d}"), load_global(tmp_path / "ref_ckpt" /
                                                                              f"iteration_{STEPS:08d}")
    assert final.keys() == reference.keys()
    assert all(final[k].tobytes() == reference[k].tobytes() for k in final)
