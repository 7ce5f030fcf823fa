"""The `model:` section of Qwen3 (dense GQA with q/k norm): its typed fields and the values the reference derives.

Its rules are in `mftk.config.model` (`_check_qwen3`); its row of facts in `mftk.config.families`.
"""
import attrs

from mftk.config.model_base import RopeParams, TransformerFields, _f

@attrs.frozen(kw_only=True)
class Qwen3ModelConfig(TransformerFields):
    """Qwen3 (dense GQA + qk-norm). Defaults: `Qwen3Config`'s signature plus what MindSpore Transformers injects."""

    model_type: str = _f("qwen3", "Selects the config class: qwen3.")
    architectures: str = _f("Qwen3ForCausalLM", "Selects the model class (a string, not a list).")
    vocab_size: int = _f(151936, "Vocabulary size V.")
    hidden_size: int = _f(4096, "Hidden size H.")
    intermediate_size: int = _f(22016, "Dense MLP width F (ffn_hidden_size).")
    num_hidden_layers: int = _f(32, "Number of decoder layers L (num_layers).")
    num_attention_heads: int = _f(32, "Query heads nh.")
    num_key_value_heads: int | None = _f(32, "KV heads ng for GQA (num_query_groups); null means nh.")
    head_dim: int | None = _f(128, "Head dim hd (kv_channels); nh·hd may differ from H; null means H // nh.")
    max_position_embeddings: int = _f(32768, "Only used by learned position embeddings (unused here).")
    hidden_dropout: float = _f(0.1, "Dropout on the embedding output and both residual branches (Qwen3 default 0.1!).")
    pad_token_id: int = _f(151643, "Keys equal to this id are masked; default loss_mask drops it.")
    bos_token_id: int | None = _f(None, "Accepted; unused in training.")
    eos_token_id: int | None = _f(None, "Accepted; unused in training.")

    # --- derived values (reference __post_init__) ---
    def ffn_hidden_size(self) -> int:
        return self.intermediate_size

    def kv_channels(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // max(self.num_attention_heads, 1)

    def num_query_groups(self) -> int:
        return self.num_key_value_heads if self.num_key_value_heads is not None else self.num_attention_heads

    def qk_layernorm(self) -> bool:
        return True  # the pynative Qwen3 model always builds q/k norms

    def is_moe(self) -> bool:
        return False

    def moe_layer_pattern(self) -> list[bool]:
        return [False] * self.num_hidden_layers

    def mtp_num_layers(self) -> int:
        return 0

    def rope_params(self) -> RopeParams:
        return RopeParams(self.position_embedding_type, float(self.rope_theta), 1.0, self.max_position_embeddings,
                          32.0, 1.0, 1.0, 1.0)
