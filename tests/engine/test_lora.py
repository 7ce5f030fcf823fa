"""LoRA (`engine.lora`, `ckpt.lora`): only the adapters train, and they round-trip through transformers and peft.

Independent sides: the initial weights rebuilt from the seed (base bit-identical), a hand count of the
adapter shapes from the config, transformers' own forward of the merged export, peft's own LoRA forward
of the unmerged export, and an uninterrupted run for resume.
"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import yaml
from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine
TOL = 1e-4
DENSE = r"(linear_qkv|linear_proj|linear_fc1|linear_fc2|linear_qb|linear_kvb)$"
ATTENTION = r"self_attention\.(linear_qkv|linear_proj|linear_qb|linear_kvb)$"
WITH_EXPERTS = r"(linear_qkv|linear_proj|linear_fc1|linear_fc2|linear_qb|linear_kvb|experts)$"
LORA = {"lora_rank": 4, "lora_alpha": 8, "lora_a_std": 0.05, "lora_b_std": 0.02}


def _raw(template: str, corpus, d, *, target: str = WITH_EXPERTS, steps: int = 3, **lora) -> dict:
    raw = tiny_raw(template, corpus, d / "ckpt", steps=steps, gbs=2)
    raw["lora_config"] = {"target_modules": target, **LORA, **lora}
    return raw


def _train(raw: dict, out, *overrides: str, resume_from=None):
    from mftk.engine.run import train

    return train(load(raw, *overrides), output_dir=out, resume_from=resume_from, install_signals=False)


def _initial(raw: dict) -> tuple[dict, set]:
    """The run's initial tensors (built again from the seed) and the names of the base's trained weights."""
    from mftk.engine.builders import build_model

    config = load(raw).config
    model = build_model(config)
    import attrs

    plain = build_model(attrs.evolve(config, lora_config=None))
    weights = {p.name for p in plain.get_parameters() if p.requires_grad}  # buffers excluded: not weights
    return {p.name: p.asnumpy().copy() for p in model.get_parameters()}, weights


def _final(step_dir) -> dict:
    from mftk.ckpt.load import load_global

    return load_global(step_dir, kinds=("model",))


@pytest.fixture(scope="module", params=["qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"])
def run(request, tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp(request.param.split("_tiny")[0])
    raw = _raw(request.param, corpus, d)
    result = _train(raw, d / "out")
    return d, raw, result


def test_base_weights_are_bit_identical_and_adapters_moved(run):
    d, raw, result = run
    start, weights = _initial(raw)
    end = _final(d / "ckpt" / "iteration_00000003")
    lora = [n for n in end if n.endswith(("lora_a", "lora_b"))]
    assert lora and set(lora) == {n for n in start if n.endswith(("lora_a", "lora_b"))}
    for name in weights:
        assert np.array_equal(end[name], start[name]), f"base weight {name} changed"
    for name in lora:
        assert not np.array_equal(end[name], start[name]), f"adapter {name} did not move"
    assert all(math.isfinite(x) for x in result.losses)


def test_experts_and_attention_get_adapters_under_the_reference_names(run):
    d, raw, _ = run
    end = _final(d / "ckpt" / "iteration_00000003")
    assert "decoder.layers.0.self_attention.linear_qkv.lora_a" in end
    assert "decoder.layers.0.self_attention.linear_proj.lora_b" in end
    if raw["model"]["model_type"] == "deepseek_v3":
        assert end["decoder.layers.1.mlp.experts.weight1_lora_a"].shape == (8, 64, 4)  # [E, H, r]
        assert end["decoder.layers.1.mlp.experts.weight1_lora_b"].shape == (8, 4, 64)  # [E, r, 2F]
        assert end["decoder.layers.1.mlp.experts.weight2_lora_a"].shape == (8, 32, 4)
        assert end["decoder.layers.1.mlp.experts.weight2_lora_b"].shape == (8, 4, 64)
        assert "decoder.layers.1.mlp.shared_experts.linear_fc1.lora_a" in end
        assert "decoder.layers.1.self_attention.linear_qb.lora_b" in end


def test_optimizer_holds_states_of_the_adapters_only(run):
    from mftk.ckpt.load import load_global
    from mftk.ckpt.names import is_lora_name, split_state

    d, _, _ = run
    opt = load_global(d / "ckpt" / "iteration_00000003", kinds=("opt",))
    states = [n for n in opt if split_state(n)]
    assert states and all(is_lora_name(n) for n in states)


def _hand_count(model: dict, r: int, experts: bool) -> int:
    """Adapter elements from the config: r·(in + out) per dense layer; r·(H + 2F) + r·(F + H) per expert."""
    h, n = model["hidden_size"], 0
    if model["model_type"] == "qwen3":
        nh, ng, hd, f = model["num_attention_heads"], model["num_key_value_heads"], model["head_dim"], \
            model["intermediate_size"]
        per = r * (h + (nh + 2 * ng) * hd) + r * (nh * hd + h) + r * (h + 2 * f) + r * (f + h)
        return per * model["num_hidden_layers"]
    nh, ql, kvl = model["num_attention_heads"], model["q_lora_rank"], model["kv_lora_rank"]
    dq = model["qk_nope_head_dim"] + model["qk_rope_head_dim"]
    att = (r * (h + ql + kvl + model["qk_rope_head_dim"]) + r * (ql + nh * dq)
           + r * (kvl + nh * (model["qk_nope_head_dim"] + model["v_head_dim"])) + r * (nh * model["v_head_dim"] + h))
    dense_mlp = r * (h + 2 * model["intermediate_size"]) + r * (model["intermediate_size"] + h)
    fs, fm, e = model["moe_shared_expert_intermediate_size"], model["moe_intermediate_size"], model["n_routed_experts"]
    moe = r * (h + 2 * fs) + r * (fs + h) + (e * (r * (h + 2 * fm) + r * (fm + h)) if experts else 0)
    layers = model["num_hidden_layers"]
    k = model["first_k_dense_replace"]
    n = layers * att + k * dense_mlp + (layers - k) * moe
    mtp = model["num_nextn_predict_layers"]
    n += mtp * (att + moe)  # the MTP layer is a MoE layer (its eh_proj is not matched by the pattern)
    return n


def test_trainable_count_in_the_log_equals_the_hand_count(run):
    d, raw, result = run
    text = open(result.log_file).read()
    found = re.findall(r"LoRA: adapters on (\d+) modules .*trainable parameters: (\d+) of (\d+)", text)
    assert len(found) == 1
    assert int(found[0][1]) == _hand_count(raw["model"], 4, experts=True)


# ------------------------------------------------------------------------------------ export
def _mftk_logits(raw: dict, step_dir, ids: np.ndarray) -> np.ndarray:
    from mftk.engine.builders import build_model
    from mftk.engine.models.build import load_state_dict

    model = build_model(load(raw, "training.seed=7").config)  # another init: every tensor from the checkpoint
    load_state_dict(model, _final(step_dir))
    return model.logits(ids)[0].asnumpy()


def _hf(out):
    torch, transformers = pytest.importorskip("torch"), pytest.importorskip("transformers")
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        out, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    n = model.config.num_hidden_layers
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert not [k for k in info["unexpected_keys"] if not k.startswith(f"model.layers.{n}.")]
    return model.eval()


def _check_merged_export(root, raw: dict, out, seed: int) -> None:
    """``--export-hf OUT --merge-lora`` of the run at ``root``; transformers' logits equal the adapted mftk model's."""
    torch = pytest.importorskip("torch")
    r = runner.invoke(app, ["inspect-ckpt", str(root), "--export-hf", str(out), "--merge-lora"])
    assert r.exit_code == 0, r.output
    ids = np.random.default_rng(seed).integers(1, 256, (2, 16))
    ours = _mftk_logits(raw, root / "iteration_00000003", ids)
    with torch.no_grad():
        ref = _hf(out)(torch.tensor(ids)).logits.numpy()
    assert np.abs(ref).max() > 0.05 and np.abs(ours - ref).max() <= TOL
    assert not (out / "adapter").exists()


@pytest.mark.torch
def test_merged_export_gives_the_adapted_logits_in_transformers(run):
    d, raw, _ = run
    _check_merged_export(d / "ckpt", raw, d / "merged", seed=0)


@pytest.fixture(scope="module", params=["qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"])
def dense_run(request, tmp_path_factory, corpus):
    """Adapters on dense layers only (PEFT has no layout for grouped experts)."""
    d = tmp_path_factory.mktemp("peft_" + request.param.split("_tiny")[0])
    # peft (0.21, transformers 5) turns every gate_proj/up_proj/down_proj target of a deepseek_v3 model into
    # its fused experts, so the DeepSeek adapter stays on the attention (the export notes this)
    target = DENSE + "|output_layer$" if request.param.startswith("qwen3") else ATTENTION
    raw = _raw(request.param, corpus, d, target=target, steps=2)
    _train(raw, d / "out")
    return d, raw


@pytest.mark.torch
def test_peft_export_loads_in_peft_with_the_same_logits(dense_run):
    torch = pytest.importorskip("torch")
    peft = pytest.importorskip("peft")
    d, raw = dense_run
    out = d / "hf"
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(out)])
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["lora_alpha"] == 8
    assert (out / "adapter" / "adapter_model.safetensors").is_file()
    model = peft.PeftModel.from_pretrained(_hf(out), str(out / "adapter")).eval()
    ids = np.random.default_rng(1).integers(1, 256, (2, 16))
    ours = _mftk_logits(raw, d / "ckpt" / "iteration_00000002", ids)
    with torch.no_grad():
        ref = model(torch.tensor(ids)).logits.numpy()
        with model.disable_adapter():
            plain = model(torch.tensor(ids)).logits.numpy()
    assert np.abs(ours - ref).max() <= TOL
    assert np.abs(plain - ref).max() > 10 * TOL  # the adapter is applied, not ignored


def test_peft_export_of_expert_adapters_is_refused(run):
    d, raw, _ = run
    if raw["model"]["model_type"] != "deepseek_v3":
        pytest.skip("experts only in DeepSeek-V3")
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(d / "peft_experts")])
    assert r.exit_code != 0 and "--merge-lora" in r.output
    assert not (d / "peft_experts").exists()


# ------------------------------------------------------------------------------------ resume
def test_resume_with_lora_is_bit_exact(tmp_path, corpus):
    full = _train(_raw("qwen3_tiny.yaml", corpus, tmp_path / "a", steps=4), tmp_path / "a" / "out")
    raw = _raw("qwen3_tiny.yaml", corpus, tmp_path / "b", steps=4)
    _train(raw, tmp_path / "b" / "out", "training.steps=2")
    resumed = _train(raw, tmp_path / "b" / "out2", resume_from=tmp_path / "b" / "ckpt" / "iteration_00000002")
    assert resumed.start_step == 2
    assert list(resumed.losses) == list(full.losses[2:])
    a, b = _final(tmp_path / "a" / "ckpt" / "iteration_00000004"), _final(tmp_path / "b" / "ckpt" / "iteration_00000004")
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)


def test_lora_dropout_changes_the_losses(tmp_path, corpus):
    """Dropout on the adapters' input is active in training: 0.5 gives other losses than 0.0 (the adapters
    are built after the model is put in training mode; they follow it). At step 1 the adapters' B is small
    but not zero (lora_b_std), so the first loss already differs."""
    a, b = (_train(_raw("qwen3_tiny.yaml", corpus, tmp_path / n, target=DENSE, steps=2, lora_dropout=p),
                   tmp_path / n / "o") for n, p in (("a", 0.0), ("b", 0.5)))
    assert all(math.isfinite(x) for x in (*a.losses, *b.losses))
    assert list(a.losses) != list(b.losses)


@pytest.mark.parametrize("extra, path", [
    ({"parallelism": {"pipeline_parallel": 2}}, "lora_config.lora_dropout"),
    ({"recompute": {"mode": "full", "full_recompute_layer": ["0-1"]}}, "recompute.mode"),
])
def test_lora_dropout_is_refused_where_forwards_are_replayed(tmp_path, corpus, extra, path):
    from mftk.config.load import load_data
    from mftk.errors import ConfigError

    raw = _raw("qwen3_tiny.yaml", corpus, tmp_path, target=DENSE, lora_dropout=0.1)
    raw["model"]["hidden_dropout"] = 0.0
    raw["training"]["global_batch_size"] = 4
    for section, values in extra.items():
        raw.setdefault(section, {}).update(values)
    with pytest.raises(ConfigError) as info:
        load_data(raw, check_files=False, world_size=2)
    assert path in {p.path for p in info.value.problems if p.severity == "error"}
    raw["lora_config"]["lora_dropout"] = 0.0
    load_data(raw, check_files=False, world_size=2)


# ------------------------------------------------------------------------------------ refusals
def _raw_only(corpus, tmp_path, **lora):
    return _raw("qwen3_tiny.yaml", corpus, tmp_path, **lora)


def test_a_pattern_matching_nothing_is_an_error(tmp_path, corpus):
    from mftk.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _train(_raw_only(corpus, tmp_path, target="no_such_module"), tmp_path / "out")
    assert "matched no supported Linear or GroupedMLP" in info.value.message
    assert info.value.problems[0].path == "lora_config.target_modules"


def test_lm_head_dropout_is_refused_not_ignored(tmp_path, corpus):
    from mftk.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        _train(_raw_only(corpus, tmp_path, target="output_layer", lora_dropout=0.1), tmp_path / "out")
    assert info.value.problems[0].path == "lora_config.lora_dropout" and "output_layer" in info.value.problems[0].hint


@pytest.mark.torch
def test_an_adapter_on_the_lm_head_trains_and_exports_merged(tmp_path, corpus):
    raw = _raw_only(corpus, tmp_path, target=r"^model\.output_layer$")
    result = _train(raw, tmp_path / "out")
    start, weights = _initial(raw)
    end = _final(tmp_path / "ckpt" / "iteration_00000003")
    assert sorted(n for n in end if "lora" in n) == ["output_layer.lora_a", "output_layer.lora_b"]
    assert all(np.array_equal(end[n], start[n]) for n in weights)
    assert not np.array_equal(end["output_layer.lora_b"], start["output_layer.lora_b"])
    m = raw["model"]
    assert f"trainable parameters: {4 * (m['hidden_size'] + m['vocab_size'])} of" in open(result.log_file).read()
    _check_merged_export(tmp_path / "ckpt", raw, tmp_path / "merged", seed=3)


def test_exclude_layers_skips_a_subtree(tmp_path, corpus):
    raw = _raw_only(corpus, tmp_path, target=DENSE, exclude_layers=r"layers\.1\.")
    _train(raw, tmp_path / "out", "training.steps=1")
    names = _final(tmp_path / "ckpt" / "iteration_00000001")
    assert "decoder.layers.0.mlp.linear_fc1.lora_a" in names
    assert not [n for n in names if n.startswith("decoder.layers.1.") and "lora" in n]


def test_a_config_with_a_bad_exclude_regex_exits_1_naming_it(tmp_path, corpus):
    raw = _raw_only(corpus, tmp_path, exclude_layers="(")
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    r = runner.invoke(app, ["validate-config", str(tmp_path / "c.yaml")])
    assert r.exit_code == 1 and "lora_config.exclude_layers" in r.output


# ------------------------------------------------------------------------------------ save_trainable_only, base_load_path
@pytest.fixture(scope="module")
def hf_base(tmp_path_factory, corpus):
    """A pretrained base as a Hugging Face dir: a plain (no LoRA) run, exported."""
    d = tmp_path_factory.mktemp("base")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=2, gbs=2)
    _train(raw, d / "out")
    r = runner.invoke(app, ["inspect-ckpt", str(d / "ckpt"), "--export-hf", str(d / "hf")])
    assert r.exit_code == 0, r.output
    return d / "hf", _final(d / "ckpt" / "iteration_00000002")


def _adapter_raw(corpus, d, base, **ck) -> dict:
    raw = _raw("qwen3_tiny.yaml", corpus, d, target=DENSE, steps=4)
    raw["checkpoint"].update({"save_trainable_only": True, "base_load_path": str(base), **ck})
    return raw


def test_adapter_only_saves_start_from_the_base_and_resume_bit_exactly(tmp_path, corpus, hf_base):
    base_dir, _ = hf_base
    full = _train(_adapter_raw(corpus, tmp_path / "a", base_dir), tmp_path / "a" / "out")
    step = tmp_path / "a" / "ckpt" / "iteration_00000004"
    saved = _final(step)
    assert saved and all(n.endswith(("lora_a", "lora_b")) for n in saved)  # adapters only
    for where in (tmp_path / "a" / "ckpt", step):
        manifest = json.loads((where / "mindformers_adapter_config.json").read_text())
        assert manifest["format"] == "mindformers_pynative_lora_adapter_v1" and manifest["global_step"] == 4
        assert manifest["base_fingerprint"] and manifest["lora_config"]["lora_rank"] == 4
    log = open(full.log_file).read()
    assert "retaining" in log and "freshly initialized adapters" in log
    raw = _adapter_raw(corpus, tmp_path / "b", base_dir)
    _train(raw, tmp_path / "b" / "out", "training.steps=2")
    resumed = _train(raw, tmp_path / "b" / "out2", resume_from=tmp_path / "b" / "ckpt" / "iteration_00000002")
    assert list(resumed.losses) == list(full.losses[2:])
    b = _final(tmp_path / "b" / "ckpt" / "iteration_00000004")
    assert all(np.array_equal(saved[n], b[n]) for n in saved)


def test_the_base_is_what_the_run_trains_on(tmp_path, corpus, hf_base):
    """Loss of step 1 with B = 0 is the base model's loss: the base checkpoint's, not the seed's init."""
    base_dir, _ = hf_base
    raw = _adapter_raw(corpus, tmp_path, base_dir)
    raw["lora_config"]["lora_b_std"] = 0.0
    on_base = _train(raw, tmp_path / "out", "training.steps=1")
    raw2 = tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "plain", steps=1, gbs=2)
    raw2["checkpoint"]["load_path"] = str(base_dir)
    raw2["checkpoint"]["no_load_optim"] = True
    plain = _train(raw2, tmp_path / "plain_out")
    assert on_base.losses[0] == pytest.approx(plain.losses[0], rel=1e-6)


