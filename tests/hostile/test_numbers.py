"""NaN, infinity and absurd magnitudes (issue 21, item 3).

The settings are enumerated (`tests/helpers/hostile_numbers.py`) from the attrs classes of the config model (every field whose type
is a float or an int, in every section and model family, lists and nested sections included), so a
field added later is covered without this file changing. Every one must reject NaN, infinity and an
out-of-range magnitude with its YAML path. Then what the numbers would have done: a non-finite
update is never published as a checkpoint, and ``inspect-ckpt --verify`` finds one.
"""
from __future__ import annotations

import copy
import json
import math
import re
import struct
from typing import Any

import attrs
import numpy as np
import pytest

from mftk.config.model import DeepseekV3ModelConfig, Qwen3ModelConfig
from mftk.errors import ConfigError, TrainingError
from tests.helpers.config import load_dict, template_dict
from tests.helpers.handmade import f32, mf_step_dir, write
from tests.helpers.hostile import ROOT, assert_clean_failure, mftk
from tests.helpers.hostile_numbers import dotted, number_cases, set_path, yaml_path

CASES = number_cases()


def test_the_enumeration_reaches_every_section():
    sections = {p[0] for _, p, _ in CASES}
    assert {"training", "optimizer", "lr_scheduler", "checkpoint", "parallelism", "train_dataset", "monitor",
            "model", "callbacks", "profiler"} <= sections
    assert ("qwen3_tiny", ["lr_scheduler", "learning_rate"], float) in CASES
    assert ("deepseek_v3_tiny", ["model", "routed_scaling_factor"], float) in CASES
    assert ("qwen3_tiny", ["optimizer", "betas", 0], float) in CASES
    assert len(CASES) > 120


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 1e39, 10**30], ids=["nan", "inf", "-inf", "1e39",
                                                                                   "10**30"])
def test_every_number_setting_rejects_non_finite_and_absurd_values(value):
    failures = []
    for template, path, kind in CASES:
        if kind is int and isinstance(value, float):
            continue  # a float where an int belongs is a type error, tested elsewhere
        if kind is float and isinstance(value, int) and abs(value) > 2**63:
            value_here: Any = 1e39
        else:
            value_here = value
        raw = template_dict(template)
        family = Qwen3ModelConfig if template == "qwen3_tiny" else DeepseekV3ModelConfig
        ypath = yaml_path(raw, path, family)
        set_path(raw, ypath, value_here)
        where = dotted(ypath)
        try:
            load_dict(copy.deepcopy(raw))
        except ConfigError as exc:
            hit = [p for p in exc.problems if p.severity == "error" and p.path.startswith(where)]
            if not hit or not any(w in hit[0].message for w in ("NaN", "infinity", "overflows", "out of range")):
                failures.append(f"{where}: {[p.render() for p in exc.problems if p.severity == 'error'][:2]}")
        else:
            failures.append(f"{where} = {value_here!r} accepted")
    assert failures == []


def test_model_sizes_have_a_tighter_bound_than_other_integers():
    raw = template_dict("qwen3_tiny")
    raw["model"]["hidden_size"] = 2**24 + 1
    with pytest.raises(ConfigError) as e:
        load_dict(raw)
    assert "model.hidden_size" in e.value.problems[-1].path and "at most 16,777,216" in e.value.problems[-1].message
    raw = template_dict("qwen3_tiny")
    raw["training"]["seed"] = 2**40  # a big seed is fine: only int64 bounds it
    raw["train_dataset"]["dataloader"]["sizes"] = [2**40, 0, 0]
    load_dict(raw)


# -- through the CLI, as a user writes them -------------------------------------------------------------

@pytest.mark.parametrize("key,text,message", [
    ("lr_scheduler.learning_rate", ".nan", "NaN is not a number a setting can take"),
    ("training.max_norm", ".nan", "NaN is not a number a setting can take"),
    ("model.rms_norm_eps", ".inf", "infinity is not a setting"),
    ("model.hidden_size", "1e41", "expected int, got string '1e41'"),
    ("model.hidden_size", "1.0e+41", "expected int, got number 1e+41"),
    ("model.num_hidden_layers", "1" + "0" * 30, "an integer of about 31 digits is out of range"),
])
def test_yaml_numbers_through_validate_config(tmp_path, key, text, message):
    name = key.split(".")[1]
    body, n = re.subn(rf"(?m)^(  {name}:) .*$", rf"\1 {text}", (ROOT / "templates" / "qwen3_tiny.yaml").read_text())
    assert n == 1
    cfg = tmp_path / "c.yaml"
    cfg.write_text(body)
    r = mftk("validate-config", str(cfg), "--no-check-files")
    line = body.splitlines().index(f"  {name}: {text}") + 1
    assert_clean_failure(r, 1, f"{key} (line {line}): {message}")


