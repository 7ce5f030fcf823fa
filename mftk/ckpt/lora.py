"""LoRA tensors of a checkpoint, numpy only: split from the base, merged into it, or mapped to Hugging Face PEFT.

Names are the reference's (2.1 §3): a dense adapter is ``<layer>.lora_a [r, in]`` / ``<layer>.lora_b
[out, r]`` next to ``<layer>.weight [out, in]``; the experts' are ``<experts>.weight1_lora_a [E, H, r]``,
``weight1_lora_b [E, r, 2F]``, ``weight2_lora_a [E, F, r]``, ``weight2_lora_b [E, r, H]`` next to
``weight1 [E, H, 2F]`` / ``weight2 [E, F, H]``. ``s = lora_alpha / lora_rank``.

Merging: ``W + s·B·A`` (dense), ``W + s·A·B`` per expert (stored ``[in, out]``) — what the adapted
forward computes, so the merged model's logits are the adapted model's.

PEFT: an mftk layer may be several HF modules (``linear_qkv`` → ``q_proj``/``k_proj``/``v_proj``, the
interleaved ``linear_fc1`` → ``gate_proj``/``up_proj``). The family's weight mapping (`mftk.ckpt.hf`) only
selects and reorders rows and columns, so it is run once on row indices and once on column indices of
every adapted weight: each HF module's ``lora_B`` is B's rows at the indices its weight took, its
``lora_A`` A's columns at the indices its weight took. ``q_proj = B_q·A`` etc. is then exactly the
slice of the fused update.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mftk.ckpt.names import is_lora_name
from mftk.errors import CheckpointError

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
_EXPERT = ("weight1", "weight2")


def split_lora(tensors: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(base tensors, adapter tensors)."""
    base = {n: v for n, v in tensors.items() if not is_lora_name(n)}
    return base, {n: v for n, v in tensors.items() if is_lora_name(n)}


def _dense_layers(adapters: Mapping[str, np.ndarray]) -> list[str]:
    return sorted(n[: -len(".lora_a")] for n in adapters if n.endswith(".lora_a"))


def _expert_weights(adapters: Mapping[str, np.ndarray]) -> list[str]:
    return sorted(n[: -len("_lora_a")] for n in adapters if n.endswith("_lora_a") and n.rsplit(".", 1)[-1]
                  .startswith(_EXPERT))


def _pair(adapters: Mapping[str, np.ndarray], a: str, b: str) -> tuple[np.ndarray, np.ndarray]:
    if b not in adapters:
        raise CheckpointError(message=f"LoRA tensor {a} has no partner {b}", problems=[f"missing tensor: {b}"],
                              hint="the checkpoint's adapters are incomplete")
    return np.asarray(adapters[a], np.float64), np.asarray(adapters[b], np.float64)


def merge_lora(tensors: Mapping[str, np.ndarray], scaling: float) -> dict[str, np.ndarray]:
    """Base tensors with every adapter folded in (float64 arithmetic, stored in the base's dtype)."""
    base, adapters = split_lora(tensors)
    out = dict(base)
    for layer in _dense_layers(adapters):
        a, b = _pair(adapters, f"{layer}.lora_a", f"{layer}.lora_b")
        w = _base_of(base, f"{layer}.weight")
        out[f"{layer}.weight"] = (w + scaling * (b @ a)).astype(w.dtype)
    for weight in _expert_weights(adapters):
        a, b = _pair(adapters, f"{weight}_lora_a", f"{weight}_lora_b")
        w = _base_of(base, weight)
        out[weight] = (w + scaling * np.einsum("ehr,erf->ehf", a, b)).astype(w.dtype)
    return out


