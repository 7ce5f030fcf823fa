"""The `model:` section of DeepSeek-V4 (`model_type: deepseek_v4`), as MindSpore Transformers 2.1.0 reads it.

Every key of the four shipped pretraining YAMLs (`configs/deepseek4/pretrain_deepseek4_{flash,pro}
[_reduction].yaml`, mindformers-2.1.md §5.2) is a field here, under the YAML's own name; the
`MLATransformerConfig` names (`csa_compress_ratios`, `moe_n_hash_layers`, …) and the HF
`DeepseekV4Config` names (`sliding_window`, `hc_mult`, `swiglu_limit`, …) are aliases. Where the
reference and `transformers` compute differently, mftk computes what `transformers` does (the tables of
docs/compatibility.md); the rules below are the reference's own plus the ones the engine needs.

Layer schedule: ``compress_ratios`` has one entry per decoder layer and one per MTP layer (the
reference indexes it by global layer id). 0 = sliding window only, 4 = compressed sparse attention
(overlapping compressor + lightning indexer + top-k), any other ratio ≥ 8 = heavily compressed
attention (the reference accepts 128 only; smaller ratios let tiny models exercise the path).
"""

import math

import attrs

from mftk.config.model_base import (AUX_LOSS_TYPES, NOTE, SCORE_FUNCTIONS, RopeParams, TransformerFields, _err, _f,
                                    _g, _positive)
from mftk.errors import Problem

SLIDING, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
CSA_RATIO = 4
REFERENCE_RATIOS = (0, 4, 128)


