"""GPTModel end to end: registry, names, init, outputs, expert-bias update, overfitting one batch."""
from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mftk.engine import ModelOutput, build_model, build_spec, load_state_dict, state_dict
from mftk.errors import CheckpointError, ConfigError


pytestmark = pytest.mark.engine


def _batch(rng, cfg, b=2, s=8):
    ids = rng.integers(1, cfg.vocab_size, (b, s))
    return {"input_ids": ids, "labels": np.roll(ids, -1, 1), "loss_mask": np.ones((b, s), np.float32)}


def test_unknown_family_is_a_config_error(tiny_qwen3):
    import attrs

    bad = attrs.evolve(tiny_qwen3(), model_type="llama9", architectures="Llama9ForCausalLM")
    with pytest.raises(ConfigError) as err:
        build_spec(bad)
    assert "qwen3" in err.value.problems[0].hint


def test_dsv3_parameter_names_follow_the_reference(tiny_dsv3):
    names = set(state_dict(build_model(tiny_dsv3(), seed=0)))
    expected = {
        "embedding.word_embeddings.weight", "decoder.layers.0.mlp.linear_fc1.weight",
        "decoder.layers.1.self_attention.linear_qkv.weight", "decoder.layers.1.self_attention.linear_qb.weight",
        "decoder.layers.1.self_attention.linear_kvb.weight", "decoder.layers.1.self_attention.q_layernorm.weight",
        "decoder.layers.1.mlp.router.weight", "decoder.layers.1.mlp.expert_bias", "decoder.layers.1.mlp.tokens_per_expert",
        "decoder.layers.1.mlp.experts.weight1", "decoder.layers.1.mlp.experts.weight2",
        "decoder.layers.1.mlp.shared_experts.linear_fc1.weight", "decoder.final_layernorm.weight", "output_layer.weight",
        "mtp.layers.0.enorm.weight", "mtp.layers.0.hnorm.weight", "mtp.layers.0.eh_proj.weight",
        "mtp.layers.0.final_layernorm.weight", "mtp.layers.0.transformer_layer.mlp.experts.weight1"}
    assert expected <= names
    assert not any(n.startswith("model.") for n in names)


def test_qwen3_tied_has_no_output_layer_and_init_uses_configured_std(tiny_qwen3):
    sd = state_dict(build_model(tiny_qwen3(tie_word_embeddings=True, initializer_range=0.2,
                                           vocab_size=400, hidden_size=64), seed=0))
    assert "output_layer.weight" not in sd
    assert sd["embedding.word_embeddings.weight"].std() == pytest.approx(0.2, rel=0.03)
    assert (sd["decoder.layers.0.input_layernorm.weight"] == 1).all()


def test_same_seed_same_weights_and_load_state_dict_checks_shapes(tiny_qwen3):
    cfg = tiny_qwen3()
    a, b = build_model(cfg, seed=5), build_model(cfg, seed=5)
    sa = state_dict(a)
    assert all(np.array_equal(sa[k], v) for k, v in state_dict(b).items())
    load_state_dict(b, sa)
    bad = dict(sa)
    bad["decoder.final_layernorm.weight"] = np.ones(3, np.float32)
    del bad["output_layer.weight"]
    with pytest.raises(CheckpointError) as err:
        load_state_dict(b, bad)
    assert len(err.value.problems) == 2


def test_objective_is_loss_plus_weighted_aux_and_mtp(rng, tiny_dsv3):
    cfg = tiny_dsv3()
    model = build_model(cfg, seed=0)
    out = model.forward(_batch(rng, cfg))
    assert isinstance(out, ModelOutput)
    assert out.load_balancing_losses.shape == (2,)  # decoder MoE layer + MTP layer
    assert out.tokens_per_expert.shape == (2, cfg.n_routed_experts)
    assert (out.tokens_per_expert.sum(1) == 2 * 8 * cfg.num_experts_per_tok).all()
    assert out.objective == pytest.approx(out.loss + 0.01 * out.load_balancing_losses.sum() + out.mtp_losses.sum(),
                                          rel=1e-5)
    assert out.loss == pytest.approx(np.log(cfg.vocab_size), rel=0.05)  # small init → near-uniform


