"""Specs: small recipes describing which parts make a layer, and a registry of family builders.

A family (Qwen3, DeepSeek-V3, …) is a function ``model_cfg → ModelSpec``; ``GPTModel`` only composes
what the spec names (torchtitan/Megatron ModuleSpec idea). A new family is a new builder registered
by ``model_type`` and ``architectures``, not a new model file.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs

from mftk.errors import ConfigError, Problem


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
    tp: Any = None  # parallel.groups.AxisGroup when tensor parallel (with SP) is on; see parallel.model_parallel
    hc_head: ModuleSpec | None = None  # multi-stream residual: expands the embedding, collapses before the final norm
    indexer_loss_coeff: float = 0.0  # weight of the layers' ``core_attention.indexer_loss`` (DeepSeek-V4)


_BUILDERS: dict[str, Callable[[Any], ModelSpec]] = {}
_ARCHITECTURES: dict[str, str] = {}


def register(model_type: str, architectures: tuple[str, ...] = ()):
    """Decorator: register a ``model_cfg → ModelSpec`` builder under ``model_type`` and architecture names."""

    def wrap(fn: Callable[[Any], ModelSpec]) -> Callable[[Any], ModelSpec]:
        _BUILDERS[model_type] = fn
        for arch in architectures:
            _ARCHITECTURES[arch] = model_type
        return fn

    return wrap


def registered() -> dict[str, tuple[str, ...]]:
    """model_type → architectures, for error messages and docs."""
    return {mt: tuple(a for a, m in _ARCHITECTURES.items() if m == mt) for mt in _BUILDERS}


def build_spec(model_cfg: Any) -> ModelSpec:
    """Pick the builder by ``model_type`` (then ``architectures``) and run it."""
    import importlib

    from mftk.engine.models import FAMILY_SPEC_MODULES

    for module in FAMILY_SPEC_MODULES:  # importing a family registers its builder
        importlib.import_module(module)

    mt = getattr(model_cfg, "model_type", None)
    arch = getattr(model_cfg, "architectures", None)
    if isinstance(arch, (list, tuple)):
        arch = arch[0] if arch else None
    key = mt if mt in _BUILDERS else _ARCHITECTURES.get(arch or "")
    if key is None:
        known = ", ".join(f"{m} ({', '.join(a)})" for m, a in registered().items())
        raise ConfigError(
            message=f"unknown model family model_type={mt!r}, architectures={arch!r}",
            problems=[Problem(path="model.model_type", message="no engine builder for this model", value=mt,
                              hint=f"use one of: {known}")],
        )
    return _BUILDERS[key](model_cfg)