def test_an_adapter_only_checkpoint_needs_its_base(tmp_path, corpus, hf_base):
    from mftk.errors import CheckpointError

    import shutil

    base_dir = tmp_path / "base"
    shutil.copytree(hf_base[0], base_dir)  # this test changes the base
    raw = _adapter_raw(corpus, tmp_path, base_dir)
    _train(raw, tmp_path / "out", "training.steps=2")
    plain = dict(raw, checkpoint={**raw["checkpoint"], "save_trainable_only": False, "base_load_path": ""})
    with pytest.raises(CheckpointError) as info:
        _train(plain, tmp_path / "out2", resume_from=tmp_path / "ckpt" / "iteration_00000002")
    assert "requires checkpoint.base_load_path" in info.value.message
    import os

    f = next(base_dir.glob("*.safetensors"))
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))  # another base (the fingerprint changes)
    with pytest.raises(CheckpointError) as info:
        _train(raw, tmp_path / "out3", resume_from=tmp_path / "ckpt" / "iteration_00000002")
    assert "fingerprint does not match" in info.value.message


@pytest.mark.torch
def test_an_adapter_only_checkpoint_exports_merged_with_its_base(tmp_path, corpus, hf_base):
    torch = pytest.importorskip("torch")
    raw = _adapter_raw(corpus, tmp_path, hf_base[0])
    _train(raw, tmp_path / "out", "training.steps=2")
    out = tmp_path / "merged"
    r = runner.invoke(app, ["inspect-ckpt", str(tmp_path / "ckpt"), "--export-hf", str(out), "--merge-lora"])
    assert r.exit_code == 0, r.output
    ids = np.random.default_rng(2).integers(1, 256, (2, 16))
    from mftk.ckpt.resume import plan_resume
    from mftk.engine.builders import build_model
    from mftk.engine.restore import param_shapes
    from mftk.engine.restore import load_checkpoint

    config = load(raw, "training.seed=7").config
    model = build_model(config)
    for path in (hf_base[0], tmp_path / "ckpt"):  # the base, then the adapters on top (as a resume does)
        load_checkpoint(plan_resume(config, str(path), weights_only=True, params=param_shapes(model)), model, config)
    ours = model.logits(ids)[0].asnumpy()
    with torch.no_grad():
        ref = _hf(out)(torch.tensor(ids)).logits.numpy()
    assert np.abs(ours - ref).max() <= TOL


