"""The `model:` section of Qwen3-MoE (`model_type: qwen3_moe`), a family MindSpore Transformers 2.1.0 has no
PyNative model for (mindformers-2.1.md §6.3): the fields are transformers' `Qwen3MoeConfig` (§6.1) plus
the reference's MoE training keys, with the reference's `TransformerConfig` names as aliases.

Layer i is MoE iff ``i ∉ mlp_only_layers``, ``num_experts > 0`` and ``(i + 1) % decoder_sparse_step == 0``,
else a dense SwiGLU MLP of width ``intermediate_size`` (as transformers). The router is a softmax
over the experts, top-K, renormalised only with ``norm_topk_prob``; no shared experts, no expert
bias. transformers' joint load-balancing loss (``output_router_logits``) is not implemented; the
per-layer aux losses of the other MoE families (``moe_aux_loss_coeff``) are.
"""
import attrs

from mftk.config.model_base import AUX_LOSS_TYPES, TransformerFields, _err, _f, _positive
from mftk.errors import Problem


@attrs.frozen(kw_only=True)
class Qwen3MoeModelConfig(TransformerFields):
    """Qwen3-MoE (GQA + qk-norm attention, softmax-routed experts). Defaults: transformers' `Qwen3MoeConfig`."""

    model_type: str = _f("qwen3_moe", "Selects the config class: qwen3_moe.")
    architectures: str = _f("Qwen3MoeForCausalLM", "Selects the model class (a string, not a list).")
    vocab_size: int = _f(151936, "Vocabulary size V.")
    hidden_size: int = _f(2048, "Hidden size H.")
    intermediate_size: int = _f(6144, "Width of the dense (mlp_only_layers) MLP layers.")
    num_hidden_layers: int = _f(24, "Number of decoder layers L (num_layers).")
    num_attention_heads: int = _f(32, "Query heads nh.")
    num_key_value_heads: int | None = _f(4, "KV heads ng for GQA (num_query_groups); null means nh.")
    head_dim: int | None = _f(None, "Head dim hd (kv_channels); null means H // nh.")
    max_position_embeddings: int = _f(32768, "Accepted; RoPE tables are built for the batch's length.")
    rope_theta: float = _f(10000.0, "RoPE base θ (Qwen3-MoE checkpoints: 1000000.0).")
    moe_intermediate_size: int = _f(768, "Width F of each routed expert (moe_ffn_hidden_size).")
    num_experts: int = _f(128, "Routed experts E (num_moe_experts, num_local_experts).")
    num_experts_per_tok: int = _f(8, "Experts per token K (moe_router_topk).")
    norm_topk_prob: bool = _f(False, "Renormalise the top-K softmax weights to sum to 1.")
    routed_scaling_factor: float = _f(1.0, "Multiplies the combine weights (transformers has none: 1.0).")
    decoder_sparse_step: int = _f(1, "Layer i is MoE when (i + 1) % decoder_sparse_step == 0.")
    mlp_only_layers: list[int] | None = _f(None, "Layers that are dense MLPs whatever decoder_sparse_step says.")
    moe_aux_loss_coeff: float = _f(0.0, "Per-layer auxiliary balance-loss weight (0: off).")
    moe_router_load_balancing_type: str = _f("aux_loss", "aux_loss / seq_aux_loss / global_aux_loss (when coeff > 0).")
    moe_router_dtype: str = _f("float32", "Router weight and logits dtype.")
    moe_grouped_gemm: bool = _f(True, "Must be true (grouped experts).")
    use_sliding_window: bool = _f(False, "Must be false: sliding-window attention is not implemented.")
    hidden_dropout: float = _f(0.0, "Dropout on the embedding output and both residual branches.")
    pad_token_id: int = _f(-1, "Keys equal to this id are masked; -1: none.")
    bos_token_id: int | None = _f(None, "Accepted; unused in training.")
    eos_token_id: int | None = _f(None, "Accepted; unused in training.")

    # --- derived values ---
    def ffn_hidden_size(self) -> int:
        return self.intermediate_size

    def kv_channels(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // max(self.num_attention_heads, 1)

    def num_query_groups(self) -> int:
        return self.num_key_value_heads if self.num_key_value_heads is not None else self.num_attention_heads

    @property
    def n_routed_experts(self) -> int:
        """The other MoE families' name for ``num_experts`` (read by the planners)."""
        return self.num_experts

    def is_moe(self) -> bool:
        return any(self.moe_layer_pattern())

    def moe_layer_pattern(self) -> list[bool]:
        dense = set(self.mlp_only_layers or ())
        step = max(self.decoder_sparse_step, 1)
        return [i not in dense and self.num_experts > 0 and (i + 1) % step == 0 for i in range(self.num_hidden_layers)]

    def moe_shared_expert_intermediate_size_resolved(self) -> int:
        return 0

    moe_router_enable_expert_bias = False  # class constants the planners read like fields
    use_shared_expert_gating = False

    def mtp_num_layers(self) -> int:
        return 0


ALIASES = {
    "num_layers": "num_hidden_layers",
    "ffn_hidden_size": "intermediate_size",
    "num_query_groups": "num_key_value_heads",
    "layernorm_epsilon": "rms_norm_eps",
    "rotary_base": "rope_theta",
    "add_qkv_bias": "attention_bias",
    "init_method_std": "initializer_range",
    "kv_channels": "head_dim",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "num_moe_experts": "num_experts",
    "num_local_experts": "num_experts",
    "moe_router_topk": "num_experts_per_tok",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "router_dense_type": "moe_router_dtype",
}
DELETED = ("auto_map", "torch_dtype", "use_cache", "transformers_version", "max_window_layers", "sliding_window",
           "layer_types", "output_router_logits", "router_aux_loss_coef")


def check_qwen3_moe(cfg: Qwen3MoeModelConfig, ps: list[Problem]) -> None:
    _positive(cfg, ps, ("moe_intermediate_size", "num_experts", "num_experts_per_tok", "decoder_sparse_step", "head_dim"))
    nh, ng = cfg.num_attention_heads, cfg.num_query_groups()
    if ng > 0 and nh > 0 and nh % ng:
        _err(ps, "num_key_value_heads", ng, f"num_attention_heads % num_key_value_heads = {nh} % {ng} = {nh % ng}, "
             "must be 0", "pick a divisor of num_attention_heads")
    if cfg.kv_channels() % 2:
        _err(ps, "head_dim", cfg.kv_channels(), "RoPE rotates pairs: head_dim must be even", "e.g. 128")
    E, K = cfg.num_experts, cfg.num_experts_per_tok
    if K > E > 0:
        _err(ps, "num_experts_per_tok", K, f"top-K {K} exceeds num_experts {E}", f"use at most {E}")
    bad = [i for i in (cfg.mlp_only_layers or ()) if not 0 <= i < cfg.num_hidden_layers]
    if bad:
        _err(ps, "mlp_only_layers", cfg.mlp_only_layers, f"layer ids {bad} are outside 0..{cfg.num_hidden_layers - 1}",
             "list decoder layer ids")
    if cfg.use_sliding_window:
        _err(ps, "use_sliding_window", True, "sliding-window attention is not implemented for qwen3_moe",
             "set use_sliding_window: false")
    if cfg.rope_scaling:
        _err(ps, "rope_scaling", cfg.rope_scaling, "Qwen3-MoE uses plain RoPE in mftk", "remove rope_scaling (null)")
    if cfg.position_embedding_type != "rope":
        _err(ps, "position_embedding_type", cfg.position_embedding_type, "Qwen3-MoE uses rope",
             "set position_embedding_type: rope")
    if not cfg.moe_grouped_gemm:
        _err(ps, "moe_grouped_gemm", False, "the experts are grouped (as the reference's MoE)", "set moe_grouped_gemm: true")
    if cfg.add_bias_linear:
        _err(ps, "add_bias_linear", True, "must be false with MoE", "set add_bias_linear: false")
    if cfg.moe_aux_loss_coeff < 0:
        _err(ps, "moe_aux_loss_coeff", cfg.moe_aux_loss_coeff, "must be >= 0", "0 turns the aux loss off")
    elif cfg.moe_aux_loss_coeff > 0 and cfg.moe_router_load_balancing_type not in AUX_LOSS_TYPES:
        _err(ps, "moe_router_load_balancing_type", cfg.moe_router_load_balancing_type,
             f"must be one of {', '.join(AUX_LOSS_TYPES)} when moe_aux_loss_coeff > 0", "e.g. aux_loss")
