"""Specs: small recipes describing which parts make a layer, and a registry of family builders.

A family (Qwen3, DeepSeek-V3, …) is a function ``model_cfg → ModelSpec``; ``GPTModel`` only composes
what the spec names (torchtitan/Megatron ModuleSpec idea). A new family is a new builder named in the
family table (`mftk.config.families`), not a new model file.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs


@attrs.frozen
class ModuleSpec:
    """A class plus constructor keywords; ``build(**more)`` instantiates it."""

    module: Callable[..., Any]
    params: dict[str, Any] = attrs.field(factory=dict)

    def build(self, **more: Any) -> Any:
        return self.module(**self.params, **more)


@attrs.frozen
class LayerSpec:
    """One transformer layer: pre-norm attention then pre-norm MLP (dense or MoE).

    ``layer``: the layer class (None: `gpt.TransformerLayer`, one residual stream); ``hyper``: the
    hyper-connection of each sub-block for a multi-stream layer (DeepSeek-V4's mHC)."""

    attention: ModuleSpec
    mlp: ModuleSpec
    norm: ModuleSpec
    is_moe: bool = False
    layer: Callable[..., Any] | None = None
    hyper: ModuleSpec | None = None


@attrs.frozen
class ModelSpec:
    vocab_size: int
    hidden_size: int
    layers: tuple[LayerSpec, ...]
    final_norm: ModuleSpec
    rope: Callable[[], Any]  # () -> RotaryTable
    tie_word_embeddings: bool = False
    mtp_layers: tuple[LayerSpec, ...] = ()
    mtp_loss_scaling_factor: float = 0.0
    aux_loss_coeff: float = 0.0
    bias_update_rate: float = 0.0
    init_std: float = 0.02
    pad_token_id: int = 0
    hidden_dropout: float = 0.0
    hc_head: ModuleSpec | None = None  # multi-stream residual: expands the embedding, collapses before the final norm
    indexer_loss_coeff: float = 0.0  # weight of the layers' ``core_attention.indexer_loss`` (DeepSeek-V4)


def mlp_params(model_cfg: Any, *, gated_only: bool = False) -> dict[str, Any]:
    """The MLP keywords every family reads from its config the same way: ``hidden_act`` and (for dense MLPs;
    ``gated_only`` for MoE layers, whose routed experts are gated) ``gated_linear_unit``."""
    params: dict[str, Any] = {"activation": model_cfg.hidden_act}
    if not gated_only:
        params["gated_linear_unit"] = model_cfg.gated_linear_unit
    return params


def build_spec(model_cfg: Any) -> ModelSpec:
    """The family's `ModelSpec` for a typed ``model:`` section (builder from `mftk.config.families`)."""
    from mftk.config.families import family_of

    return family_of(model_cfg).spec_builder()(model_cfg)