def test_default_loss_mask_drops_pad_tokens(rng, tiny_qwen3):
    cfg = tiny_qwen3()
    model = build_model(cfg, seed=0)
    batch = _batch(rng, cfg)
    batch["input_ids"][:, -3:] = cfg.pad_token_id  # padded tail
    no_mask = {k: v for k, v in batch.items() if k != "loss_mask"}
    explicit = dict(batch, loss_mask=(batch["input_ids"] != cfg.pad_token_id).astype(np.float32))
    assert model.forward(no_mask).loss == pytest.approx(model.forward(explicit).loss, rel=1e-6)


def test_update_expert_bias_uses_accumulated_counts(rng, tiny_dsv3):
    cfg = tiny_dsv3(moe_router_bias_update_rate=0.5)
    model = build_model(cfg, seed=0)
    out = model.forward(_batch(rng, cfg))
    model.update_expert_bias()
    for moe, counts in zip(model.moe_layers(), out.tokens_per_expert):
        assert np.allclose(moe.expert_bias.asnumpy(), 0.5 * np.sign(counts.mean() - counts))
        assert not moe.tokens_per_expert.asnumpy().any()


@pytest.mark.parametrize("family", ["qwen3", pytest.param("deepseek_v3", marks=pytest.mark.slow)])
def test_tiny_model_overfits_one_batch(rng, tiny_qwen3, tiny_dsv3, family):
    cfg = tiny_qwen3() if family == "qwen3" else tiny_dsv3(moe_router_bias_update_rate=0.01)
    model = build_model(cfg, seed=0)
    batch = _batch(rng, cfg, b=2, s=8)
    args = (batch["input_ids"], batch["labels"], batch["loss_mask"])
    params = model.trainable_params()
    opt = nn.Adam(params, learning_rate=1e-2)
    step = ms.value_and_grad(model, None, params, has_aux=True)
    first = None
    for _ in range(40):
        out, grads = step(*args)
        opt(grads)
        model.update_expert_bias()
        first = first if first is not None else float(out[1].asnumpy())
    last = model.forward(batch)
    assert first > 4.0 and last.loss < 0.05, (first, last.loss)


@pytest.mark.parametrize("family", ["qwen3", "deepseek_v3"])
def test_jit_blocks_keeps_loss_and_gradients(rng, tiny_qwen3, tiny_dsv3, family):
    """Dense layers compiled whole (MLA included), MoE layers their attention; MTP layers too."""
    cfg = tiny_qwen3() if family == "qwen3" else tiny_dsv3()
    eager, jitted = build_model(cfg, seed=0), build_model(cfg, seed=0)
    jitted.jit_blocks()
    compiled = [layer._compiled is not None for layer in jitted.transformer_layers()]
    assert compiled == [not layer.is_moe for layer in jitted.transformer_layers()] and any(compiled)
    args = tuple(_batch(rng, cfg).values())
    (oe, ge), (oj, gj) = (ms.value_and_grad(m, None, m.trainable_params(), has_aux=True)(*args)
                          for m in (eager, jitted))
    assert float(oe[0].asnumpy()) == pytest.approx(float(oj[0].asnumpy()), rel=1e-5)
    assert all(np.allclose(a.asnumpy(), b.asnumpy(), atol=1e-6) for a, b in zip(ge, gj))


