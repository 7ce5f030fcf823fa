"""What `validate-config` shows about a valid config: per-section rows of (label, value, why).

Derived from the one config model with the layout arithmetic of `mftk.derive` and the parameter and
FLOP counts of `plan.flops`, so the numbers are the ones the planner and the trainer use.
"""
from __future__ import annotations

from typing import Any

import attrs

from mftk import derive as L
from mftk import units
from mftk.config.load import LoadedConfig
from mftk.files import home_relative
from mftk.config.sections import Config
from mftk.plan.flops import flops_per_step, param_counts
from mftk.units import count_exact


@attrs.frozen
class Summary:
    """Ordered sections of (label, value, explanation) rows."""

    sections: dict[str, list[tuple[str, str, str]]]

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: {label: {"value": value, "why": why} for label, value, why in rows}
                for name, rows in self.sections.items()}


def summarize(loaded: LoadedConfig, world_size: int = 1) -> Summary:
    c = loaded.config
    return Summary(sections={
        "model": _model_rows(c),
        "data": _data_rows(c),
        "parallel": _parallel_rows(c, world_size),
        "optimizer": _optimizer_rows(c),
        "checkpoint": _checkpoint_rows(c),
    })


def _model_rows(c: Config) -> list[tuple[str, str, str]]:
    m = c.model
    total, active = param_counts(m)
    rows = [("family", f"{m.model_type} ({m.architectures})", ""),
            ("layers × hidden", f"{m.num_hidden_layers} × {m.hidden_size}", ""),
            ("vocabulary", f"{m.vocab_size:,}", ""),
            ("sequence length", str(m.seq_length), ""),
            ("parameters", count_exact(total), "embedding, attention, MLP/MoE, norms, output layer")]
    if active != total:
        rows.append(("active parameters", count_exact(active), "per token: top-k + shared experts"))
    flops = flops_per_step(m, seq_length=m.seq_length, global_batch_size=c.training.global_batch_size)
    rows.append(("FLOPs per step", f"{units.flops(flops)} ({flops:.4g})",
                 "Megatron convention (fwd+bwd), used by the log's throughput"))
    return rows


def _data_rows(c: Config) -> list[tuple[str, str, str]]:
    loader = c.train_dataset.dataloader
    d = c.dataset
    rows = [("loader", str(loader.type), "")]
    if d is None:
        return rows
    blend = d.data_path or d.train_data_path or []
    sources = blend_sources(blend)
    for weight, prefix in sources:
        rows.append(("source", prefix, f"weight {weight:.3f} (normalised)"))
    if d.mock and not sources:
        rows.append(("source", "random tokens", "mock: true"))
    if loader.sizes:
        rows.append(("train samples", f"{loader.sizes[0]:,}", f"{loader.sizes[0] // c.training.global_batch_size} "
                     f"steps of global_batch_size {c.training.global_batch_size}"))
    rows.append(("seq_length / eod / pad", f"{d.seq_length} / {d.eod} / {d.pad}", ""))
    return rows


def blend_sources(blend: list) -> list[tuple[float, str]]:
    """[(normalised weight, prefix)] of a valid data_path (plain prefixes share equally)."""
    if not blend:
        return []
    parsed = L.parse_data_path(blend)
    weights = parsed.weights or tuple(1.0 for _ in parsed.prefixes)
    total = sum(weights)
    return [(w / total, p) for w, p in zip(weights, parsed.prefixes)]


def _parallel_rows(c: Config, world: int) -> list[tuple[str, str, str]]:
    p, t = c.parallelism, c.training
    dp, dp_text = L.derive_dp(world, p.tensor_parallel, p.pipeline_parallel, p.context_parallel)
    rep, shard, split_text = L.split_dp(dp, p.data_parallel_shard)
    layout = L.layout_from_config(p, world)
    accum, accum_text = L.accumulation_steps(t.global_batch_size, t.local_batch_size, dp)
    return [("world size", str(world), ""),
            ("layout", layout.describe(), ""),
            ("data parallel", str(dp), dp_text),
            ("dp_replicate × dp_shard", f"{rep} × {shard}", split_text),
            ("accumulation steps", str(accum), accum_text),
            ("micro-batch", str(t.local_batch_size), "samples per micro-batch per DP rank")]


def _optimizer_rows(c: Config) -> list[tuple[str, str, str]]:
    o, s, t = c.optimizer, c.lr_scheduler, c.training
    warm = s.warmup_steps if s.warmup_steps is not None else int(t.steps * (s.warmup_ratio or 0))
    clip = f"{t.max_norm}" if t.max_norm > 0 else "off"
    if o.type == "Muon":
        from mftk.config.optimizer_muon import ns_schedule

        try:
            steps = f"{len(ns_schedule(o.ns_coefficients, o.ns_steps))} Newton-Schulz steps"
        except ValueError:
            steps = "invalid ns_coefficients"
        opt = (f"Muon momentum={o.momentum}{' nesterov' if o.nesterov else ''} {steps} rms={o.matched_adamw_rms} "
               f"weight_decay={o.weight_decay}; AdamW fallback betas={o.adamw_betas} eps={o.adamw_eps}",
               "2-D/3-D weights orthogonalised; embeddings, output layer, 1-D parameters by AdamW")
    else:
        opt = (f"{o.type} betas={o.betas} eps={o.eps} weight_decay={o.weight_decay}",
               "1-D parameters and biases get no weight decay")
    return [("optimizer", *opt),
            ("schedule", f"{s.type} lr={s.learning_rate} warmup={warm} steps", f"total_steps = training.steps = {t.steps}"),
            ("gradient clipping", clip, "global norm"),
            ("steps", str(t.steps), "absolute target step")]


def _checkpoint_rows(c: Config) -> list[tuple[str, str, str]]:
    ck = c.checkpoint
    if not ck.enable_save:
        rows = [("save", "off", "enable_save: false")]
    else:
        rows = [("save", home_relative(ck.save_path), f"every {units.every_steps(ck.save_interleaved_steps)} and at the end; "
                 f"keep {ck.save_max}"),
                ("optimizer state", "no" if ck.no_save_optim else "yes", "")]
    if ck.load_path:
        rows.append(("load", home_relative(ck.load_path), "weights only" if ck.no_load_optim else "weights + optimizer + step"))
    return rows
