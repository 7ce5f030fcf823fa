"""Pieces every `model:` family class shares: field helper, severities, the `TransformerConfig` fields,
rope parameters and the two small problem helpers (kept apart so each family module can import them
without importing the family registry in `model.py`)."""
import math
from typing import Any

import attrs

from mftk.errors import Problem

NOTE = "note"  # a rewrite that changes nothing the model computes (alias, deleted key, coercion)
WARNING = "warning"
ERROR = "error"

DTYPES = ("float32", "fp32", "float16", "fp16", "bfloat16", "bf16")
HIDDEN_ACTS = ("silu", "fusedswiglu", "gelu")
SCORE_FUNCTIONS = ("softmax", "sigmoid", "sqrtsoftplus")
AUX_LOSS_TYPES = ("aux_loss", "seq_aux_loss", "global_aux_loss")


def _f(default: Any, help: str) -> Any:
    """A field with its one-line meaning kept in metadata (one place for default and docs)."""
    return attrs.field(default=default, metadata={"help": help})


def _g(s: float, m: float) -> float:
    """YaRN magnitude term g(s, m) = 0.1·m·ln s + 1 (1 when s ≤ 1), models.md §2.4."""
    return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0


@attrs.frozen
class RopeParams:
    """Rotary settings after `rope_scaling` has been expanded (models.md §1.7)."""

    position_embedding_type: str
    rotary_base: float
    factor: float
    original_max_position_embeddings: int
    beta_fast: float
    beta_slow: float
    mscale: float
    mscale_all_dim: float

    @property
    def rotary_mscale(self) -> float:
        """YaRN angle multiplier g(factor, mscale)/g(factor, mscale_all_dim) (1.0 for plain RoPE)."""
        if self.position_embedding_type != "yarn":
            return 1.0
        return _g(self.factor, self.mscale) / _g(self.factor, self.mscale_all_dim)


@attrs.frozen(kw_only=True)
class TransformerFields:
    """`TransformerConfig` fields that both families share, with the same effective default."""

    seq_length: int = _f(4096, "Training sequence length S: causal-mask size and FLOPs; must equal the dataset's.")
    compute_dtype: str = _f("bfloat16", "Matmul/activation dtype and default storage dtype of Linear/experts.")
    params_dtype: str = _f("float32", "Storage dtype where passed (Qwen3 linear_qkv / linear_proj only).")
    embedding_params_dtype: str = _f("float32", "Word-embedding table storage dtype.")
    layernorm_compute_dtype: str = _f("float32", "RMSNorm weight dtype (norm math is fp32).")
    rotary_dtype: str = _f("float32", "Dtype of the RoPE math.")
    hidden_act: str = _f("silu", "MLP activation: silu / fusedswiglu (same SwiGLU math) / gelu (exact erf GELU).")
    initializer_range: float = _f(0.02, "Std of the normal init (the reference hard-codes 0.01; mftk honours this).")
    rms_norm_eps: float = _f(1e-6, "Epsilon of every RMSNorm.")
    rope_theta: float = _f(10000.0, "RoPE base θ.")
    rope_scaling: dict | None = _f(None, "HF rope_scaling dict (type/factor/original_max_position_embeddings/...).")
    attention_bias: bool = _f(False, "Bias on the QKV (MLA: down/up) projections.")
    attention_dropout: float = _f(0.0, "Accepted; no effect (the attention kernel has no dropout).")
    normalization: str = _f("RMSNorm", "Final norm type (layer norms are RMSNorm).")
    fused_norm: bool = _f(True, "Must stay true (non-fused norms are rejected by the reference).")
    add_bias_linear: bool = _f(False, "Biases on every Linear layer (must be false with MoE).")
    gated_linear_unit: bool = _f(True, "Gated MLP act(gate)·up (fc1 twice as wide); false: fc2(act(fc1(x))).")
    apply_residual_connection_post_layernorm: bool = _f(False, "Take residuals after the norm instead of before.")
    position_embedding_type: str = _f("rope", "rope / yarn (MLA only) / none; rope_scaling.type overrides it.")
    rotary_interleaved: bool = _f(False, "GPT-J style interleaved rotary pairs.")
    apply_rope_fusion: bool = _f(False, "Ascend fused RoPE kernel; same math, no effect on CPU.")
    tie_word_embeddings: bool = _f(False, "Share the embedding table with the LM head.")
    ignore_token_id: int = _f(-100, "Labels equal to this are left out of the loss.")
    is_dynamic: bool = _f(False, "Slice the causal mask for variable sequence lengths.")
    use_flash_attention: bool = _f(True, "Accepted; the fused attention path is used either way.")
    use_attn_mask_compression: bool = _f(False, "Compressed causal mask (Ascend FA sparse mode 2).")
    use_eod_attn_mask_compression: bool = _f(False, "EOD-packed TND attention with actual_seq_len.")
    track_max_attention_logit: bool = _f(False, "Keep per-head max attention logits (QK-clip / Muon).")
    calculate_per_token_loss: bool = _f(False, "Return (sum, count) instead of the mean; unsupported by the trainer.")
    chunk_loss_num: int = _f(0, "Compute the cross-entropy in this many sequence chunks (same value).")


def _err(ps: list[Problem], key: str, value: Any, message: str, hint: str = "", severity: str = ERROR) -> None:
    ps.append(Problem(path=f"model.{key}", value=value, message=message, hint=hint, severity=severity))


def _positive(cfg: Any, ps: list[Problem], names: tuple[str, ...]) -> None:
    for n in names:
        v = getattr(cfg, n, None)  # a field the family does not have is skipped
        if v is not None and v <= 0:
            _err(ps, n, v, f"must be > 0, got {v}", "set a positive size")