@attrs.frozen(kw_only=True)
class DeepseekV4ModelConfig(TransformerFields):
    """DeepSeek-V4 (hybrid sliding/compressed/sparse attention, mHC, hash-routed MoE, MTP). Defaults: `DeepseekV4Config` + MF-registered (mindformers-2.1 §5.1)."""

    model_type: str = _f("deepseek_v4", "Selects the config class: deepseek_v4.")
    architectures: str = _f("DeepseekV4ForCausalLM", "Selects the model class (a string, not a list).")
    vocab_size: int = _f(129280, "Vocabulary size V (also the rows of the hash layers' tid2eid table).")
    hidden_size: int = _f(4096, "Hidden size H (one residual stream).")
    num_hidden_layers: int = _f(43, "Number of decoder layers L (num_layers); every layer is MoE.")
    num_attention_heads: int = _f(64, "Query heads nh (one shared KV head: MQA).")
    max_position_embeddings: int = _f(1048576, "Accepted; RoPE tables are built for the batch's length.")
    # --- attention ---
    q_lora_rank: int = _f(1024, "Rank r_q of the Q down-projection (linear_q_down_proj).")
    qk_nope_head_dim: int = _f(448, "Leading non-rotary lanes of a head (qk_head_dim).")
    qk_rope_head_dim: int = _f(64, "Trailing rotary lanes of a head (qk_pos_emb_head_dim).")
    v_head_dim: int = _f(512, "Head width d of q, k, v and the output (head_dim); softmax scale d^-1/2.")
    qk_layernorm: bool = _f(True, "RMSNorms on the Q latent and the KV head (must be true: transformers always has them).")
    multi_latent_attention: bool = _f(True, "Must be true (the reference requires it).")
    o_groups: int = _f(8, "Groups g of the grouped output projection (linear_o_group_proj).")
    o_lora_rank: int = _f(1024, "Per-group rank r_o of the grouped output projection.")
    experimental_attention_variant: str = _f("dsv4_hybrid", "dsv4_hybrid (hybrid sliding/CSA/HCA attention) or the "
                                             "legacy mla: DeepSeek-V3's plain MLA attention in every layer.")
    kv_lora_rank: int = _f(512, "mla variant only: rank of the KV latent (the reference's MLATransformerConfig "
                                "default); dsv4_hybrid has no KV latent.")
    compress_ratios: list[int] | None = _f(None, "Per-layer compression ratio, decoder layers then MTP layers: "
                                                 "0 sliding, 4 CSA, 128 HCA (csa_compress_ratios).")
    csa_window_size: int = _f(128, "Sliding window w: raw keys a query sees, itself included (sliding_window).")
    compress_rope_theta: float = _f(160000.0, "RoPE base of compressed layers (csa_compress_rotary_base).")
    csa_dense_mode: bool = _f(False, "Ratio-4 layers skip the indexer and see every causal compressed entry.")
    apply_dsa_kernel_fusion: bool = _f(True, "Ascend fused sparse-attention kernels; CPU computes the same unfused.")
    index_n_heads: int = _f(64, "Lightning-indexer heads nI (dsa_indexer_n_heads).")
    index_head_dim: int = _f(128, "Lightning-indexer head dim dI (dsa_indexer_head_dim).")
    index_topk: int = _f(512, "Compressed entries each query keeps in CSA layers (dsa_indexer_topk).")
    dsa_indexer_loss_coeff: float = _f(1.0, "Weight of the indexer KL loss (trains only the indexer).")
    dsa_indexer_use_sparse_loss: bool = _f(True, "Accepted; no effect on the CSA indexer loss (as in the reference).")
    # --- hyper-connections (mHC) ---
    enable_hyper_connections: bool = _f(True, "Manifold-constrained hyper-connections (must be true).")
    num_residual_streams: int = _f(4, "Residual streams n (hc_mult).")
    mhc_sinkhorn_iterations: int = _f(20, "Sinkhorn iterations of the stream-mixing matrix (hc_sinkhorn_iters).")
    mhc_init_gating_factor: float = _f(0.01, "Initial value of the mHC alphas (alpha_pre/post/res).")
    hc_eps: float = _f(1e-6, "Epsilon of the Sinkhorn, pre-weight and head terms (mhc_layernorm_epsilon).")
    use_fused_mhc: bool = _f(False, "Ascend fused mHC kernels; must be false on CPU.")
    # --- MoE ---
    moe_intermediate_size: int = _f(2048, "Width F of each routed expert (moe_ffn_hidden_size).")
    moe_shared_expert_intermediate_size: int | None = _f(None, "Shared-expert width Fs; null means F × n_shared_experts.")
    n_shared_experts: int = _f(1, "Shared experts (shared_expert_num); 0 turns them off.")
    n_routed_experts: int = _f(256, "Routed experts E (num_moe_experts).")
    num_experts_per_tok: int = _f(6, "Experts per token K (moe_router_topk).")
    routed_scaling_factor: float = _f(1.5, "Multiplies the combine weights (moe_router_topk_scaling_factor).")
    norm_topk_prob: bool = _f(True, "Renormalise the top-K weights of learned-routing layers.")
    n_group: int | None = _f(0, "Expert groups for group-limited routing (moe_router_num_groups); 0: off.")
    topk_group: int | None = _f(0, "Groups kept per token (moe_router_group_topk).")
    num_hash_layers: int = _f(3, "The first N decoder layers route by a token-id table (moe_n_hash_layers).")
    moe_router_score_function: str = _f("sqrtsoftplus", "Router scores: sqrtsoftplus / sigmoid / softmax.")
    moe_router_enable_expert_bias: bool = _f(True, "Aux-loss-free balancing bias on learned-routing layers.")
    moe_router_bias_update_rate: float = _f(0.001, "Expert-bias step per global step.")
    moe_router_load_balancing_type: str = _f("seq_aux_loss", "aux_loss / seq_aux_loss / global_aux_loss (when coeff > 0).")
    moe_aux_loss_coeff: float = _f(0.0, "Auxiliary balance-loss weight (0: off); also applied on hash layers.")
    moe_router_force_expert_balance: bool = _f(False, "Debug: round-robin routing (not implemented: must be false).")
    moe_router_dtype: str = _f("float32", "Router weight and logits dtype.")
    moe_grouped_gemm: bool = _f(True, "Must be true (grouped experts).")
    activation_func_clamp_value: float | None = _f(10.0, "SwiGLU clamp L of routed and shared experts: gate <= L, "
                                                         "up in [-L, L] (swiglu_limit); null: no clamp.")
    # --- MTP ---
    num_nextn_predict_layers: int = _f(1, "MTP depth D (mtp_num_layers); 0 or 1.")
    mtp_loss_scaling_factor: float | None = _f(None, "MTP loss weight; required when MTP is on (mtp_loss_factor).")
    # --- rotary ---
    position_embedding_type: str = _f("yarn", "yarn: compressed layers use YaRN; rope: plain RoPE everywhere.")
    rotary_scaling_factor: float = _f(16.0, "YaRN factor of the compressed layers' RoPE.")
    original_max_position_embeddings: int = _f(4096, "YaRN reference length (the reference keeps 4096).")
    beta_fast: float = _f(32.0, "YaRN ramp: fast boundary.")
    beta_slow: float = _f(1.0, "YaRN ramp: slow boundary.")
    mscale: float = _f(1.0, "mla variant: YaRN mscale of its softmax scale; dsv4_hybrid applies RoPE with magnitude 1.")
    mscale_all_dim: float = _f(1.0, "mla variant: YaRN mscale_all_dim; dsv4_hybrid applies RoPE with magnitude 1.")
    hidden_dropout: float = _f(0.0, "Dropout on the embedding output and both residual branches.")
    pad_token_id: int = _f(-1, "Keys equal to this id are masked; -1 (the shipped YAMLs): none.")
    bos_token_id: int | None = _f(0, "Accepted; unused in training.")
    eos_token_id: int | None = _f(1, "Accepted; unused in training.")

    # --- derived values ---
    def head_dim(self) -> int:
        return self.v_head_dim

    def kv_channels(self) -> int:
        return self.v_head_dim

    def num_query_groups(self) -> int:
        return 1  # one KV head shared by every query head (MQA)

    def ffn_hidden_size(self) -> int:
        return self.moe_intermediate_size  # every layer is MoE

    def is_moe(self) -> bool:
        return True

    def moe_layer_pattern(self) -> list[bool]:
        return [True] * self.num_hidden_layers

    def mtp_num_layers(self) -> int:
        return self.num_nextn_predict_layers or 0

    def hash_layer_pattern(self) -> list[bool]:
        return [i < self.num_hash_layers for i in range(self.num_hidden_layers)]

    def moe_shared_expert_intermediate_size_resolved(self) -> int:
        if self.n_shared_experts <= 0:
            return 0
        if self.moe_shared_expert_intermediate_size is not None:
            return self.moe_shared_expert_intermediate_size
        return self.moe_intermediate_size * self.n_shared_experts

    def compress_ratio(self, layer_id: int) -> int:
        """Ratio of global layer ``layer_id`` (MTP layer i is ``num_hidden_layers + i``)."""
        return int((self.compress_ratios or [])[layer_id])

    def layer_type(self, layer_id: int) -> str:
        r = self.compress_ratio(layer_id)
        return SLIDING if r == 0 else CSA if r == CSA_RATIO else HCA

    def plain_mla(self) -> bool:
        """The legacy ``mla`` variant: every layer (MTP included) has DeepSeek-V3's MLA attention instead of the
        hybrid one, inside the same hyper-connection layers with the same MoE (mindformers 2.1.0
        pynative/base_models/gpt/gpt_layer_specs.py ``get_gpt_layer_local_spec``: ``mla`` → no variant →
        ``MLASelfAttention``; ``get_gpt_mtp_block_spec`` reuses the last decoder layer's spec)."""
        return self.experimental_attention_variant == "mla"

    def mla_rope_params(self) -> RopeParams:
        """The ``mla`` variant's RoPE: the one table the reference's GPTModel builds for an MLA model (yarn:
        ``YarnRotaryEmbedding`` with ``rotary_base``, ``rotary_scaling_factor``, ``max_position_embeddings`` as
        the original length, the betas and mscales; pynative/base_models/gpt/gpt_model.py), as DeepSeek-V3's."""
        return RopeParams(self.position_embedding_type, float(self.rope_theta), float(self.rotary_scaling_factor),
                          int(self.max_position_embeddings), float(self.beta_fast), float(self.beta_slow),
                          float(self.mscale), float(self.mscale_all_dim))

    def mla_softmax_scale(self) -> float:
        """The ``mla`` variant's softmax scale, DeepSeek-V3's: g(rotary_scaling_factor, mscale)² / √(nope + rope)."""
        rp = self.mla_rope_params()
        return _g(rp.factor, rp.mscale) ** 2 / math.sqrt(self.qk_nope_head_dim + self.qk_rope_head_dim)

    def rope_params(self) -> RopeParams:
        """RoPE of the compressed layers (the sliding layers use plain RoPE with ``rope_theta``)."""
        return RopeParams(self.position_embedding_type, float(self.compress_rope_theta), float(self.rotary_scaling_factor),
                          int(self.original_max_position_embeddings), float(self.beta_fast), float(self.beta_slow), 1.0, 1.0)


