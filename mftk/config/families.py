"""The one table of model families: ``model_type`` → config class, spec builder, Hugging Face mapping, and the
family's facts (attention kind, MLA, Hugging Face model type, q/k norm, parallel gaps).

Every user of families reads this table: the config loader (which class types a ``model:`` section),
the engine (which builder makes its `ModelSpec`), checkpoints (which module maps its names to and
from Hugging Face). A new family is one row here plus its config class, its spec builder and its
mapping module. The builder and the mapping are named by module path and imported when first used,
so this table (and all of ``mftk.config``) stays free of MindSpore and of the engine.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

import attrs

from mftk.config.model_deepseek_v3 import DeepseekV3ModelConfig
from mftk.config.model_deepseek_v4 import DeepseekV4ModelConfig
from mftk.config.model_qwen3 import Qwen3ModelConfig
from mftk.config.model_qwen3_moe import Qwen3MoeModelConfig


@attrs.frozen
class Family:
    """One model family and its facts, which every other module reads from here (one owner per fact).

    ``spec`` is ``"module:function"`` (model config → ModelSpec); ``hf`` a module with ``hf_to_mf(tensors, cfg)``
    / ``mf_to_hf(tensors, cfg)`` (numpy only). ``attention``: the attention kind — ``gqa`` (grouped-query with
    q/k norm), ``mla`` (multi-latent, DeepSeek-V3) or ``csa`` (DeepSeek-V4's compressed sparse attention);
    `config.runnable` picks the tensor / context parallel plan by it. ``hf_model_type``: transformers'
    ``model_type`` of an exported config. ``qk_norm``: q and k are RMS-normalised per head after the projection
    (so QK-clip's rescaling of the projection cannot lower a logit). ``parallel_gaps``: parallel dimensions
    besides TP and CP (``ep``, ``pp``) this family's plan does not cover yet, with why (`runnable` refuses them).
    """

    name: str
    model_types: tuple[str, ...]
    config_class: type
    architectures: tuple[str, ...]
    spec: str
    hf: str
    attention: str
    hf_model_type: str
    qk_norm: bool
    parallel_gaps: dict[str, str] = attrs.field(factory=dict)

    @property
    def mla(self) -> bool:
        """Multi-latent attention: what Muon's QK-clip rescales (the reference runs Muon on MLA models only)."""
        return self.attention == "mla"

    def spec_builder(self) -> Callable[[Any], Any]:
        module, _, function = self.spec.partition(":")
        return getattr(importlib.import_module(module), function)

    def hf_mapping(self) -> Any:
        return importlib.import_module(self.hf)

    def hf_to_mf(self, tensors: Any, cfg: Any) -> dict:
        return self.hf_mapping().hf_to_mf(tensors, cfg)

    def mf_to_hf(self, tensors: Any, cfg: Any) -> dict:
        return self.hf_mapping().mf_to_hf(tensors, cfg)


FAMILIES: tuple[Family, ...] = (
    Family("qwen3", ("qwen3",), Qwen3ModelConfig, ("Qwen3ForCausalLM",),
           spec="mftk.engine.models.qwen3.spec:qwen3_spec", hf="mftk.ckpt.hf.qwen3",
           attention="gqa", hf_model_type="qwen3", qk_norm=True),
    Family("deepseek_v3", ("deepseek_v3", "deepseek_mtp"), DeepseekV3ModelConfig, ("DeepseekV3ForCausalLM",),
           spec="mftk.engine.models.deepseek_v3.spec:deepseek_v3_spec", hf="mftk.ckpt.hf.deepseek_v3",
           attention="mla", hf_model_type="deepseek_v3", qk_norm=False),  # deepseek_mtp is not an HF type
    Family("deepseek_v4", ("deepseek_v4",), DeepseekV4ModelConfig, ("DeepseekV4ForCausalLM",),
           spec="mftk.engine.models.deepseek_v4.spec:deepseek_v4_spec", hf="mftk.ckpt.hf.deepseek_v4",
           attention="csa", hf_model_type="deepseek_v4", qk_norm=False),
    Family("qwen3_moe", ("qwen3_moe",), Qwen3MoeModelConfig, ("Qwen3MoeForCausalLM",),
           spec="mftk.engine.models.qwen3_moe.spec:qwen3_moe_spec", hf="mftk.ckpt.hf.qwen3_moe",
           attention="gqa", hf_model_type="qwen3_moe", qk_norm=True),
)

MODEL_TYPES: dict[str, Family] = {mt: f for f in FAMILIES for mt in f.model_types}
ARCHITECTURES: dict[str, Family] = {a: f for f in FAMILIES for a in f.architectures}


def family_of(model_cfg: Any) -> Family:
    """The family of a typed ``model:`` section (by ``model_type``, else its first ``architectures`` entry)."""
    from mftk.errors import ConfigError, Problem

    mt = getattr(model_cfg, "model_type", None)
    arch = getattr(model_cfg, "architectures", None)
    if isinstance(arch, (list, tuple)):
        arch = arch[0] if arch else None
    family = MODEL_TYPES.get(mt) or ARCHITECTURES.get(arch or "")
    if family is None:
        known = ", ".join(f"{f.name} ({', '.join(f.architectures)})" for f in FAMILIES)
        raise ConfigError(message=f"unknown model family model_type={mt!r}, architectures={arch!r}",
                          problems=[Problem(path="model.model_type", message="no family with this model_type",
                                            value=mt, hint=f"use one of: {known}")])
    return family
