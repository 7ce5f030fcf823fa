"""DeepSeek-V4 and Qwen3-MoE parameter counts equal the values of the built model (buffers included), and the
FLOPs follow the documented convention."""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from mftk.plan.flops import flops_per_step, param_breakdown, param_counts

pytestmark = pytest.mark.engine


def _model_values(cfg) -> tuple[int, int]:
    """(all values, values of one token's path): the second drops the (E − K) unused experts per MoE layer."""
    from mftk.engine import build_model, state_dict

    sd = state_dict(build_model(cfg, seed=0))
    total = sum(int(v.size) for v in sd.values())
    unused = sum(int(v.size) * (1 - cfg.num_experts_per_tok / v.shape[0]) for k, v in sd.items()
                 if k.endswith(("experts.weight1", "experts.weight2")))
    return total, total - int(round(unused))


@pytest.mark.parametrize("change", [{}, {"csa_dense_mode": True}, {"tie_word_embeddings": True},
                                    {"num_nextn_predict_layers": 0, "compress_ratios": [0, 4, 8]},
                                    {"moe_router_enable_expert_bias": False, "n_shared_experts": 0,
                                     "moe_shared_expert_intermediate_size": None},
                                    {"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16}])
def test_deepseek_v4_counts_equal_the_model(change):
    from tests.helpers.models import make_dsv4

    cfg = attrs.evolve(make_dsv4(), **change)
    assert param_counts(cfg) == _model_values(cfg)


def test_qwen3_moe_counts_equal_the_model():
    from tests.helpers.models import make_qwen3_moe

    cfg = make_qwen3_moe()
    assert param_counts(cfg) == _model_values(cfg)


def test_deepseek_v4_flops_by_hand():
    """One sliding layer, no MTP, S = 8, window 4: 6·(matmul weights) + 12·nh·d·(mean keys) per token, + head."""
    from mftk.config.model import DeepseekV4ModelConfig

    cfg = DeepseekV4ModelConfig(vocab_size=10, hidden_size=4, num_hidden_layers=1, num_attention_heads=2, q_lora_rank=3,
                                qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=4, o_groups=2, o_lora_rank=2,
                                compress_ratios=[0], csa_window_size=4, num_residual_streams=2, moe_intermediate_size=3,
                                n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, num_nextn_predict_layers=0,
                                seq_length=8)
    H, nh, d, rq, g, ro, n, F = 4, 2, 4, 3, 2, 2, 2, 3
    attn = rq * H + rq + nh * d * rq + d + d * H + d + g * ro * (nh * d // g) + H * g * ro + nh  # the params, with norms
    hc = 2 * (2 + n) * n * n * H
    moe = 2 * 3 * F * H + 3 * F * H + 4 * H  # K experts, shared, router
    keys = np.mean([min(4, p + 1) for p in range(8)])
    per_token = 6 * (attn + hc + moe) + 12 * nh * d * keys + 6 * H * 10
    assert flops_per_step(cfg, global_batch_size=3) == pytest.approx(3 * 8 * per_token)
    assert param_breakdown(cfg)["dense_layers"] == 0