ALIASES = {
    "num_layers": "num_hidden_layers",
    "layernorm_epsilon": "rms_norm_eps",
    "rotary_base": "rope_theta",
    "init_method_std": "initializer_range",
    "qk_head_dim": "qk_nope_head_dim",
    "qk_pos_emb_head_dim": "qk_rope_head_dim",
    "head_dim": "v_head_dim",
    "kv_channels": "v_head_dim",
    "csa_compress_ratios": "compress_ratios",
    "sliding_window": "csa_window_size",
    "csa_compress_rotary_base": "compress_rope_theta",
    "dsa_indexer_n_heads": "index_n_heads",
    "dsa_indexer_head_dim": "index_head_dim",
    "dsa_indexer_topk": "index_topk",
    "hc_mult": "num_residual_streams",
    "hc_sinkhorn_iters": "mhc_sinkhorn_iterations",
    "mhc_layernorm_epsilon": "hc_eps",
    "swiglu_limit": "activation_func_clamp_value",
    "moe_ffn_hidden_size": "moe_intermediate_size",
    "shared_expert_num": "n_shared_experts",
    "num_moe_experts": "n_routed_experts",
    "moe_router_topk": "num_experts_per_tok",
    "moe_router_topk_scaling_factor": "routed_scaling_factor",
    "moe_router_num_groups": "n_group",
    "moe_router_group_topk": "topk_group",
    "moe_n_hash_layers": "num_hash_layers",
    "mtp_num_layers": "num_nextn_predict_layers",
    "mtp_loss_factor": "mtp_loss_scaling_factor",
}
DELETED = ("auto_map", "torch_dtype", "use_cache", "transformers_version", "scoring_func", "expert_dtype", "ep_size")


