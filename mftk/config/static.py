"""Recognising MindSpore Transformers static-graph (GRAPH_MODE) YAMLs (2.1 §7).

A `configs/deepseek3/`-style static config nests the model under ``model.model_config``, keeps
the parallel degrees in ``parallel_config`` and the batch size in ``runner_config``, and sets
``context.mode: 0``. The PyNative trainer loads such a file without error and ignores most of it
(top-level leftovers are silently dropped, 2.1 §1.1); mftk says what it is in one line and points
at `mftk convert-config`. The key tables here are shared by that converter and by the loader,
which names the PyNative home of a stray static key in an otherwise PyNative YAML.
"""
from __future__ import annotations

from typing import Any

# Top-level static-graph keys: their PyNative setting, or why there is none (2.1 §7.1-§7.8).
STATIC_TOP_LEVEL: dict[str, str] = {
    "seed": "training.seed",
    "output_dir": "checkpoint.save_path (<output_dir>/checkpoint); logs go to `mftk train --output-dir`",
    "load_checkpoint": "checkpoint.load_path",
    "load_ckpt_format": "none: PyNative checkpoints are always safetensors",
    "src_strategy_path_or_dir": "none: resharding is online, from metadata.json",
    "auto_trans_ckpt": "none: resharding is online, from metadata.json",
    "only_save_strategy": "none: PyNative writes no strategy files",
    "resume_training": "checkpoint.no_load_optim (its negation)",
    "use_parallel": "none: derived from the world size",
    "train_precision_sync": "training.deterministic",
    "use_legacy": "none: PyNative has only the mcore models",
    "print_separate_loss": "none: aux, MTP and indexer losses are always logged",
    "micro_batch_interleave_num": "none: folded into training.global_batch_size",
    "profile": "profiler.enable_profiling",
    "profile_start_step": "profiler.start_step",
    "profile_stop_step": "profiler.end_step",
    "profile_memory": "profiler.profile_memory",
    "init_start_profile": "none: no PyNative profiler key",
    "profile_communication": "none: no PyNative profiler key",
    "layer_scale": "none: no layer-wise learning rate in PyNative",
    "layer_decay": "none: no layer-wise learning rate in PyNative",
    "lr_scale_factor": "none: no layer-wise learning rate in PyNative",
    "trainer": "none: the PyNative trainer is chosen by model.architectures",
    "runner_config": "training.local_batch_size / global_batch_size / steps",
    "runner_wrapper": "training.max_norm (gradient clipping); no loss scaling in PyNative",
    "lr_schedule": "lr_scheduler",
    "train_dataset_task": "none: an alias of train_dataset",
    "eval_dataset_task": "none: no evaluation in PyNative pretraining",
    "parallel_config": "parallelism",
    "parallel": "parallelism (pipeline interleave and schedule); FSDP is always on in PyNative",
    "recompute_config": "recompute",
    "moe_config": "model (MoE keys live in the model section)",
}

# What marks a whole file as static-graph: (description, test on the raw YAML data).
_MARKERS: tuple[tuple[str, Any], ...] = (
    ("model.model_config", lambda d: isinstance(d.get("model"), dict) and isinstance(d["model"].get("model_config"), dict)),
    ("parallel_config", lambda d: "parallel_config" in d),
    ("runner_config", lambda d: "runner_config" in d),
    ("runner_wrapper", lambda d: "runner_wrapper" in d),
    ("context.mode: 0", lambda d: isinstance(d.get("context"), dict) and d["context"].get("mode") == 0),
    ("lr_schedule", lambda d: "lr_schedule" in d),
    ("train_dataset.data_loader", lambda d: isinstance(d.get("train_dataset"), dict) and "data_loader" in d["train_dataset"]),
    ("train_dataset_task", lambda d: "train_dataset_task" in d),
)


def static_markers(data: Any) -> list[str]:
    """The static-graph features found in raw YAML data (empty for a PyNative config)."""
    if not isinstance(data, dict):
        return []
    return [name for name, test in _MARKERS if test(data)]


def is_static_config(data: Any) -> bool:
    """A nested ``model.model_config`` alone is decisive; otherwise two independent markers are needed,
    so one stray static key in a PyNative YAML gets a per-key warning, not this verdict."""
    found = static_markers(data)
    return "model.model_config" in found or len(found) >= 2


def static_config_message(source: str, markers: list[str]) -> str:
    """The one line validate-config (and train) answer a static-graph config with."""
    stem = source[:-5] if source.endswith(".yaml") else source[:-4] if source.endswith(".yml") else source
    shown = ", ".join(markers[:4]) + (", …" if len(markers) > 4 else "")
    return (f"{source} is a static-graph (GRAPH_MODE) config ({shown}); mftk reads PyNative configs: "
            f"convert it with `mftk convert-config {source} -o {stem}_pynative.yaml`")