def test_muon_with_expert_adapters_needs_them_in_adamw_include(tmp_path, corpus):
    """DeepSeek-V4's template trains with Muon, which orthogonalises 2-D weights and the experts' own 3-D ones:
    the 3-D expert adapters must go to its AdamW fallback (the reference raises at the first update)."""
    from mftk.errors import ConfigError

    raw = tiny_raw("deepseek_v4_tiny.yaml", corpus, tmp_path / "ckpt", steps=2, gbs=2)  # step 1: warm-up lr 0
    assert raw["optimizer"]["type"] == "Muon"
    raw["lora_config"] = {"target_modules": r"(linear_proj|experts)$", **LORA}
    with pytest.raises(ConfigError) as info:
        _train(raw, tmp_path / "out")
    assert info.value.problems[0].path == "optimizer.adamw_include" and "*_lora_*" in info.value.problems[0].hint
    raw["optimizer"]["adamw_include"] = ["*word_embeddings*", "*output_layer*", "*_lora_*"]
    start, weights = _initial(raw)
    _train(raw, tmp_path / "out2")
    end = _final(tmp_path / "ckpt" / "iteration_00000002")
    assert all(np.array_equal(end[n], start[n]) for n in weights)
    assert not np.array_equal(end["decoder.layers.0.mlp.experts.weight1_lora_b"],
                              start["decoder.layers.0.mlp.experts.weight1_lora_b"])


def test_peft_mapping_refuses_a_mapping_that_is_not_a_selection():
    """The PEFT layout is derived by running the HF weight mapping on indices: a mapping that transposes or scales
    an adapted weight has no PEFT form and must be refused, not exported wrong."""
    from mftk.ckpt.lora import peft_adapter
    from mftk.errors import CheckpointError

    base = {"l.weight": np.zeros((4, 3), np.float32)}
    adapters = {"l.lora_a": np.ones((2, 3), np.float32), "l.lora_b": np.ones((4, 2), np.float32)}
    rows = peft_adapter(base, adapters, lambda mf, cfg: {"m.weight": mf["l.weight"][::-1]}, None)[0]
    np.testing.assert_array_equal(rows["base_model.model.m.lora_B.weight"], adapters["l.lora_b"][::-1])
    for bad in (lambda mf, cfg: {"m.weight": mf["l.weight"].T.copy()},
                lambda mf, cfg: {"m.weight": mf["l.weight"] * 0.5}):
        with pytest.raises(CheckpointError, match="--merge-lora|PEFT"):
            peft_adapter(base, adapters, bad, None)