# ---------------------------------------------------------------------------------------------
# Rules (mindformers-2.1.md §5.1 validation, plus what the engine needs)
# ---------------------------------------------------------------------------------------------

def check_deepseek_v4(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    _positive(cfg, ps, ("q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "o_groups", "o_lora_rank",
                        "csa_window_size", "index_n_heads", "index_head_dim", "index_topk", "num_residual_streams",
                        "moe_intermediate_size", "n_routed_experts", "num_experts_per_tok",
                        "moe_shared_expert_intermediate_size", "hc_eps", "compress_rope_theta"))
    for key, want in (("multi_latent_attention", True), ("enable_hyper_connections", True), ("qk_layernorm", True),
                      ("moe_grouped_gemm", True), ("use_fused_mhc", False)):
        if getattr(cfg, key) is not want:
            _err(ps, key, getattr(cfg, key), f"must be {str(want).lower()} for DeepSeek-V4 in mftk",
                 f"set {key}: {str(want).lower()}")
    if cfg.plain_mla():
        _check_plain_mla(cfg, ps)
    else:
        if cfg.experimental_attention_variant != "dsv4_hybrid":
            _err(ps, "experimental_attention_variant", cfg.experimental_attention_variant,
                 "DeepSeek-V4 is built with the dsv4_hybrid attention or the legacy mla (plain MLA) attention",
                 "set experimental_attention_variant: dsv4_hybrid")
        _check_heads(cfg, ps)
    _check_sinkhorn(cfg, ps)
    _check_schedule(cfg, ps)
    _check_moe(cfg, ps)
    D = cfg.num_nextn_predict_layers
    if D < 0 or D > 1:
        _err(ps, "num_nextn_predict_layers", D, f"MTP depth must be 0 or 1, got {D}", "0 turns MTP off")
    elif D == 1 and cfg.mtp_loss_scaling_factor is None:
        _err(ps, "mtp_loss_scaling_factor", None, "required when num_nextn_predict_layers = 1",
             "set mtp_loss_scaling_factor: 0.3 (mtp_loss_factor), or num_nextn_predict_layers: 0")
    if cfg.mtp_loss_scaling_factor is not None and cfg.mtp_loss_scaling_factor < 0:
        _err(ps, "mtp_loss_scaling_factor", cfg.mtp_loss_scaling_factor, "must be >= 0", "e.g. 0.3")
    if cfg.rope_scaling is not None:
        _err(ps, "rope_scaling", cfg.rope_scaling, "not read for DeepSeek-V4 (the reference's converter ignores it too)",
             "use rotary_scaling_factor, original_max_position_embeddings, beta_fast, beta_slow")
    if cfg.position_embedding_type not in ("yarn", "rope"):
        _err(ps, "position_embedding_type", cfg.position_embedding_type, "DeepSeek-V4 uses yarn (or rope)",
             "set position_embedding_type: yarn")
    if cfg.rotary_scaling_factor <= 0:
        _err(ps, "rotary_scaling_factor", cfg.rotary_scaling_factor, "YaRN factor must be > 0", "e.g. 16")
    if cfg.activation_func_clamp_value is not None and cfg.activation_func_clamp_value <= 0:
        _err(ps, "activation_func_clamp_value", cfg.activation_func_clamp_value, "the SwiGLU clamp must be > 0",
             "e.g. 10.0, or null for no clamp")
    if cfg.dsa_indexer_loss_coeff < 0:
        _err(ps, "dsa_indexer_loss_coeff", cfg.dsa_indexer_loss_coeff, "must be >= 0", "e.g. 1.0")


MLA_UNREAD = ("compress_ratios", "csa_window_size", "o_groups", "o_lora_rank", "index_n_heads", "index_head_dim",
              "index_topk", "csa_dense_mode", "compress_rope_theta", "original_max_position_embeddings")


def _check_plain_mla(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    """The ``mla`` variant: DeepSeek-V3's attention widths (a value head at most as wide as the query head:
    mindformers 2.1.0 pynative/transformers/multi_latent_attention.py raises otherwise, and zero-pads a narrower
    one, which gives the unpadded numbers) and no hybrid-attention key is read (the reference's layer spec
    builds no compressor, indexer or grouped output projection)."""
    _positive(cfg, ps, ("kv_lora_rank",))
    nope, rope, v = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if rope > 0 and rope % 2:
        _err(ps, "qk_rope_head_dim", rope, "RoPE rotates pairs: must be even", "e.g. 64")
    if v > nope + rope:
        _err(ps, "v_head_dim", v, f"the mla attention's value head is at most the query head: qk_nope_head_dim + "
             f"qk_rope_head_dim = {nope} + {rope} = {nope + rope} (the reference raises too)",
             f"use v_head_dim <= {nope + rope}")
    _err(ps, "experimental_attention_variant", "mla", "the legacy name of plain MLA attention: every layer (MTP "
         "included) has DeepSeek-V3's MLA attention (q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, "
         "v_head_dim; YaRN from rope_theta as DeepSeek-V3) inside the hyper-connection layers, with the same MoE; "
         f"{', '.join(MLA_UNREAD)} are not read (as in the reference's layer builder)", severity=NOTE)


def _check_heads(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    nope, rope, d = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    if 0 < d <= rope:
        _err(ps, "qk_rope_head_dim", rope, f"a head is v_head_dim = {d} wide and its last qk_rope_head_dim lanes "
             f"are rotated: qk_rope_head_dim must be < {d}", f"e.g. qk_rope_head_dim: {max(2, d // 8)}")
    elif nope + rope != d and nope > 0:
        # mindformers 2.1.0 pynative/transformers/experimental_attention_variant/deepseek_v4_hybrid_attention.py:
        # "DSv4 invariant: q_head_dim collapses to v_head_dim" (its RoPE splits nope = v_head_dim − rope)
        _err(ps, "qk_nope_head_dim", nope, f"not read by the dsv4_hybrid attention: q, k and v share one head width, "
             f"v_head_dim = {d}, whose first {d - rope} lanes are not rotated (qk_nope_head_dim + qk_rope_head_dim = "
             f"{nope + rope}; the reference sets the query head to v_head_dim the same way)",
             f"qk_nope_head_dim: {d - rope} says it explicitly", severity=NOTE)
    if rope > 0 and rope % 2:
        _err(ps, "qk_rope_head_dim", rope, "RoPE rotates pairs: must be even", "e.g. 64")
    D, g = cfg.num_attention_heads * d, cfg.o_groups
    if g > 0 and D % g:
        _err(ps, "o_groups", g, f"(num_attention_heads · v_head_dim) % o_groups = {D} % {g} = {D % g}, must be 0",
             "pick o_groups dividing num_attention_heads · v_head_dim")
    if 0 < cfg.index_head_dim < rope:
        _err(ps, "index_head_dim", cfg.index_head_dim, f"the indexer rotates its last qk_rope_head_dim = {rope} lanes: "
             f"index_head_dim must be >= {rope}", f"use index_head_dim >= {rope}")


def _check_sinkhorn(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    """0 is accepted as the reference and transformers compute it: the softmax (+ε) and one column normalisation,
    then ``iters − 1`` row/column rounds — none (mindformers 2.1.0 pynative/transformers/hyper_connection.py
    ``SinkhornKnopp``; its config refuses only negatives, transformer_config.py ``mhc_sinkhorn_iterations``)."""
    it = cfg.mhc_sinkhorn_iterations
    if it < 0:
        _err(ps, "mhc_sinkhorn_iterations", it, f"must be >= 0, got {it}", "e.g. 20 (hc_sinkhorn_iters)")
    elif it == 0:
        _err(ps, "mhc_sinkhorn_iterations", it, "0: the softmax and one column normalisation, no row/column "
             "rounds after it — the same matrix as 1 (as the reference and transformers compute it)", severity=NOTE)


def _check_schedule(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    L, D, cr = cfg.num_hidden_layers, max(cfg.num_nextn_predict_layers, 0), cfg.compress_ratios
    if cfg.num_hash_layers < 0 or cfg.num_hash_layers > L:
        _err(ps, "num_hash_layers", cfg.num_hash_layers, f"must be in [0, num_hidden_layers = {L}]", f"use at most {L}")
    if cfg.plain_mla():
        return  # no compressed layers (the reference checks csa_compress_ratios for dsv4_hybrid only)
    if cr is None:
        _err(ps, "compress_ratios", None, "required: one compression ratio per decoder layer and per MTP layer",
             f"e.g. compress_ratios: {default_compress_ratios(L, D)}")
        return
    if len(cr) != L + D:
        _err(ps, "compress_ratios", cr, f"len(compress_ratios) = {len(cr)} must be num_hidden_layers + "
             f"num_nextn_predict_layers = {L} + {D} = {L + D} (the MTP entries come last)", "give one ratio per layer")
    bad = [r for r in cr if r != 0 and r != CSA_RATIO and r < 8]
    if bad:
        _err(ps, "compress_ratios", cr, f"ratios must be 0 (sliding), 4 (CSA) or >= 8 (HCA); got {bad}",
             "use the reference's 0, 4 and 128")
    elif any(r not in REFERENCE_RATIOS for r in cr):
        _err(ps, "compress_ratios", cr, "HCA ratios other than 128 are an mftk extension (the reference accepts 0, 4, 128)",
             "use 128 for configs that must also run in MindSpore Transformers", severity=NOTE)
    if cfg.apply_dsa_kernel_fusion:
        if cfg.csa_window_size != 128:
            _err(ps, "apply_dsa_kernel_fusion", True, f"the fused kernels need csa_window_size 128, got "
                 f"{cfg.csa_window_size} (the reference raises)", "set apply_dsa_kernel_fusion: false")
        else:
            _err(ps, "apply_dsa_kernel_fusion", True, "Ascend kernels; mftk computes the same sparse attention unfused",
                 severity=NOTE)


def _check_moe(cfg: DeepseekV4ModelConfig, ps: list[Problem]) -> None:
    E, K = cfg.n_routed_experts, cfg.num_experts_per_tok
    if K > E > 0:
        _err(ps, "num_experts_per_tok", K, f"top-K {K} exceeds n_routed_experts {E}", f"use at most {E}")
    fn = cfg.moe_router_score_function
    if fn not in SCORE_FUNCTIONS:
        _err(ps, "moe_router_score_function", fn, f"unknown score function {fn!r}", f"one of {', '.join(SCORE_FUNCTIONS)}")
    elif cfg.moe_router_enable_expert_bias and fn == "softmax":
        _err(ps, "moe_router_enable_expert_bias", True, "expert bias needs a sigmoid or sqrtsoftplus score function",
             "set moe_router_score_function: sqrtsoftplus, or moe_router_enable_expert_bias: false")
    G, TG = cfg.n_group or 0, cfg.topk_group or 0
    if G > 0:
        if TG <= 0 or TG > G or E % G or E // G < 2 or K % TG:
            _err(ps, "n_group", G, f"group-limited routing needs n_routed_experts % n_group = 0 (>= 2 experts per group), "
                 f"0 < topk_group <= n_group and num_experts_per_tok % topk_group = 0; got E={E}, n_group={G}, "
                 f"topk_group={TG}, K={K}", "set n_group: 0 to turn group routing off")
    if cfg.n_shared_experts < 0:
        _err(ps, "n_shared_experts", cfg.n_shared_experts, "must be >= 0", "0 turns shared experts off")
    if cfg.moe_aux_loss_coeff < 0:
        _err(ps, "moe_aux_loss_coeff", cfg.moe_aux_loss_coeff, "must be >= 0", "0 turns the aux loss off")
    elif cfg.moe_aux_loss_coeff > 0 and cfg.moe_router_load_balancing_type not in AUX_LOSS_TYPES:
        _err(ps, "moe_router_load_balancing_type", cfg.moe_router_load_balancing_type,
             f"must be one of {', '.join(AUX_LOSS_TYPES)} when moe_aux_loss_coeff > 0", "e.g. seq_aux_loss")
    if cfg.moe_router_bias_update_rate < 0:
        _err(ps, "moe_router_bias_update_rate", cfg.moe_router_bias_update_rate, "must be >= 0", "e.g. 0.0001")


def default_compress_ratios(num_layers: int, mtp: int) -> list[int]:
    """The Flash layout: two sliding layers, then CSA/HCA alternating from CSA, MTP entries sliding."""
    return [0] * min(num_layers, 2) + [4 if i % 2 == 0 else 128 for i in range(max(num_layers - 2, 0))] + [0] * mtp
