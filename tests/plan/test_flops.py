"""Parameter counts and FLOPs against hand calculations and the reference's published figures."""
import pytest

from mftk.config.model import DeepseekV3ModelConfig, Qwen3ModelConfig
from mftk.plan.flops import flops_per_step, param_breakdown, param_counts, tflops_per_device
from tests.helpers.sizes import PYNATIVE_DS3, tiny_dsv3, tiny_qwen3


QWEN3_0_6B = dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                  head_dim=128, intermediate_size=3072, tie_word_embeddings=True)


def test_tiny_qwen3_by_hand():
    # per layer: 2 norms 8 + qkv (2+2)*3*4=48 + q/k norm 6 + proj 4*6=24 + fc1 10*4=40 + fc2 4*5=20 = 146
    # model: 2*146 + emb 40 + out 40 + final norm 4 = 376
    assert param_counts(tiny_qwen3()) == (376, 376)
    assert param_counts(tiny_qwen3(tie_word_embeddings=True)) == (336, 336)
    assert param_counts(tiny_qwen3(attention_bias=True))[0] == 376 + 2 * 12


def test_tiny_dsv3_by_hand():
    # MLA: qkv (3+2+2)*4=28, q_norm 3, qb 2*4*3=24, k_norm 2, kvb 2*(2+3)*2=20, proj 4*2*3=24 → 101; +2 norms = 109
    # dense layer: 109 + fc1 12*4=48 + fc2 4*6=24 = 181
    # MoE MLP: router 4*4=16 + expert_bias 4 + tokens 4; expert (4+2)*4... weight1 4*2*2=16, weight2 2*4=8 → 24/expert
    #   shared (Fs=2): fc1 4*4=16 + fc2 4*2=8 = 24 → total 24 + 4*24 + 24 = 144, active 24 + 2*24 + 24 = 96
    # MoE layer: 109 + 144 = 253 (active 205); MTP: 3 norms 12 + eh_proj 4*8=32 + MoE layer 253 = 297 (active 249)
    # total: emb 40 + out 40 + final 4 + 181 + 253 + 297 = 815; active: 84 + 181 + 205 + 249 = 719
    b = param_breakdown(tiny_dsv3())
    assert (b["dense_layers"], b["moe_layers"], b["mtp"]) == (181, 253, 297)
    assert param_counts(tiny_dsv3()) == (815, 719)
    # the DSv3 PyNative model never ties the head
    assert param_counts(tiny_dsv3(tie_word_embeddings=True)) == (815, 719)
    # no Q LoRA: qkv rows = nh*dq + kv + rope = 8+2+2 = 12 → 48; no q_norm, no qb: MLA 101 - 28 - 3 - 24 + 48 = 94
    assert param_counts(tiny_dsv3(q_lora_rank=None))[0] == 815 - 3 * 7


def test_pynative_ds3_reference_totals():
    b = param_breakdown(DeepseekV3ModelConfig(**PYNATIVE_DS3))
    assert b["dense_layers"] == 26_727_936 and b["moe_layers"] == 11 * 59_772_432 and b["mtp"] == 66_200_336
    assert b["total"] == 1_213_766_336  # models.md §3.1


def test_published_sizes():
    total, active = param_counts(Qwen3ModelConfig(**QWEN3_0_6B))
    assert total == 596_049_920 and active == total
    assert total - 151936 * 1024 == pytest.approx(0.44e9, rel=0.01)  # non-embedding
    total, active = param_counts(DeepseekV3ModelConfig(num_nextn_predict_layers=0))
    assert total == pytest.approx(671e9, rel=0.005)
    assert active == pytest.approx(37e9, rel=0.02)


def test_flops_pynative_ds3_reference():
    flops = flops_per_step(DeepseekV3ModelConfig(**PYNATIVE_DS3), global_batch_size=2)
    assert flops == pytest.approx(5.068e13, rel=1e-3)  # models.md §5 example


def test_flops_tiny_qwen3_by_hand():
    # H=4 nh=2 ng=1 hd=3 F=5 V=10 S=8 L=2, silu → f=3; q = 6
    # A = 6·(4·(6+6) + 6·8 + 6·4) = 6·120 = 720;  mlp = 6·4·5·3·2 = 720;  head = 6·4·10 = 240
    # per token = 720 + 720·2 + 240 = 2400; total = gbs·S·2400
    assert flops_per_step(tiny_qwen3(), global_batch_size=3) == 3 * 8 * 2400
    # gelu → f = 2: mlp = 480 → per token 2160; explicit seq_length overrides the config's
    assert flops_per_step(tiny_qwen3(hidden_act="gelu"), global_batch_size=1) == 8 * 2160
    # S=4: A = 6·(48 + 24 + 24) = 576
    assert flops_per_step(tiny_qwen3(), seq_length=4, global_batch_size=1) == 4 * (720 + 2 * 576 + 240)


def test_throughput_units():
    assert tflops_per_device(5.068e13, 1000.0, 2) == pytest.approx(25.34)


def test_optional_tensors_counted_like_the_checkpoint():
    # models.md §3.1 "optional tensors": 3 attention blocks (dense, MoE, MTP) and 2 MoE MLPs (MoE, MTP)
    base = param_counts(tiny_dsv3())[0]
    assert param_counts(tiny_dsv3(track_max_attention_logit=True))[0] == base + 3 * 2      # max_logits_val [nh]
    assert param_counts(tiny_dsv3(use_shared_expert_gating=True))[0] == base + 2 * 4       # shared_experts_gate [1, H]
    assert param_counts(tiny_dsv3(moe_aux_loss_coeff=0.01, moe_router_load_balancing_type="global_aux_loss"))[0] \
        == base + 2 * (4 + 1)                                                              # global_tokens, ga_steps
    assert param_counts(tiny_dsv3(moe_router_enable_expert_bias=False))[0] == base - 2 * 4  # no expert_bias [E]
