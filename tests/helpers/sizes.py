"""Hand-countable model configs (a few parameters each) and the reference's pynative_ds3.yaml model."""
from __future__ import annotations

import itertools

from mftk.config.model import DeepseekV3ModelConfig, Qwen3ModelConfig


# pynative_ds3.yaml (models.md §1.6 / §3.1)
PYNATIVE_DS3 = dict(
    model_type="deepseek_v3", vocab_size=129280, seq_length=4096, hidden_size=1792, intermediate_size=3072,
    num_hidden_layers=12, max_position_embeddings=163840, hidden_act="fusedswiglu", num_attention_heads=8,
    kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=192,
    qk_layernorm=True, num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.3, position_embedding_type="yarn",
    rotary_scaling_factor=40.0, mscale=1.0, mscale_all_dim=1.0, moe_grouped_gemm=True,
    moe_intermediate_size=1024, first_k_dense_replace=1, n_routed_experts=8, num_experts_per_tok=4,
    n_shared_experts=1, moe_shared_expert_intermediate_size=1024, moe_router_load_balancing_type="seq_aux_loss",
    moe_aux_loss_coeff=0.001, n_group=4, topk_group=2)


def tiny_qwen3(**kw):
    return Qwen3ModelConfig(**{**dict(vocab_size=10, hidden_size=4, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=3, intermediate_size=5, seq_length=8), **kw})


def tiny_dsv3(**kw):
    return DeepseekV3ModelConfig(**{**dict(
        vocab_size=10, hidden_size=4, intermediate_size=6, moe_intermediate_size=2, num_hidden_layers=2,
        num_nextn_predict_layers=1, mtp_loss_scaling_factor=0.1, num_attention_heads=2, n_shared_experts=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
        q_lora_rank=3, kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3, qk_layernorm=True,
        moe_grouped_gemm=True, seq_length=8), **kw})


def brute_count(world: int, moe: bool, max_inter: int) -> int:
    """Independent count: loop over every degree 1..world, keep products equal to world."""
    n = 0
    rng = range(1, world + 1)
    for rep, shard, cp, tp, pp in itertools.product(rng, rng, rng, rng, rng):
        if rep * shard * cp * tp * pp != world:
            continue
        eps = sum(1 for ep in range(1, world + 1) if (shard * cp * tp) % ep == 0) if moe else 1
        n += eps * (max_inter if pp > 1 else 1)
    return n
