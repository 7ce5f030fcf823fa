"""Tiny model configs and the finite-difference check (the fixtures wrapping them are in tests/conftest.py)."""
from __future__ import annotations

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")
ms.runtime.launch_blocking()  # synchronous errors, and faster on CPU (mindspore-cpu.md §10)

from mftk.config.model import DeepseekV3ModelConfig, Qwen3ModelConfig  # noqa: E402

YARN = {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256, "beta_fast": 32.0,
        "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}


def make_qwen3(**kw) -> Qwen3ModelConfig:
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, hidden_dropout=0.0, pad_token_id=0, rope_theta=1e6,
                initializer_range=0.05)
    return Qwen3ModelConfig(**{**base, **kw})


def make_dsv3(**kw) -> DeepseekV3ModelConfig:
    base = dict(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16, num_hidden_layers=2,
                num_attention_heads=2, num_key_value_heads=2, q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8,
                qk_rope_head_dim=16, v_head_dim=12, n_routed_experts=8, num_experts_per_tok=2, n_group=4,
                topk_group=2, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
                num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.3, qk_layernorm=True, moe_grouped_gemm=True,
                rope_scaling=dict(YARN), rope_theta=10000.0, moe_aux_loss_coeff=0.01,
                moe_router_load_balancing_type="seq_aux_loss", initializer_range=0.05, pad_token_id=0)
    return DeepseekV3ModelConfig(**{**base, **kw})


def directional_check(fn, params, rng, eps=1e-3, rtol=2e-2):
    """⟨∇f, v⟩ from autograd equals (f(θ+εv) − f(θ−εv)) / 2ε for a random direction v."""
    from mindspore import Tensor

    grads = ms.grad(fn, None, params)()
    vs = [rng.normal(0, 1, p.shape).astype(np.float32) for p in params]
    analytic = sum(float((g.asnumpy() * v).sum()) for g, v in zip(grads, vs))
    base = [p.asnumpy().copy() for p in params]

    def at(sign):
        for p, b, v in zip(params, base, vs):
            p.set_data(Tensor(b + sign * eps * v))
        return float(fn().asnumpy())

    numeric = (at(1) - at(-1)) / (2 * eps)
    for p, b in zip(params, base):
        p.set_data(Tensor(b))
    assert analytic == pytest.approx(numeric, rel=rtol, abs=1e-4)


TRAIN_ARCH = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=4, head_dim=16, rope_theta=1e6, tie_word_embeddings=True)


def train_model():
    """A tiny tied-embedding Qwen3 built with seed 0, for trainer tests."""
    import mindspore as ms

    ms.runtime.launch_blocking()
    from mftk.config.model import Qwen3ModelConfig
    from mftk.engine import build_model

    return build_model(Qwen3ModelConfig(**TRAIN_ARCH, hidden_dropout=0.0, pad_token_id=-1, initializer_range=0.02), seed=0)


def make_dsv4(**kw):
    """Tiny DeepSeek-V4: layer 0 sliding + hash-routed, layer 1 CSA (indexer top-2 of 8 entries at S=32),
    layer 2 HCA (ratio 8), one sliding MTP layer; 4 residual streams; clamped SwiGLU."""
    from mftk.config.model import DeepseekV4ModelConfig

    base = dict(vocab_size=96, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, q_lora_rank=24,
                qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=16, o_groups=2, o_lora_rank=8,
                compress_ratios=[0, 4, 8, 0], csa_window_size=6, index_n_heads=16, index_head_dim=8, index_topk=2,
                num_residual_streams=4, mhc_sinkhorn_iterations=20, moe_intermediate_size=16,
                moe_shared_expert_intermediate_size=16, n_shared_experts=1, n_routed_experts=4, num_experts_per_tok=2,
                routed_scaling_factor=1.5, num_hash_layers=1, num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.3,
                rotary_scaling_factor=4.0, original_max_position_embeddings=16, rope_theta=10000.0,
                compress_rope_theta=160000.0, activation_func_clamp_value=0.5, initializer_range=0.1,
                apply_dsa_kernel_fusion=False, seq_length=32, max_position_embeddings=64)
    return DeepseekV4ModelConfig(**{**base, **kw})


def make_qwen3_moe(**kw):
    """Tiny Qwen3-MoE: layer 0 dense (mlp_only_layers), layers 1-2 MoE (8 experts, top-2, softmax, renormalised)."""
    from mftk.config.model import Qwen3MoeModelConfig

    base = dict(vocab_size=96, hidden_size=32, intermediate_size=40, num_hidden_layers=3, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=2,
                norm_topk_prob=True, mlp_only_layers=[0], rope_theta=1e6, initializer_range=0.05, pad_token_id=0)
    return Qwen3MoeModelConfig(**{**base, **kw})


def torch_masked_ce(logits: np.ndarray, labels: np.ndarray, mask: np.ndarray) -> float:
    """Independent masked-mean CE in torch float64."""
    import torch

    z = torch.tensor(logits, dtype=torch.float64).reshape(-1, logits.shape[-1])
    ce = torch.nn.functional.cross_entropy(z, torch.tensor(labels.reshape(-1)), reduction="none").numpy()
    return float((ce * mask.reshape(-1)).sum() / mask.sum())


class RecomputeSection:
    """A stand-in for the config's recompute section (`recompute.mode`, ranges, `select_module`, ...)."""

    def __init__(self, **kw):
        self.mode, self.full_recompute_layer, self.select_module, self.exclude_op = "None", None, None, None
        self.enable = False
        self.__dict__.update(kw)


def count_forwards(model, paths) -> dict:
    """Wrap the forward of each cell at ``paths`` in ``model`` to count its calls (install before recompute, so the
    count is of the cells' own forwards, beneath an exclusion or a replay); returns the live counts."""
    cells, calls = dict(model.cells_and_names()), {p: 0 for p in paths}
    for p in paths:
        original = cells[p].construct

        def counting(*a, p=p, original=original, **k):
            calls[p] += 1
            return original(*a, **k)
        cells[p].construct = counting
    return calls


def value_and_grads(model, args):
    """(loss, gradients of the trainable parameters) of one forward of ``model`` on ``args``."""
    out, grads = ms.value_and_grad(model, None, model.trainable_params(), has_aux=True)(*args)
    return float(out[0].asnumpy()), [g.asnumpy() for g in grads]


def lm_args(cfg, rng):
    """Token ids, their next-token labels and a full loss mask: a (2, 8) batch."""
    ids = rng.integers(1, cfg.vocab_size, (2, 8))
    return ids, np.roll(ids, -1, 1), np.ones((2, 8), np.float32)
