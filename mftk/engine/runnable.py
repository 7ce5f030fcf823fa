"""Which parallel layouts and callbacks `mftk train` can run for a given model, checked before a run.

`check_supported_layout` raises one ConfigError listing every refusal (each at its YAML path, with the
fix); the single-process `train` and the multi-process parent call it once before any worker starts.
"""
from __future__ import annotations

from typing import Any

from mftk.errors import ConfigError, Problem


def check_supported_layout(loaded: Any, world_size: int) -> Any:
    """The layout of ``world_size`` ranks: DP, FSDP, HSDP, TP with sequence parallel (Qwen3-style GQA +
    dense MLP models), EP (MoE models, without TP), PP alone (dense models, 1F1B/GPipe, no interleave)
    and CP alone (colossal). What the trainer does not drive yet is refused: such a run would silently
    train something else than asked.
    """
    from mftk.derive import Layout, layout_from_config

    p = loaded.config.parallelism
    problems: list[Problem] = []
    problems += _model_parallel_problems(loaded)
    problems += _muon_layout_problems(loaded, world_size)
    problems += _callback_problems(loaded)
    problems += _pipeline_problems(loaded, world_size)
    problems += _context_parallel_problems(loaded, world_size)
    if problems:
        raise ConfigError(message=f"{loaded.source}: " + "; ".join(pr.message.split(" (")[0] for pr in problems),
                          problems=problems, source=loaded.source)
    if world_size <= 1:
        return Layout(world=1)
    return layout_from_config(p, world_size)


def _context_parallel_problems(loaded: Any, world_size: int) -> list[Problem]:
    """What context_parallel > 1 does not support yet: other parallel dimensions, non-GQA/MoE models."""
    from mftk.engine.parallel.context_parallel import context_parallel_problems
    from mftk.engine.spec import build_spec

    p, cfg = loaded.config.parallelism, loaded.config.model
    cp = int(p.context_parallel or 1)
    if cp <= 1:
        return []
    found = []
    if int(p.tensor_parallel or 1) > 1 or int(p.pipeline_parallel or 1) > 1 or int(p.expert_parallel or 1) > 1:
        found.append("context parallel together with tensor/pipeline/expert parallel is not supported yet")
    elif world_size > 1 and world_size != cp:
        found.append(f"context_parallel={cp} with {world_size} workers: CP combined with data parallel is not "
                     "supported yet (use as many workers as CP ranks)")
    if (p.context_parallel_method or "colossal").lower() != "colossal":
        found.append(f"context_parallel_method {p.context_parallel_method!r} is not supported yet (colossal only)")
    found += context_parallel_problems(build_spec(cfg), cp, int(cfg.seq_length or 0))
    return [Problem(path="parallelism.context_parallel", value=cp, message=f"context_parallel={cp}: {m}",
                    hint="set parallelism.context_parallel: 1", line=_line(loaded, "parallelism.context_parallel"))
            for m in found]


def _pipeline_problems(loaded: Any, world_size: int) -> list[Problem]:
    """What pipeline_parallel > 1 does not support yet: other dimensions beside it, VPP, tied/MTP/MoE models."""
    from mftk.engine.parallel.pipeline_model import pipeline_problems
    from mftk.engine.spec import build_spec

    p = loaded.config.parallelism
    pp = int(p.pipeline_parallel or 1)
    if pp <= 1:
        return []
    found = []
    if world_size > 1 and world_size != pp:
        found.append(f"pipeline_parallel={pp} with {world_size} workers: PP combined with data/tensor/context "
                     "parallel is not supported yet (use as many workers as stages)")
    if int(p.pipeline_parallel_interleave_num or 1) > 1:
        found.append("pipeline_parallel_interleave_num > 1 (interleaved 1F1B) is not supported yet")
    found += pipeline_problems(build_spec(loaded.config.model), pp)
    return [Problem(path="parallelism.pipeline_parallel", value=pp, message=f"pipeline_parallel={pp}: {m}",
                    hint="set parallelism.pipeline_parallel: 1", line=_line(loaded, "parallelism.pipeline_parallel"))
            for m in found]


