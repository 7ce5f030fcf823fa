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
        constant = np.all(t == line[:, None]) if axis == 0 else np.all(t == line[None, :])
        if not constant or not np.all(line == np.round(line)):  # not a pure selection of rows / columns
            raise CheckpointError(message=f"{hf_name}: the HF mapping does more than select rows and columns of "
                                  "its adapted weight, so its adapter has no PEFT form", hint="add --merge-lora")
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


# ------------------------------------------------------------------------------------ checkpoints (2.1 §2.7-2.8)
MANIFEST = "mindformers_adapter_config.json"
MANIFEST_FORMAT = "mindformers_pynative_lora_adapter_v1"
_FINGERPRINT_CONTENT = ("config.json", "model.safetensors.index.json", "metadata.json", "common.json")


def optional_names(params: Any, names: Any) -> tuple[set[str], str | None]:
    """Model tensors a checkpoint may lack, and why (the reference's LoRA-aware load):

    - it holds no LoRA tensor at all (a base checkpoint): the fresh adapters are kept;
    - it holds LoRA tensors only (an adapter-only save): the base comes from ``checkpoint.base_load_path``.
    """
    params, names = set(params), set(names)
    model_lora = {n for n in params if is_lora_name(n)}
    saved_lora = {n for n in names if is_lora_name(n)}
    if model_lora and not saved_lora:
        return model_lora, (f"Base checkpoint contains no LoRA tensors; retaining {len(model_lora)} freshly "
                            "initialized adapters.")
    if saved_lora and saved_lora == names:
        return params - model_lora, "adapter-only checkpoint: the base weights come from checkpoint.base_load_path"
    return set(), None


def is_adapter_only(names: Any) -> bool:
    names = set(names)
    return bool(names) and all(is_lora_name(n) for n in names)


def is_adapter_checkpoint(path: Any) -> bool:
    """Whether the mftk / MindSpore Transformers checkpoint at ``path`` holds LoRA adapters only (a
    ``save_trainable_only`` save); False for HF dirs. Reads headers and metadata.json only."""
    from mftk.ckpt.layout import locate, scan_step_dir
    from mftk.ckpt.metadata import read_metadata
    from mftk.ckpt.names import is_optimizer_name
    from mftk.ckpt.safetensors_io import read_header

    loc = locate(path)
    if loc.kind != "mf":
        return False
    files = scan_step_dir(loc.step_dir)
    if files.world > 1:
        names = [n for n in (read_metadata(loc.step_dir) or {}) if not is_optimizer_name(n)]
    else:
        names = list(read_header(files.model[0]).tensors) if files.model else []
    return is_adapter_only(names)


def fingerprint(path: str | Any) -> str | None:
    """The reference's base fingerprint: SHA-256 over a sorted walk (small JSON files by content, safetensors by
    relative path, size and mtime); None for a missing path."""
    import hashlib
    import os
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        return None
    h = hashlib.sha256()
    files = [p] if p.is_file() else sorted(f for f in p.rglob("*") if f.is_file())
    for f in files:
        rel = f.name if f == p else f.relative_to(p).as_posix()
        if f.name in _FINGERPRINT_CONTENT:
            h.update(rel.encode() + b"\0" + f.read_bytes())
        elif f.suffix == ".safetensors" or f == p:
            st = os.stat(f)
            h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()


def manifest(base_load_path: str, lora: Mapping[str, Any], *, global_step: int, consumed_samples: int,
             base_fingerprint: str | None) -> dict[str, Any]:
    import os

    return {"format": MANIFEST_FORMAT, "base_load_path": os.path.abspath(base_load_path),
            "base_fingerprint": base_fingerprint, "lora_config": dict(lora), "global_step": int(global_step),
            "consumed_samples": int(consumed_samples)}


def write_manifest(dirs: Any, content: Mapping[str, Any]) -> None:
    """The manifest, atomically, in each of ``dirs`` (the save root and the iteration dir, as the reference)."""
    import json
    import os
    from pathlib import Path

    text = json.dumps(content, indent=2) + "\n"
    for d in dirs:
        target = Path(d) / MANIFEST
        tmp = target.with_name(f".{MANIFEST}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)


def read_manifest(step_dir: Any) -> dict[str, Any] | None:
    """The manifest next to an iteration dir's tensors, or in its save root; None when there is none."""
    import json
    from pathlib import Path

    for d in (Path(step_dir), Path(step_dir).parent):
        f = d / MANIFEST
        if f.is_file():
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CheckpointError(message=f"{f}: unreadable ({exc})", path=str(f)) from None
            if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
                raise CheckpointError(message=f"{f}: not a {MANIFEST_FORMAT} manifest", path=str(f))
            return data
    return None
