"""Resuming from checkpoints another release or optimizer wrote (issue 19), end to end on a tiny Qwen3:
AMSGrad's `max_exp_avg_sq.*` and 2.1.0's dropped `data_plan_state` are skipped by name; a Muon checkpoint
(no `adam_m` for a parameter) and a `common.json` without `global_step` still refuse a standard resume."""
from __future__ import annotations

import json
import logging
import shutil

import numpy as np
import pytest

from mftk.errors import CheckpointError
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine
OPT = "checkpoint-opt-0000000-0000001.safetensors"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, corpus):
    from mftk.engine.run import train

    d = tmp_path_factory.mktemp("compat")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=4)
    return raw, train(load(raw), output_dir=d / "out"), d


def _copy_step(d, dest, edit_opt=None, edit_common=None):
    """iteration_00000002 of the baseline, copied under `dest` with its optimizer file / common.json edited."""
    from safetensors.numpy import load_file, save_file

    src = d / "ckpt" / "iteration_00000002"
    step_dir = dest / "iteration_00000002"
    shutil.copytree(src, step_dir)
    (dest / "latest_checkpointed_iteration.txt").write_text("2")
    if edit_opt:
        tensors = load_file(step_dir / OPT)
        edit_opt(tensors)
        save_file(tensors, str(step_dir / OPT))
    if edit_common:
        common = json.loads((step_dir / "common.json").read_text())
        edit_common(common)
        (step_dir / "common.json").write_text(json.dumps(common))
    return step_dir


def _run(raw, tmp_path, name, **kw):
    from mftk.engine.run import train

    cfg = dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / f"{name}_ckpt")))
    return train(load(cfg), output_dir=tmp_path / name, **kw)


def test_amsgrad_states_and_data_plan_state_are_skipped_and_the_resume_is_exact(baseline, tmp_path, caplog):
    raw, full, d = baseline

    def add_amsgrad(t):
        for key in [k for k in t if k.startswith("adam_v.")]:
            t["max_exp_avg_sq." + key.split(".", 1)[1]] = np.abs(t[key]) + 1.0

    step_dir = _copy_step(d, tmp_path / "src", add_amsgrad, lambda c: c.update(data_plan_state={"cursor": 4}))
    with caplog.at_level(logging.WARNING, logger="mftk.train"):
        r = _run(raw, tmp_path, "a", resume_from=step_dir)
    assert r.resume.scenario == 1 and r.start_step == 2
    assert r.losses == full.losses[2:]  # AdamW continues from adam_m/adam_v exactly: bit-identical losses
    assert "Optimizer states not used by mftk's AdamW, skipped: max_exp_avg_sq.*" in caplog.text
    assert any("'data_plan_state'" in n for n in r.resume.notes)
    saved = json.loads((tmp_path / "a_ckpt" / "iteration_00000004" / "common.json").read_text())
    assert saved["data_plan_state"] == {"cursor": 4} and list(saved)[:7] == ["epoch_num", "step_num", "global_step",
                                                                            "loss_scale", "global_batch_size",
                                                                            "consumed_samples", "ckpt_status"]


def test_muon_states_refuse_a_standard_resume_but_serve_weights_only(baseline, tmp_path):
    raw, _, d = baseline
    name = "decoder.layers.0.mlp.linear_fc1.weight"

    def to_muon(t):
        t["muon_m." + name] = t.pop("adam_m." + name)
        del t["adam_v." + name]

    step_dir = _copy_step(d, tmp_path / "src", to_muon)
    with pytest.raises(CheckpointError) as e:
        _run(raw, tmp_path, "s", resume_from=step_dir)
    assert f"missing tensor: adam_m.{name}" in e.value.problems and "Muon" in e.value.message
    r = _run(raw, tmp_path, "w", resume_from=step_dir, weights_only=True)
    assert r.resume.scenario == 2 and r.final_step == 4


def test_common_json_without_global_step_serves_weights_only(baseline, tmp_path):
    raw, _, d = baseline
    step_dir = _copy_step(d, tmp_path / "src", edit_common=lambda c: c.pop("global_step"))
    with pytest.raises(CheckpointError, match="has no global_step"):
        _run(raw, tmp_path, "s", resume_from=step_dir, dry_run=True)
    r = _run(raw, tmp_path, "w", resume_from=step_dir, weights_only=True, dry_run=True)
    assert r.resume.scenario == 2 and any("no 'global_step'" in n for n in r.resume.notes)
