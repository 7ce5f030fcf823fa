"""The `model:` section of DeepSeek-V3 (MLA + MoE + MTP): its typed fields and the values the reference derives.

Its rules are in `mftk.config.model` (`_check_dsv3`); its row of facts in `mftk.config.families`.
"""
import math

import attrs

from mftk.config.model_base import RopeParams, TransformerFields, _f, _g

@attrs.frozen(kw_only=True)
class DeepseekV3ModelConfig(TransformerFields):
    """DeepSeek-V3 (MLA + MoE + MTP). Defaults: `DeepseekV3Config`'s signature plus what MindSpore Transformers injects."""

    model_type: str = _f("deepseek_v3", "Selects the config class: deepseek_v3 (or deepseek_mtp).")
    architectures: str = _f("DeepseekV3ForCausalLM", "Selects the model class (a string, not a list).")
    vocab_size: int = _f(129280, "Vocabulary size V.")
    hidden_size: int = _f(7168, "Hidden size H.")
    intermediate_size: int = _f(18432, "Width F of the dense (first_k_dense_replace) MLP layers.")
    moe_intermediate_size: int = _f(2048, "Width Fm of each routed expert (moe_ffn_hidden_size).")
    num_hidden_layers: int = _f(61, "Number of decoder layers L (num_layers).")
    num_nextn_predict_layers: int = _f(1, "MTP depth D (mtp_num_layers); 0 or 1.")
    mtp_loss_scaling_factor: float | None = _f(None, "MTP loss weight λ; required when MTP is on.")
    num_attention_heads: int = _f(128, "Attention heads nh.")
    num_key_value_heads: int | None = _f(128, "Kept for config only; MLA does not use it.")
    n_shared_experts: int = _f(1, "Shared experts (shared_expert_num); 0 turns them off.")
    moe_shared_expert_intermediate_size: int | None = _f(None, "Shared-expert width Fs; null means Fm × n_shared_experts.")
    use_shared_expert_gating: bool = _f(False, "Sigmoid gate on the shared-expert output.")
    n_routed_experts: int = _f(256, "Routed experts E (num_moe_experts).")
    num_experts_per_tok: int = _f(8, "Experts per token K (moe_router_topk).")
    routed_scaling_factor: float = _f(2.5, "Multiplies the combine weights (moe_router_topk_scaling_factor).")
    n_group: int | None = _f(8, "Expert groups for group-limited routing (moe_router_num_groups); null: off.")
    topk_group: int | None = _f(4, "Groups kept per token (moe_router_group_topk).")
    norm_topk_prob: bool = _f(True, "Renormalise the top-K weights to sum to 1.")
    moe_layer_freq: int | list[int] = _f(1, "MoE pattern: int N → layer i is MoE iff i % N == 0; a list is literal.")
    first_k_dense_replace: int | None = _f(3, "The first k layers are dense; the rest MoE.")
    moe_router_score_function: str = _f("sigmoid", "Router scores: sigmoid / softmax / sqrtsoftplus.")
    moe_router_enable_expert_bias: bool = _f(True, "Aux-loss-free balancing bias (sigmoid/sqrtsoftplus only).")
    moe_router_bias_update_rate: float = _f(0.001, "Expert-bias step γ per global step.")
    moe_router_load_balancing_type: str = _f("sub_seq_aux_loss", "aux_loss / seq_aux_loss / global_aux_loss (when coeff > 0).")
    moe_aux_loss_coeff: float = _f(0.0, "Auxiliary balance-loss weight α (0: off).")
    moe_router_force_expert_balance: bool = _f(False, "Debug: round-robin routing.")
    moe_router_pre_softmax: bool = _f(False, "Only lifts the top-1 softmax routing check: routing always takes the "
                                      "softmax over all experts before top-k, as the reference's PyNative router.")
    moe_router_dtype: str = _f("float32", "Router weight and logits dtype.")
    moe_grouped_gemm: bool = _f(False, "Must be true: the reference's pynative MoE has only the grouped-GEMM path.")
    moe_permute_fusion: bool = _f(False, "Ascend permute kernels; same result.")
    moe_apply_probs_on_input: bool = _f(False, "Multiply routing probs before the experts (top-1 only).")
    activation_func_clamp_value: float | None = _f(None, "Clamp value of the experts' SwiGLU (null: no clamp).")
    multi_latent_attention: bool = _f(True, "Multi-latent attention (MLA).")
    q_lora_rank: int | None = _f(1536, "Latent Q rank; null: no Q LoRA.")
    kv_lora_rank: int = _f(512, "Latent KV rank.")
    qk_nope_head_dim: int = _f(128, "No-rope part of the q/k head (qk_head_dim).")
    qk_rope_head_dim: int = _f(64, "Rope part of the q/k head (qk_pos_emb_head_dim).")
    v_head_dim: int = _f(128, "Value head dim.")
    qk_layernorm: bool = _f(False, "Latent q/kv RMSNorms; set true for DeepSeek/HF parity.")
    max_position_embeddings: int = _f(4096, "YaRN original context length (rope_scaling's original_... overrides).")
    rotary_scaling_factor: float = _f(40.0, "YaRN factor; also enters the MLA softmax scale (always).")
    beta_fast: float = _f(32.0, "YaRN ramp: fast boundary.")
    beta_slow: float = _f(1.0, "YaRN ramp: slow boundary.")
    mscale: float = _f(0.707, "YaRN magnitude term (also in the MLA softmax scale).")
    mscale_all_dim: float = _f(0.707, "YaRN magnitude term of the denominator.")
    rotary_percent: float = _f(1.0, "Fraction of the rope dims rotated.")
    hidden_dropout: float = _f(0.0, "Dropout on the embedding output and both residual branches.")
    pad_token_id: int = _f(0, "Keys equal to this id are masked (null means 0: DeepSeek's BOS).")
    bos_token_id: int | None = _f(0, "Accepted; unused in training.")
    eos_token_id: int | None = _f(1, "Accepted; unused in training.")

    # --- derived values (reference __post_init__) ---
    def ffn_hidden_size(self) -> int:
        return self.intermediate_size

    def kv_channels(self) -> int:
        return self.hidden_size // max(self.num_attention_heads, 1)  # unused by MLA

    def num_query_groups(self) -> int:
        return self.num_key_value_heads if self.num_key_value_heads is not None else self.num_attention_heads

    def q_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe(self) -> bool:
        return any(self.moe_layer_pattern())

    def moe_layer_pattern(self) -> list[bool]:
        """Which decoder layers are MoE (models.md §1.7, §2.1)."""
        L, freq, k = self.num_hidden_layers, self.moe_layer_freq, self.first_k_dense_replace
        if isinstance(freq, list):
            return [bool(x) for x in freq]
        if k is not None and freq <= 1:
            return [False] * min(k, L) + [True] * max(L - k, 0)
        n = max(freq, 1)
        return [i % n == 0 for i in range(L)]

    def moe_shared_expert_intermediate_size_resolved(self) -> int:
        """Fs: explicit value, else Fm × n_shared_experts; 0 when there are no shared experts."""
        if self.n_shared_experts <= 0:
            return 0
        if self.moe_shared_expert_intermediate_size is not None:
            return self.moe_shared_expert_intermediate_size
        return self.moe_intermediate_size * self.n_shared_experts

    def mtp_num_layers(self) -> int:
        return self.num_nextn_predict_layers

    def rope_params(self) -> RopeParams:
        """Flat YaRN keys with an HF `rope_scaling` dict applied on top (models.md §1.7)."""
        pet, factor, orig = self.position_embedding_type, float(self.rotary_scaling_factor), self.max_position_embeddings
        extra = {"beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
                 "mscale": self.mscale, "mscale_all_dim": self.mscale_all_dim}
        rs = self.rope_scaling
        if rs:
            pet = rs.get("type", rs.get("rope_type", pet))
            factor = float(rs.get("factor", factor))
            orig = int(rs.get("original_max_position_embeddings", self.seq_length))
            extra.update({k: float(rs[k]) for k in extra if k in rs})
        return RopeParams(pet, float(self.rope_theta), factor, orig, **{k: float(v) for k, v in extra.items()})

    def mla_softmax_scale(self) -> float:
        """g(rotary_scaling_factor, mscale)² / √(nope + rope): applied whatever the RoPE type (gotcha #3)."""
        rp = self.rope_params()
        return _g(rp.factor, rp.mscale) ** 2 / math.sqrt(self.q_head_dim())