def test_jit_blocks_compile_v4_mixes_and_attention_projections_keeping_loss_and_gradients(rng, tiny_dsv4):
    """DeepSeek-V4: each layer's two hyper-connection mixes, its attention projections, its compressor and
    indexer scores and its shared expert (MTP's too) run compiled; the Sinkhorn, the rest of the core attention
    and the routed experts stay eager. Loss and every gradient as the eager model's."""
    cfg = tiny_dsv4()
    eager, jitted = build_model(cfg, seed=0), build_model(cfg, seed=0)
    jitted.jit_blocks()
    assert all(getattr(layer.self_attention._project, "__wrapped__", None) is not None
               for layer in jitted.transformer_layers())  # mindspore.jit wrappers, not the bound methods
    assert all(getattr(layer.mlp.shared_experts._ffn, "__wrapped__", None) is not None
               for layer in jitted.transformer_layers())
    cores = [layer.self_attention.core_attention for layer in jitted.transformer_layers()]
    parts = [c.compressor._pool for c in cores if c.compressor is not None] + [
        c.indexer._score for c in cores if c.indexer is not None]  # the indexer's compressor runs in its graph
    assert len(parts) >= 3 and all(getattr(f, "__wrapped__", None) is not None for f in parts)
    hcs = [hc for layer in jitted.transformer_layers() for hc in (layer.attn_hc, layer.ffn_hc)]
    assert len(hcs) == 2 * (cfg.num_hidden_layers + 1) and all(hc.jit_mix for hc in hcs)
    assert not any(layer.attn_hc.jit_mix for layer in eager.transformer_layers())
    batch = _batch(rng, cfg, s=cfg.seq_length)
    args = (batch["input_ids"], batch["labels"], batch["loss_mask"])
    (oe, ge), (oj, gj) = (ms.value_and_grad(m, None, m.trainable_params(), has_aux=True)(*args)
                          for m in (eager, jitted))
    assert float(oe[0].asnumpy()) == pytest.approx(float(oj[0].asnumpy()), rel=1e-6)
    assert len(ge) == len(gj) and all(np.allclose(a.asnumpy(), b.asnumpy(), rtol=1e-5, atol=1e-7)
                                      for a, b in zip(ge, gj))
    hc_grads = [g for p, g in zip(jitted.trainable_params(), gj) if "attn_hc.mapping_proj" in p.name]
    assert hc_grads and all(float(np.abs(g.asnumpy()).max()) > 0 for g in hc_grads)  # the mixes do train


def test_jit_blocks_leave_layers_with_dropout_to_eager_except_attention(tiny_qwen3):
    model = build_model(tiny_qwen3(hidden_dropout=0.1), seed=0)
    model.jit_blocks()
    assert all(layer._compiled is None for layer in model.transformer_layers())


@pytest.mark.parametrize("family", ["qwen3", "qwen3_tied", "deepseek_v3"])
def test_parameter_count_equals_plan_arithmetic(tiny_qwen3, tiny_dsv3, family):
    from mftk.plan.flops import param_counts

    cfg = {"qwen3": tiny_qwen3, "qwen3_tied": lambda: tiny_qwen3(tie_word_embeddings=True),
           "deepseek_v3": tiny_dsv3}[family]()
    total = sum(int(np.prod(p.shape)) for p in build_model(cfg, seed=0).get_parameters())
    assert total == param_counts(cfg)[0]


def test_hidden_dropout_applies_in_training_mode_only(rng, tiny_qwen3):
    cfg = tiny_qwen3(hidden_dropout=0.5)
    model = build_model(cfg, seed=0)
    batch = _batch(rng, cfg)
    assert model.forward(batch).loss != model.forward(batch).loss  # a fresh dropout mask each call
    model.set_train(False)
    assert model.forward(batch).loss == model.forward(batch).loss


def test_global_aux_loss_uses_running_counts_until_reset(rng, tiny_dsv3):
    cfg = tiny_dsv3(moe_router_load_balancing_type="global_aux_loss")
    model = build_model(cfg, seed=0)
    batch = _batch(rng, cfg)
    model.forward(batch)
    model.forward(batch)
    router = model.moe_layers()[0].router
    assert float(router.ga_steps.asnumpy()[0]) == 2.0
    assert router.global_tokens_per_expert.asnumpy().sum() == 2 * 2 * 8 * cfg.num_experts_per_tok
    model.reset_global_aux_stats()
    assert not router.ga_steps.asnumpy().any() and not router.global_tokens_per_expert.asnumpy().any()