def test_train_with_a_nan_learning_rate_never_starts(tmp_path):
    r = mftk("train", str(ROOT / "templates" / "qwen3_tiny.yaml"), "--set", "lr_scheduler.learning_rate=.nan",
             "--set", f"checkpoint.save_path={tmp_path / 'ckpt'}", "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(r, 1, "lr_scheduler.learning_rate", "NaN")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag,value", [("--device-tflops", "nan"), ("--device-tflops", "0"),
                                        ("--device-tflops", "inf"), ("--link-gbps", "nan"), ("--link-gbps", "0"),
                                        ("--link-gbps", "-5")])
def test_plan_rates_must_be_positive_and_finite(flag, value):
    r = mftk("plan-parallel", str(ROOT / "templates" / "qwen3_tiny.yaml"), "--world-size", "8", flag, value)
    assert_clean_failure(r, 2, f"{flag} {value} is not a positive finite number")


# -- a non-finite update is never published ----------------------------------------------------------

def _diverging(loaded: Any) -> Any:
    """The run's config with a NaN learning rate set past validation: the update of step 1 is all NaN
    while its loss and grad norm (computed before it) are finite, so only the save can catch it."""
    lr = attrs.evolve(loaded.config.lr_scheduler, learning_rate=math.nan)
    return attrs.evolve(loaded, config=attrs.evolve(loaded.config, lr_scheduler=lr))


@pytest.mark.engine
def test_a_nan_update_is_never_published(corpus, tmp_path):
    from mftk.ckpt.inspect import inspect_checkpoint
    from mftk.engine.run import train
    from tests.helpers.tiny import load, tiny_raw

    root = tmp_path / "ckpt"
    raw = tiny_raw("qwen3_tiny.yaml", corpus, root, steps=2)
    raw["checkpoint"]["save_interleaved_steps"] = 1
    first = train(load(raw), output_dir=tmp_path / "a", install_signals=False)
    assert first.final_step == 2 and (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    before = sorted(p.name for p in root.iterdir())
    with pytest.raises(TrainingError) as e:
        train(_diverging(load(raw, "training.steps=4")), output_dir=tmp_path / "b", resume_from=root,
              install_signals=False)
    assert "checkpoint save at step 3 failed: step 3 not saved:" in e.value.message
    assert "hold NaN or infinity" in e.value.message and "the previous checkpoint is intact" in e.value.hint
    assert sorted(p.name for p in root.iterdir()) == before  # no step 3, no temp dir, tracker unchanged
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert inspect_checkpoint(root, verify=True, finite=True).problems == []


def test_checkpointer_refuses_non_finite_tensors_before_writing(tmp_path):
    from mftk.ckpt.checkpointer import Checkpointer, Payload, SaveReason
    from mftk.ckpt.common import CommonInfo
    from mftk.progress import BaseSink

    common = CommonInfo.for_step(step=1, max_steps=2, global_batch_size=1, consumed_samples=1)
    w = np.ones((3, 3), np.float32)
    w[1, 2] = np.inf
    for model, opt in (({"w": w}, None), ({"ok": np.ones(2, np.float32)}, {"adam_v.ok": np.array([np.nan], np.float32)})):
        ck = Checkpointer(root=str(tmp_path), interval=1)
        with pytest.raises(TrainingError, match="hold NaN or infinity"):
            ck.save(1, SaveReason.FINAL, lambda: Payload(common=common, model=model, optimizer=opt, extra=None),
                    BaseSink())
        assert list(tmp_path.iterdir()) == []


def test_finite_check_is_exact_on_edge_values():
    from mftk.ckpt.save import non_finite
    from mftk.ckpt.safetensors_io import to_bf16

    big = np.full(1000, np.finfo(np.float32).max, np.float32)  # finite, though their float32 sum overflows
    huge64 = np.full(4, np.finfo(np.float64).max)  # finite, their float64 sum overflows
    assert non_finite({"big": big, "huge64": huge64, "ints": np.array([2**62]), "empty": np.zeros(0)}) == []
    nan64 = huge64.copy()
    nan64[3] = np.nan
    assert non_finite({"nan64": nan64, "bf16": to_bf16(np.array([1.0, np.inf], np.float32)),
                       "bf16ok": to_bf16(np.array([1.0, -2.0], np.float32))}) == ["nan64", "bf16"]


def test_verify_finite_reports_non_finite_tensors(tmp_path):
    d = mf_step_dir(tmp_path / "ckpt")
    write(d / "checkpoint-model-0000000-0000001.safetensors",
          [("w", "F32", [2, 2], f32(1, math.nan, 3, 4)), ("b", "BF16", [2], struct.pack("<2H", 0x3F00, 0x7F80))])
    assert mftk("inspect-ckpt", str(d), "--verify", "--quick").returncode == 0  # headers alone cannot tell
    for flags in (["--verify"], ["--verify", "--finite"], ["--verify", "--quick", "--finite"]):
        r = mftk("inspect-ckpt", str(d), *flags)
        assert_clean_failure(r, 1, "2 problem(s) in the checkpoint", "b: holds NaN or infinity",
                             "w: holds NaN or infinity")
    r = mftk("inspect-ckpt", str(d), "--verify", "--finite", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["finite_checked"] is True
    assert_clean_failure(mftk("inspect-ckpt", str(d), "--finite"), 2, "--finite only applies to --verify")