def _model_parallel_problems(loaded: Any) -> list[Problem]:
    """What the model does not allow of tensor_parallel / expert_parallel (each at its YAML line)."""
    from mftk.engine.parallel.model_parallel import expert_parallel_problems, tensor_parallel_problems
    from mftk.engine.spec import build_spec

    p, cfg = loaded.config.parallelism, loaded.config.model
    tp, ep = int(p.tensor_parallel or 1), int(p.expert_parallel or 1)
    if tp <= 1 and ep <= 1:
        return []
    spec = build_spec(cfg)
    found = []
    if tp > 1:
        found += [("tensor_parallel", tp, m) for m in tensor_parallel_problems(spec, tp, int(cfg.seq_length or 0))]
    if ep > 1:
        found += [("expert_parallel", ep, m) for m in expert_parallel_problems(spec, ep, tp)]
    return [Problem(path=f"parallelism.{field}", value=v, message=f"{field}={v}: {m}", hint=f"set parallelism.{field}: 1",
                    line=_line(loaded, f"parallelism.{field}")) for field, v, m in found]


def _muon_layout_problems(loaded: Any, world_size: int) -> list[Problem]:
    """Muon needs each weight's full matrix: tensor parallel (split matrices) is not supported yet, and
    QK-clip (head rows of the masters) not together with FSDP row shards."""
    from mftk.config.optimizer_muon import qk_clip_active
    from mftk.derive import layout_from_config

    config = loaded.config
    if config.optimizer.type != "Muon" or world_size <= 1:
        return []
    p, found = config.parallelism, []
    if int(p.tensor_parallel or 1) > 1:
        found.append(("parallelism.tensor_parallel", p.tensor_parallel, "Muon with tensor_parallel > 1 is not "
                      "supported yet (the orthogonalisation needs each weight's full matrix)",
                      "set parallelism.tensor_parallel: 1, or optimizer.type: AdamW"))
    elif qk_clip_active(config) and layout_from_config(p, world_size).dp_shard > 1:
        found.append(("optimizer.qk_clip_enabled", True, "Muon's QK-clip with FSDP (data_parallel_shard > 1) is not "
                      "supported yet (it rescales head rows of the fp32 masters, which FSDP splits)",
                      "set parallelism.data_parallel_shard: 1 (plain data parallel), or qk_clip_enabled: false"))
    return [Problem(path=path, value=v, message=m, hint=h, line=_line(loaded, path)) for path, v, m, h in found]


def _line(loaded: Any, path: str) -> int | None:
    lines = getattr(loaded, "lines", None)
    try:
        return lines.line(path) if lines is not None else None
    except Exception:  # noqa: BLE001 - a line number is a courtesy
        return None


def _callback_problems(loaded: Any) -> list[Problem]:
    """``callbacks:`` entries mftk cannot run (the reference builds them from its registry), and layouts
    where the tracked max logits would be split over ranks (tensor parallel shards the heads)."""
    from mftk.engine.monitor import KNOWN_CALLBACKS, MAX_LOGITS_MONITOR, tracking_requested

    config, found = loaded.config, []
    for i, cb in enumerate(config.callbacks or ()):
        path = f"callbacks[{i}]"
        if cb.type not in KNOWN_CALLBACKS:
            found.append(Problem(path=f"{path}.type", value=cb.type, line=_line(loaded, f"{path}.type"),
                                 message=f"unknown callback {cb.type!r}", hint=f"use one of: {', '.join(KNOWN_CALLBACKS)}"))
        elif cb.type == MAX_LOGITS_MONITOR and int(cb.step_interval) < 1:
            found.append(Problem(path=f"{path}.step_interval", value=cb.step_interval,
                                 line=_line(loaded, f"{path}.step_interval"),
                                 message="step_interval must be at least 1", hint="set step_interval: 1 (every step)"))
    if sum(getattr(cb, "type", None) == MAX_LOGITS_MONITOR for cb in config.callbacks or ()) > 1:
        found.append(Problem(path="callbacks", message="more than one MaxLogitsMonitor: each resets the running max",
                             hint="keep one entry with the step_interval you want"))
    tp = int(config.parallelism.tensor_parallel or 1)
    if tracking_requested(config) and tp > 1:
        found.append(Problem(path="model.track_max_attention_logit", value=True,
                             line=_line(loaded, "model.track_max_attention_logit"),
                             message=f"max attention logit tracking with tensor_parallel={tp} is not supported yet "
                             "(the heads, so max_logits_val, are split over ranks)",
                             hint="set parallelism.tensor_parallel: 1 or turn tracking off"))
    return found