def _base_of(base: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    if name not in base:
        raise CheckpointError(message=f"the adapter of {name} has no base weight in the checkpoint",
                              problems=[f"missing tensor: {name}"],
                              hint="an adapter-only checkpoint needs its base: export it from a full checkpoint")
    return np.asarray(base[name])


# ------------------------------------------------------------------------------------ PEFT
def peft_adapter(base: Mapping[str, np.ndarray], adapters: Mapping[str, np.ndarray], mf_to_hf: Any,
                 cfg: Any) -> tuple[dict[str, np.ndarray], list[str]]:
    """(PEFT ``adapter_model.safetensors`` tensors, the HF module paths they adapt)."""
    if _expert_weights(adapters):
        raise CheckpointError(message="PEFT has no layout for adapters on grouped routed experts",
                              problems=[f"expert adapter: {w}_lora_a" for w in _expert_weights(adapters)][:5],
                              hint="export merged weights instead: add --merge-lora")
    layers = _dense_layers(adapters)
    rows = _provenance(base, layers, mf_to_hf, cfg, axis=0)
    cols = _provenance(base, layers, mf_to_hf, cfg, axis=1)
    out: dict[str, np.ndarray] = {}
    modules = []
    for hf_name, (layer, row_idx) in sorted(rows.items()):
        col_layer, col_idx = cols[hf_name]
        assert col_layer == layer
        a, b = _pair(adapters, f"{layer}.lora_a", f"{layer}.lora_b")
        module = hf_name[: -len(".weight")]
        out[f"base_model.model.{module}.lora_A.weight"] = a[:, col_idx].astype(np.float32)
        out[f"base_model.model.{module}.lora_B.weight"] = b[row_idx, :].astype(np.float32)
        modules.append(module)
    return out, modules


def _provenance(base: Mapping[str, np.ndarray], layers: list[str], mf_to_hf: Any, cfg: Any, *,
                axis: int) -> dict[str, tuple[str, np.ndarray]]:
    """For every HF weight that comes from an adapted mftk weight: (that layer, the row (axis 0) or column
    (axis 1) indices of the mftk weight it holds, in its order)."""
    marked = {n: np.full(np.shape(v), -1.0, np.float64) for n, v in base.items()}
    offsets, start = {}, 0
    for layer in layers:
        w = marked[f"{layer}.weight"]
        n = w.shape[axis]
        idx = np.arange(start, start + n, dtype=np.float64)
        marked[f"{layer}.weight"] = np.broadcast_to(idx[:, None] if axis == 0 else idx[None, :], w.shape).copy()
        offsets[layer] = (start, start + n)
        start += n
    if start >= 2 ** 24:
        raise CheckpointError(message="too many adapted rows to map to PEFT in one pass",
                              hint="export merged weights instead: add --merge-lora")
    found: dict[str, tuple[str, np.ndarray]] = {}
    for hf_name, t in mf_to_hf(marked, cfg).items():
        t = np.asarray(t, np.float64)
        if t.size == 0 or t.max() < 0:
            continue
        if t.ndim != 2 or not hf_name.endswith(".weight") or t.min() < 0:
            raise CheckpointError(message=f"{hf_name}: an adapted weight maps to a tensor PEFT cannot adapt",
                                  hint="export merged weights instead: add --merge-lora")
        line = t[:, 0] if axis == 0 else t[0, :]
        layer = next(k for k, (lo, hi) in offsets.items() if lo <= line[0] < hi)
        lo, hi = offsets[layer]
        if line.min() < lo or line.max() >= hi:
            raise CheckpointError(message=f"{hf_name} mixes several adapted weights", hint="add --merge-lora")
        found[hf_name] = (layer, (line - lo).astype(np.int64))
    return found


def peft_config(modules: list[str], lora: Mapping[str, Any], base_model: str) -> dict[str, Any]:
    """``adapter_config.json`` for HF ``peft`` (LoRA on exactly these module paths, scaling alpha/r)."""
    return {
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
        "r": int(lora["lora_rank"]), "lora_alpha": lora["lora_alpha"], "lora_dropout": float(lora["lora_dropout"]),
        "target_modules": sorted(modules), "bias": "none", "fan_in_fan_out": False, "inference_mode": True,
        "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
    }
