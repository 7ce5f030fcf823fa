"""Checkpoints written by other MindSpore Transformers releases and optimizers (issue 19).

Fixtures are safetensors files packed by hand (`handmade.py`); optimizer states named as the reference writes
them (mindformers-2.1.md §4.7: `adam_m.*`, `adam_v.*`, `muon_m.*`; AMSGrad's `max_exp_avg_sq.*`).
"""
from __future__ import annotations

import json
import logging
import struct

import numpy as np
import pytest
from tests.helpers.cli import runner

from commands.app import app
from mftk.ckpt import names
from mftk.ckpt.inspect import inspect_checkpoint
from mftk.errors import CheckpointError
from tests.helpers.handmade import f32, mf_step_dir, write

OPT = "checkpoint-opt-0000000-0000001.safetensors"
ZEROS4 = f32(0, 0, 0, 0)


def _opt_file(d, entries):
    write(d / OPT, entries + [("global_step", "I64", [1], struct.pack("<q", 4))])


def _amsgrad_dir(tmp_path):
    """w and b both trained by AdamW with amsgrad: moments plus max_exp_avg_sq; an older, shorter common.json
    and the extra key 2.1.0 drops (data_plan_state)."""
    d = mf_step_dir(tmp_path, step=4)
    _opt_file(d, [("adam_m.w", "F32", [2, 2], ZEROS4), ("adam_v.w", "F32", [2, 2], ZEROS4),
                  ("max_exp_avg_sq.w", "F32", [2, 2], ZEROS4), ("max_exp_avg_sq.b", "F32", [2], f32(0, 0))])
    common = json.loads((d / "common.json").read_text())
    del common["ckpt_status"], common["loss_scale"]
    common["data_plan_state"] = {"epoch": 0, "cursor": 8}
    (d / "common.json").write_text(json.dumps(common))
    return d


def test_names_know_every_state_and_which_adamw_uses():
    assert names.split_state("adam_m.decoder.layers.0.w") == ("adam_m", "decoder.layers.0.w")
    assert names.param_of("max_exp_avg_sq.embedding.word_embeddings.weight") == "embedding.word_embeddings.weight"
    assert names.param_of("decoder.final_layernorm.weight") == "decoder.final_layernorm.weight"
    assert all(names.is_optimizer_name(n) for n in ("global_step", "muon_m.x", "main_param.x", "adam_v.x"))
    assert not names.is_optimizer_name("adam_mx.w") and not names.is_optimizer_name("decoder.adam_m.w")
    assert names.unused_states(["adam_m.a", "muon_m.b", "max_exp_avg_sq.a", "muon_m.a"]) == \
        {"max_exp_avg_sq": ["max_exp_avg_sq.a"], "muon_m": ["muon_m.a", "muon_m.b"]}


def test_inspect_verify_accepts_amsgrad_states_and_an_older_common_json(tmp_path):
    d = _amsgrad_dir(tmp_path)
    r = inspect_checkpoint(d, verify=True)
    assert r.problems == []
    assert r.unused_optimizer_states == {"max_exp_avg_sq": ["max_exp_avg_sq.b", "max_exp_avg_sq.w"]}
    assert {t.name: t.kind for t in r.tensors}["max_exp_avg_sq.b"] == "optimizer"
    s1 = r.scenarios[0]
    assert s1.supported and "skips 2 optimizer state(s) mftk's AdamW does not use (max_exp_avg_sq.*)" in s1.reason
    assert any("no 'loss_scale'" in n for n in r.notes) and any("'data_plan_state'" in n for n in r.notes)
    assert r.common["loss_scale"] is None and r.common["data_plan_state"] == {"epoch": 0, "cursor": 8}


def test_inspect_cli_lists_the_states_it_would_skip(tmp_path):
    d = _amsgrad_dir(tmp_path)
    res = runner.invoke(app, ["inspect-ckpt", str(d), "--verify"], env={"COLUMNS": "240"})
    assert res.exit_code == 0, res.output
    assert "max_exp_avg_sq.* (2 tensors: max_exp_avg_sq.b, max_exp_avg_sq.w)" in res.stdout
    assert "AMSGrad" in res.stdout and "verified:" in res.stdout
    data = json.loads(runner.invoke(app, ["inspect-ckpt", str(d), "--json"]).stdout)
    assert data["unused_optimizer_states"] == {"max_exp_avg_sq": ["max_exp_avg_sq.b", "max_exp_avg_sq.w"]}


def test_a_muon_checkpoint_serves_weights_only_but_not_a_standard_resume(tmp_path):
    d = mf_step_dir(tmp_path, step=4)
    _opt_file(d, [("muon_m.w", "F32", [2, 2], ZEROS4), ("adam_m.b", "F32", [2], f32(0, 0)),
                  ("adam_v.b", "F32", [2], f32(0, 0))])
    r = inspect_checkpoint(d, verify=True)
    assert r.problems == []
    s1, s2 = r.scenarios[0], r.scenarios[1]
    assert not s1.supported and "1 parameter(s) have Muon momentum (muon_m.*) and no adam_m/adam_v" in s1.reason
    assert s2.supported


# ------------------------------------------------------------------ AdamW.load_state_dict

def _adamw():
    from mftk.engine.optim import AdamW, decide_weight_decay

    shapes = {"w": (2, 2), "b": (2,)}
    arrays = [np.ones(s, np.float32) for s in shapes.values()]
    return AdamW(list(shapes), arrays, decide_weight_decay(list(shapes.items()), 0.0), betas=(0.9, 0.95), eps=1e-8)


def _state(**extra):
    sd = {"adam_m.w": np.full((2, 2), 0.5, np.float32), "adam_v.w": np.full((2, 2), 0.25, np.float32),
          "adam_m.b": np.full(2, 0.1, np.float32), "adam_v.b": np.full(2, 0.2, np.float32),
          "global_step": np.array([7], np.int64)}
    return sd | extra


def test_adamw_skips_amsgrad_states_by_name_and_loads_the_rest(caplog):
    opt = _adamw()
    extra = {"max_exp_avg_sq.w": np.ones((2, 2), np.float32), "max_exp_avg_sq.b": np.ones(2, np.float32)}
    with caplog.at_level(logging.WARNING, logger="mftk.train"):
        skipped = opt.load_state_dict(_state(**extra))
    assert skipped == ["max_exp_avg_sq.b", "max_exp_avg_sq.w"]
    assert opt.global_step == 7
    np.testing.assert_array_equal(opt.state_dict()["adam_v.w"], np.full((2, 2), 0.25, np.float32))
    assert "max_exp_avg_sq.* (2 tensors" in caplog.text and "AMSGrad" in caplog.text


def test_adamw_still_needs_adam_moments_even_when_muon_states_are_there():
    sd = _state(**{"muon_m.w": np.zeros((2, 2), np.float32)})
    del sd["adam_m.w"], sd["adam_v.w"]
    with pytest.raises(CheckpointError) as e:
        _adamw().load_state_dict(sd)
    assert "missing tensor: adam_m.w" in e.value.problems and "missing tensor: adam_v.w" in e.value.problems
    assert "Muon states (muon_m.*)" in e.value.message and "--weights-only" in e.value.hint


def test_an_unknown_optimizer_tensor_is_still_an_error():
    with pytest.raises(CheckpointError) as e:
        _adamw().load_state_dict(_state(**{"exp_avg.w": np.zeros((2, 2), np.float32)}))
    assert e.value.problems == ["unexpected tensor: exp_avg.w"]
