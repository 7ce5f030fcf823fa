"""Value and cross-field rules: every problem at once, each with its YAML path and the arithmetic.

Rules run on a structured (type-correct) config. Each `_check_*` function looks at one area and
appends `Problem`s; none stops at the first. Errors here are things the reference either rejects
too, or silently gets wrong (floors a batch division, trains on random data); notes explain
where mftk's meaning differs.
"""
from __future__ import annotations

import re
from pathlib import Path, PurePath
from typing import Any

import attrs

from mftk import derive as L
from mftk.config.sections import DEVICE_TARGETS, RUN_MODES, Config
from mftk.derive import DeriveError, parse_layer_range
from mftk.errors import Problem

LR_TYPES = {"ConstantWarmUpLR", "LinearWithWarmUpLR", "CosineWithWarmUpLR", "WarmUpStableDecayLR",
            "ConstantWithCoolDownLR", "PolynomialWithWarmUpLR"}
LR_NEED_WARMUP = {"ConstantWarmUpLR", "LinearWithWarmUpLR", "ConstantWithCoolDownLR", "WarmUpStableDecayLR"}
LOADER_TYPES = {"BlendedMegatronDatasetDataLoader", "MindDataset"}
# loaders only the reference runs, and why mftk does not (the message says it)
LOADER_TYPES_REFERENCE_ONLY = {
    "HFDataLoader": "it loads with Hugging Face `datasets` and tokenizes on the fly through handlers",
    "OrderedIndexDataLoader": "it reads the reference's ordered-index sample files",
}
BALANCE_LOADERS = {"BlendedMegatronDatasetDataLoader", "HFDataLoader", "OrderedIndexDataLoader"}
INFERENCE_SUFFIXES = (".jsonl", ".json", ".txt", "")


class _Rules:
    def __init__(self, reported: frozenset[str] = frozenset()) -> None:
        self.problems: list[Problem] = []
        self.reported = reported  # paths an earlier stage (the value's form) already has an error at

    def error(self, path: str, message: str, value: Any = None, hint: str = "") -> None:
        if path in self.reported:  # one error per path: the earlier stage's says what to fix first
            return
        self.problems.append(Problem(path=path, message=message, value=value, hint=hint))

    def warn(self, path: str, message: str, value: Any = None, hint: str = "") -> None:
        self.problems.append(Problem(path=path, message=message, value=value, hint=hint, severity="warning"))

    def note(self, path: str, message: str, value: Any = None, hint: str = "") -> None:
        self.problems.append(Problem(path=path, message=message, value=value, hint=hint, severity="note"))


def check(config: Config, *, world_size: int = 1, check_files: bool = True,
          reported: frozenset[str] = frozenset()) -> list[Problem]:
    """All value and cross-field problems of a structured config (errors, warnings, notes); ``reported``:
    paths that already have an error from reading the YAML (no second error there)."""
    r = _Rules(reported)
    _check_training(config, r)
    layout = _check_parallel(config, world_size, r)
    _check_layout(config, layout, r)
    _check_model_vs_data(config, r)
    _check_callbacks(config, r)
    _check_checkpoint(config, world_size, r)
    _check_optimizer(config, r)
    _check_lr(config, r)
    _check_dataset(config, r, check_files=check_files)
    _check_balance(config, layout, r)
    _check_recompute_swap(config, world_size, r)
    _check_profiler_monitor(config, r)
    _check_lora(config, r)
    _check_run_mode(config, r)
    _note_device_traffic(config, r)
    _check_device(config, r)
    _check_mftk(config, world_size, r)
    if config.model is not None:
        from mftk.config.model import model_problems
        from mftk.config.support import unsupported_model_settings

        grammar = model_problems(config.model)
        refused = {p.path for p in grammar if p.severity == "error"}
        r.problems += grammar
        # what the engine implements is asked only of values the reference itself accepts: one error per path
        r.problems += [p for p in unsupported_model_settings(config.model) if p.path not in refused]
    from mftk.config.status import check_statuses

    # the status table speaks last, where no rule spoke: one problem per path (the rule's says more)
    reported = reported | frozenset(p.path for p in r.problems)
    r.problems += check_statuses(config, world_size=world_size, reported=reported)
    return r.problems


# ------------------------------------------------------------------ training and parallel layout

def _check_training(c: Config, r: _Rules) -> None:
    t = c.training
    for name in ("local_batch_size", "global_batch_size"):
        value = getattr(t, name)
        if value <= 0:
            r.error(f"training.{name}", f"must be positive, got {value}", value, "use a whole number ≥ 1")
    if t.steps <= 0:
        r.error("training.steps", f"must be positive, got {t.steps}", t.steps, "the absolute target step, e.g. 1000")
    if t.max_norm <= 0:
        r.note("training.max_norm", f"max_norm={t.max_norm} disables gradient clipping in mftk",
               t.max_norm, "the reference has no > 0 check and would scale gradients by a non-positive factor")
    if t.rampup_batch_size is not None:
        _check_rampup(c, r)
    n = t.max_consecutive_skipped_steps
    if n < 0:
        r.error("training.max_consecutive_skipped_steps", f"training.max_consecutive_skipped_steps in config must be "
                f">= 0, got {n}.", n, "0 means no limit; N stops the run when N steps in a row were skipped")
    elif n > 0 and not t.use_skip_step_on_nan:
        r.note("training.max_consecutive_skipped_steps", "has no effect without use_skip_step_on_nan: a non-finite "
               "step stops mftk at once (MindSpore Transformers applies it and continues)", n)


def _check_mftk(c: Config, world: int, r: _Rules) -> None:
    h = c.mftk.hang_timeout_s
    if h is not None and not h > 0:
        r.error("mftk.hang_timeout_s", f"must be a positive number of seconds, got {h}", h,
                "e.g. 600, or null for the default derived from the measured step time")
    elif h is not None and world == 1:
        r.note("mftk.hang_timeout_s", "has no effect in a one-process run: only a multi-process job's parent "
               "watches for hung ranks", h)


def _check_rampup(c: Config, r: _Rules) -> None:
    ramp = c.training.rampup_batch_size or []
    path = "training.rampup_batch_size"
    if len(ramp) != 3:
        r.error(path, f"needs exactly 3 values [start_gbs, increment, rampup_samples], got {len(ramp)}", ramp)
        return
    start, inc, samples = ramp
    if start <= 0 or inc <= 0 or samples < 0:
        r.error(path, f"need start > 0, increment > 0, rampup_samples ≥ 0; got {ramp}", ramp)
        return
    top = c.training.global_batch_size
    if top < start:
        r.error(path, f"global_batch_size {top} < start {start}", ramp, "the ramp must go up to global_batch_size")
    elif (top - start) % inc:
        r.error(path, f"(global_batch_size − start) % increment = ({top} − {start}) % {inc} = {(top - start) % inc}, must be 0",
                ramp)


DEGREES = ("tensor_parallel", "pipeline_parallel", "context_parallel", "expert_parallel",
           "pipeline_parallel_interleave_num")


def degree_problems(p: Any) -> list[Problem]:
    """Parallel degrees that are not positive (data_parallel_shard: -1 or ≥ 1): the one rule, used by every
    command that reads a layout (`plan-parallel` checks it before it searches, with or without --check)."""
    r = _Rules()
    for name in DEGREES:
        value = getattr(p, name)
        if value < 1:
            r.error(f"parallelism.{name}", f"must be ≥ 1, got {value}", value, "a degree counts devices: 1 or more")
    if p.data_parallel_shard == 0 or p.data_parallel_shard < -1:
        r.error("parallelism.data_parallel_shard", f"must be -1 (all of DP) or ≥ 1, got {p.data_parallel_shard}",
                p.data_parallel_shard)
    return r.problems


def _check_parallel(c: Config, world: int, r: _Rules) -> L.Layout | None:
    p = c.parallelism
    degrees = degree_problems(p)
    r.problems += degrees
    bad = bool(degrees)
    _check_choices(r, "parallelism.pipeline_parallel_schedule", p.pipeline_parallel_schedule.lower() or "1f1b",
                   {"1f1b", "interleaved_1f1b", "gpipe"})
    if p.pipeline_parallel_schedule.lower() == "interleaved_1f1b" and p.pipeline_parallel_interleave_num <= 1:
        r.error("parallelism.pipeline_parallel_schedule", "interleaved_1f1b needs pipeline_parallel_interleave_num > 1",
                hint="set pipeline_parallel_interleave_num or use 1f1b")
    _check_choices(r, "parallelism.context_parallel_method", p.context_parallel_method.lower(),
                   {"colossal", "ulysses", "hybrid"})
    _check_choices(r, "parallelism.context_parallel_mask_type", p.context_parallel_mask_type, {"causal"})
    _check_choices(r, "parallelism.reshard_after_forward_policy", p.reshard_after_forward_policy,
                   {"always", "never", "default"})
    _check_choices(r, "parallelism.moe_token_dispatcher_type", p.moe_token_dispatcher_type,
                   {"alltoall", "alltoall_deredundancy"})
    if p.moe_token_dispatcher_type == "alltoall_deredundancy" and p.expert_parallel < p.npu_nums_per_device:
        r.error("parallelism.moe_token_dispatcher_type",
                f"alltoall_deredundancy needs expert_parallel ≥ npu_nums_per_device ({p.expert_parallel} < {p.npu_nums_per_device})")
    _check_ulysses(p, r)
    if p.enable_loss_parallel and p.tensor_parallel <= 1:
        r.warn("parallelism.enable_loss_parallel", "has no effect without tensor_parallel > 1")
    if bad:
        return None
    dp, dp_text = L.derive_dp(world, p.tensor_parallel, p.pipeline_parallel, p.context_parallel)
    if dp < 1:
        r.error("parallelism", f"tp·pp·cp must be ≤ world size: {dp_text}", world,
                "lower the degrees or pass a larger --world-size")
        return None
    layout = L.layout_from_config(p, world)  # the one builder of a Layout from a parallelism: section
    if p.data_parallel_shard > 0 and dp % p.data_parallel_shard:
        r.error("parallelism.data_parallel_shard",
                f"must divide dp: {dp} % {p.data_parallel_shard} = {dp % p.data_parallel_shard}",
                p.data_parallel_shard,
                f"the reference silently adjusts it to {layout.dp_replicate}×{layout.dp_shard}; pick a divisor of {dp}")
    return layout


def _check_ulysses(p, r: _Rules) -> None:
    method, u, cp = p.context_parallel_method.lower(), p.ulysses_degree_in_cp, p.context_parallel
    if method == "ulysses" and u is not None and u != cp:
        r.error("parallelism.ulysses_degree_in_cp", f"ulysses needs ulysses_degree_in_cp = cp ({u} ≠ {cp}) or null", u)
    if method == "hybrid" and (u is None or not 1 < u < cp or cp % u):
        r.error("parallelism.ulysses_degree_in_cp", f"hybrid needs 1 < u < cp and cp % u == 0 (u={u}, cp={cp})", u)
    if p.context_parallel_async and method == "colossal":
        r.error("parallelism.context_parallel_async", "async CP is only for ulysses / hybrid", True)


def _check_layout(c: Config, layout: L.Layout | None, r: _Rules) -> None:
    """The one check of whether the layout is valid and runnable for the model (`config.runnable`), which
    plan-parallel's search applies to its candidates too."""
    if layout is None:
        return
    from mftk.config.runnable import layout_refusals, settings_of
    from mftk.config.sections import tracking_requested

    by_path: dict[str, list] = {}
    for ref in layout_refusals(c.model, layout, settings_of(c, track_max_logits=tracking_requested(c))):
        by_path.setdefault(ref.path, []).append(ref)
    for path, refs in by_path.items():  # one error per path, with every reason the layout fails there
        hints = list(dict.fromkeys(ref.hint for ref in refs if ref.hint))
        r.error(path, "; ".join(ref.message for ref in refs), _value_at(c, path), "; ".join(hints))


def _value_at(c: Config, path: str) -> Any:
    """The config's value at a dotted YAML path (for the problem's ``value``); None where there is none."""
    node: Any = c
    for part in re.split(r"\.|\[(\d+)\]", path):
        if part is None or part == "":
            continue
        try:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None
    return None if attrs.has(type(node)) else node


def _check_model_vs_data(c: Config, r: _Rules) -> None:
    seq = getattr(c.model, "seq_length", None) if c.model is not None else None
    data = c.dataset
    # a non-positive seq_length is _check_data_config's error (one error per path)
    if seq and data is not None and data.seq_length is not None and 0 < data.seq_length != seq:
        r.error("train_dataset.dataloader.config.seq_length",
                f"{data.seq_length} ≠ model.seq_length {seq}", data.seq_length, "make both equal")


def _check_callbacks(c: Config, r: _Rules) -> None:
    """``callbacks:`` entries mftk cannot run (the reference builds them from its registry)."""
    from mftk.config.sections import KNOWN_CALLBACKS, MAX_LOGITS_MONITOR

    for i, cb in enumerate(c.callbacks or ()):
        path = f"callbacks[{i}]"
        if cb.type not in KNOWN_CALLBACKS:
            r.error(f"{path}.type", f"unknown callback {cb.type!r}", cb.type, f"use one of: {', '.join(KNOWN_CALLBACKS)}")
        elif cb.type == MAX_LOGITS_MONITOR and int(cb.step_interval) < 1:
            r.error(f"{path}.step_interval", "step_interval must be at least 1", cb.step_interval,
                    "set step_interval: 1 (every step)")
    if sum(getattr(cb, "type", None) == MAX_LOGITS_MONITOR for cb in c.callbacks or ()) > 1:
        r.error("callbacks", "more than one MaxLogitsMonitor: each resets the running max",
                hint="keep one entry with the step_interval you want")


def _check_choices(r: _Rules, path: str, value: str, choices: set[str]) -> None:
    if value not in choices:
        r.error(path, f"{value!r} is not one of {', '.join(sorted(choices))}", value)


# ------------------------------------------------------------------ checkpoint, optimizer, schedule

def _check_checkpoint(c: Config, world: int, r: _Rules) -> None:
    ck = c.checkpoint
    if ck.async_save and world > 1:
        r.note("checkpoint.async_save", "no effect with more than one process: every rank writes its files "
               "synchronously between the save's barriers (async_save applies to one-process runs)", True)
    if ck.enable_save and not ck.save_path:
        r.error("checkpoint.save_path", "required when checkpoint.enable_save is true", "",
                "set save_path, e.g. ./output/checkpoint, or enable_save: false")
    if ck.save_interleaved_steps <= 0:
        r.error("checkpoint.save_interleaved_steps", f"must be ≥ 1, got {ck.save_interleaved_steps}",
                ck.save_interleaved_steps)
    if ck.save_max < 1:
        r.error("checkpoint.save_max", f"must be ≥ 1, got {ck.save_max}", ck.save_max)
    if ck.save_trainable_only and not ck.base_load_path.strip():
        r.error("checkpoint.base_load_path", "checkpoint.base_load_path is required when save_trainable_only is True.",
                ck.base_load_path)
    if ck.save_trainable_only and c.lora_config is None:
        r.error("checkpoint.save_trainable_only", "save_trainable_only=True but no LoRA parameters exist in the "
                "model.", True, "add a lora_config section, or set save_trainable_only: false")
    if ck.base_load_path.strip() and c.lora_config is None:
        r.error("checkpoint.base_load_path", "names the frozen base of a LoRA run, but there is no lora_config",
                ck.base_load_path, "add a lora_config section; to fine-tune every weight from a checkpoint, set "
                "checkpoint.load_path with no_load_optim: true")


def _check_optimizer(c: Config, r: _Rules) -> None:
    o = c.optimizer
    _check_choices(r, "optimizer.type", o.type, {"AdamW", "Muon"})
    from mftk.config.optimizer_muon import adamw_only_problems, muon_problems

    r.problems += muon_problems(c) if o.type == "Muon" else adamw_only_problems(c)
    if len(o.betas) != 2 or not all(0 <= b < 1 for b in o.betas):
        r.error("optimizer.betas", f"needs two values in [0, 1), got {o.betas}", o.betas)
    if o.eps < 0:
        r.error("optimizer.eps", f"must be ≥ 0, got {o.eps}", o.eps)
    if o.weight_decay < 0:
        r.error("optimizer.weight_decay", f"must be ≥ 0, got {o.weight_decay}", o.weight_decay)
    if o.enable_cpu_offload:
        r.error("optimizer.enable_cpu_offload", "CPU offload of the optimizer is not supported", True)


def _check_lr(c: Config, r: _Rules) -> None:
    s, total = c.lr_scheduler, c.training.steps
    if s.type is None:
        r.error("lr_scheduler.type", "required key is missing", hint=f"one of: {', '.join(sorted(LR_TYPES))}")
        return
    if s.type not in LR_TYPES:
        r.error("lr_scheduler.type", f"unknown schedule {s.type!r}", s.type, f"one of: {', '.join(sorted(LR_TYPES))}")
        return
    if s.learning_rate < 0:
        r.error("lr_scheduler.learning_rate", f"must be ≥ 0, got {s.learning_rate}", s.learning_rate)
    for name in ("warmup", "decay", "decay_start"):
        steps, ratio = getattr(s, f"{name}_steps"), getattr(s, f"{name}_ratio")
        if steps is not None and steps < 0:
            r.error(f"lr_scheduler.{name}_steps", f"must be ≥ 0, got {steps}", steps)
        if ratio is not None and not 0 <= ratio <= 1:
            r.error(f"lr_scheduler.{name}_ratio", f"must be in [0, 1], got {ratio}", ratio)
    if s.type in LR_NEED_WARMUP and s.warmup_steps is None and s.warmup_ratio is None:
        r.error("lr_scheduler.warmup_steps", f"{s.type} needs warmup_steps or warmup_ratio", None, "e.g. warmup_steps: 0")
    if s.warmup_ratio is not None and s.warmup_steps is None and 0 <= s.warmup_ratio <= 1:
        r.note("lr_scheduler.warmup_ratio",
               f"warmup steps = int(training.steps·warmup_ratio) = int({total}·{s.warmup_ratio}) = {int(total * s.warmup_ratio)}")
    if s.type == "WarmUpStableDecayLR":
        end = 1e-7 if s.lr_end is None else s.lr_end
        if end >= s.learning_rate:
            r.error("lr_scheduler.lr_end", f"must be < learning_rate ({end} ≥ {s.learning_rate})", end)
    if s.total_steps is not None and s.total_steps != total:
        r.warn("lr_scheduler.total_steps", f"ignored: total_steps is always training.steps ({total})", s.total_steps)
    _check_schedule_fits(s, total, r)


def _check_schedule_fits(s: Any, total: int, r: _Rules) -> None:
    """A warm-up or decay longer than the run: the LR never reaches its peak (or its end value). A warning, not
    an error: MindSpore Transformers 2.1.0 accepts it (mindformers/core/lr/lr_schedule.py computes the curve for
    any warmup_steps), and a short trial run of a long schedule is a fair thing to want."""
    if total <= 0 or any(v is not None and v < 0 for v in (s.warmup_steps, s.decay_steps, s.decay_start_steps)):
        return
    if s.warmup_steps is not None and s.warmup_steps >= total:
        r.warn("lr_scheduler.warmup_steps", f"the warm-up ({s.warmup_steps} steps) does not complete within "
               f"training.steps ({total}): the LR never reaches learning_rate {s.learning_rate:g}", s.warmup_steps,
               f"lower warmup_steps below {total} or raise training.steps")
        return
    warm = s.warmup_steps if s.warmup_steps is not None else int(total * (s.warmup_ratio or 0))
    if s.type == "ConstantWithCoolDownLR" and s.decay_steps is not None \
            and warm + s.keep_steps + s.decay_steps > total:
        r.warn("lr_scheduler.decay_steps", f"the cool-down ends at step {warm + s.keep_steps + s.decay_steps} "
               f"(warm-up {warm} + keep_steps {s.keep_steps} + decay_steps {s.decay_steps}), after training.steps "
               f"({total}): the LR never reaches lr_end1", s.decay_steps, "shorten the schedule or raise training.steps")
    elif s.type == "PolynomialWithWarmUpLR" and s.decay_steps is not None and warm + s.decay_steps > total:
        r.warn("lr_scheduler.decay_steps", f"the decay ends at step {warm + s.decay_steps} (warm-up {warm} + "
               f"decay_steps {s.decay_steps}), after training.steps ({total}): the LR never reaches lr_end",
               s.decay_steps, "shorten the schedule or raise training.steps")
    elif s.type == "WarmUpStableDecayLR" and s.decay_start_steps is not None and s.decay_start_steps >= total:
        r.warn("lr_scheduler.decay_start_steps", f"the decay starts at step {s.decay_start_steps}, not before "
               f"training.steps ({total}): the LR never decays", s.decay_start_steps,
               "lower decay_start_steps or raise training.steps")


# ------------------------------------------------------------------ data

def _check_dataset(c: Config, r: _Rules, *, check_files: bool) -> None:
    loader = c.train_dataset.dataloader
    base = "train_dataset.dataloader"
    if loader is None:
        r.error(base, "the dataloader section is missing",
                hint="add train_dataset.dataloader with type: BlendedMegatronDatasetDataLoader")
        return
    if loader.type is None:
        r.error(f"{base}.type", "required key is missing", hint="BlendedMegatronDatasetDataLoader")
        return
    if loader.type in LOADER_TYPES_REFERENCE_ONLY:
        r.error(f"{base}.type", f"{loader.type} is not supported by mftk yet: "
                f"{LOADER_TYPES_REFERENCE_ONLY[loader.type]}, while mftk trains from pre-tokenized Megatron .bin/.idx",
                loader.type, "tokenize the data with `mftk preprocess` and use BlendedMegatronDatasetDataLoader")
        return
    if loader.type not in LOADER_TYPES:
        r.error(f"{base}.type", f"unknown dataloader type {loader.type!r}", loader.type,
                f"one of: {', '.join(sorted(LOADER_TYPES))}")
        return
    if loader.type == "MindDataset":
        d = loader.config
        if d is not None and d.seq_length is not None and d.seq_length <= 0:
            r.error(f"{base}.config.seq_length", f"must be a positive integer, got {d.seq_length}", d.seq_length)
        if d is not None and not d.add_extra_token_to_sequence:
            r.error(f"{base}.config.add_extra_token_to_sequence", "must be true for MindDataset (samples hold "
                    "seq_length + 1 tokens; labels are the inputs shifted by one)", False)
        if not loader.dataset_files and not loader.dataset_dir:
            r.error(f"{base}.dataset_files", "MindDataset needs dataset_files (MindRecord files or directories)",
                    hint="e.g. dataset_files: [data/wiki_text.mindrecord]")
        elif check_files:
            for i, f in enumerate(loader.dataset_files or []):
                _check_mindrecord_entry(f, f"{base}.dataset_files[{i}]", r)
        return
    if loader.datasets_type != "GPTDataset":
        r.error(f"{base}.datasets_type", f"must be 'GPTDataset', got {loader.datasets_type!r}", loader.datasets_type)
    if not loader.sizes:
        r.error(f"{base}.sizes", "required: [train_samples, 0, 0]", hint="e.g. sizes: [1000, 0, 0]")
    elif any(s < 0 for s in loader.sizes) or loader.sizes[0] <= 0:
        r.error(f"{base}.sizes", f"needs a positive train count and no negative counts, got {loader.sizes}", loader.sizes)
    elif loader.sizes[0] < c.training.global_batch_size:
        r.error(f"{base}.sizes", f"sizes[0] = {loader.sizes[0]} < global_batch_size {c.training.global_batch_size}: "
                "no full step", loader.sizes)
    if loader.shuffle:
        r.warn(f"{base}.shuffle", "loader-level shuffle makes sample order depend on the loader's own RNG",
               hint="keep false: GPTDataset already shuffles reproducibly")
    data = loader.config
    if data is None:
        r.error(f"{base}.config", "the GPTDataset config block is missing", hint="add seq_length, split, eod, data_path ...")
        return
    _check_data_config(c, data, f"{base}.config", r, check_files)


def _check_data_config(c: Config, d, base: str, r: _Rules, check_files: bool) -> None:
    if d.seq_length is None or d.seq_length <= 0:
        r.error(f"{base}.seq_length", "required: a positive integer equal to model.seq_length", d.seq_length)
    if d.create_compressed_eod_mask is None:
        r.note(f"{base}.create_compressed_eod_mask", "not set; false is used",
               hint="the reference requires this key: add create_compressed_eod_mask: false")
    paths = {"data_path": d.data_path, "train_data_path": d.train_data_path}
    if d.data_path and d.train_data_path:
        r.error(f"{base}.train_data_path", "cannot be combined with data_path", d.train_data_path,
                "use data_path + split, or train_data_path alone")
        paths["train_data_path"] = None  # its own form is not checked too: one error at the path
    if d.mock and any(paths.values()):
        r.error(f"{base}.mock", "is true but data_path is also set", True,
                "remove mock: true to train on the data, or remove data_path")
        return
    if not any(paths.values()):
        if d.mock:
            r.warn(f"{base}.mock", "training on random tokens (mock: true)")
        else:
            r.error(f"{base}.data_path", "no data: data_path is missing",
                    hint="set data_path to your preprocessed prefixes (mftk preprocess); "
                    "mock: true trains on random data on purpose")
        return
    if d.data_path and d.split is None:
        r.error(f"{base}.split", "required when data_path is set", hint='e.g. split: "1, 0, 0"')
    elif d.split is not None:
        _check_split(d.split, f"{base}.split", r)
    for key, blend in paths.items():
        if blend:
            for prefix in _check_blend(blend, f"{base}.{key}", r):
                if check_files:
                    _check_prefix_files(prefix, f"{base}.{key}", r)
    if d.create_seq_len_vector:
        r.error(f"{base}.create_seq_len_vector", "the per-sample sequence-length vector is not implemented by mftk",
                True, "set create_seq_len_vector: false (use create_compressed_eod_mask for packed documents)")
    if d.create_attention_mask and "attention_mask" not in c.model_columns:
        r.note(f"{base}.create_attention_mask", "true, but attention_mask is not in column_names; it is not passed "
               "to the model", hint="set create_attention_mask: false to save memory")


def _check_mindrecord_entry(entry: str, path: str, r: _Rules) -> None:
    p = Path(entry)
    if not p.exists():
        r.error(path, f"file not found: {entry}", entry)
    elif p.is_dir():
        if not any(q.is_file() and ".mindrecord" in q.name and not q.name.endswith(".db") for q in p.rglob("*")):
            r.error(path, f"no .mindrecord file under directory {entry}", entry,
                    "write one with: mftk preprocess --format mindrecord --seq-length N ...")
        else:
            r.note(path, f"directory {entry}: its *.mindrecord files are read in sorted path order (MindSpore "
                   "Transformers walks it in os.walk order, which is not sorted)", entry)


def _check_balance(c: Config, layout: L.Layout | None, r: _Rules) -> None:
    """``train_dataset.balance_enabled`` (2.1 §1.6): the reference's loader and data-mode rules; dp = 1 is its
    exact bypass; dp > 1 redistributes each step's micro-batches (`mftk.data.balance`)."""
    path, loader = "train_dataset.balance_enabled", c.train_dataset.dataloader
    if not c.train_dataset.balance_enabled or loader is None or loader.type is None:
        return
    if loader.type not in BALANCE_LOADERS:
        r.error(path, f"balance_enabled is True but dataloader type {loader.type!r} is not supported (only "
                f"{', '.join(sorted(BALANCE_LOADERS))})", True, "set balance_enabled: false")
        return
    data = loader.config
    if data is None or not data.create_compressed_eod_mask or data.create_seq_len_vector:
        r.error(path, "Data balancing requires the effective compressed-EOD mode.", True,
                "set train_dataset.dataloader.config.create_compressed_eod_mask: true (and create_seq_len_vector: false)")
        return
    if layout is None:
        return
    if layout.dp > 1:
        if c.training.rampup_batch_size:
            r.error(path, "balancing with training.rampup_batch_size is not implemented by mftk (the step's "
                    "micro-batch count changes during the ramp)", True,
                    "set balance_enabled: false, or remove rampup_batch_size")
        else:
            r.note(path, f"each step's micro-batches are redistributed over the {layout.dp} data-parallel ranks "
                   "to even out attention work (Σ document length²); the step's gradient is unchanged", True)
    else:
        r.note(path, "no effect at data parallel 1: each step reads the original micro-batches (the reference's "
               "exact bypass)", True)


def _check_split(split: str, path: str, r: _Rules) -> None:
    try:
        L.parse_split(split)
    except DeriveError as e:
        r.error(path, e.message, split, e.hint)


def _check_blend(blend: list[str], path: str, r: _Rules) -> list[str]:
    """Weight/prefix pairs or a plain prefix list (`derive.parse_data_path`, as the loader reads it); the prefixes."""
    try:
        return list(L.parse_data_path(blend).prefixes)
    except DeriveError as e:
        where = path if e.index is None else f"{path}[{e.index}]"
        r.error(where, e.message, blend if e.index is None else blend[e.index], e.hint)
        return []


def _check_prefix_files(prefix: str, path: str, r: _Rules) -> None:
    missing = [ext for ext in (".bin", ".idx") if not Path(prefix + ext).is_file()]
    if missing:
        r.error(path, f"data files missing for prefix {prefix!r}: {', '.join(prefix + e for e in missing)}", prefix,
                "create them with mftk preprocess (a relative prefix is read from the working directory, then next "
                "to the YAML); `mftk validate-config --no-check-files` checks the rest of the config without them")


def _check_device(c: Config, r: _Rules) -> None:
    """``context.device_target``: one of `DEVICE_TARGETS` or null (whether it is there: at run time, engine.device)."""
    d = c.context.device_target
    if d is not None and str(d).lower() not in {x.lower() for x in DEVICE_TARGETS}:
        r.error("context.device_target", f"must be one of {', '.join(DEVICE_TARGETS)} (or null: the device MindSpore "
                "finds)", d, "e.g. context.device_target: CPU, or --device CPU")


# ------------------------------------------------------------------ recompute, swap, profiler, monitor

def _check_recompute_swap(c: Config, world: int, r: _Rules) -> None:
    rc, sw, m = c.recompute, c.swap, c.model
    layers = getattr(m, "num_hidden_layers", 0) or 0
    mtp = getattr(m, "num_nextn_predict_layers", 0) or 0
    _check_choices(r, "recompute.mode", rc.mode, {"None", "full", "select"})
    if rc.mode == "full":
        if not rc.full_recompute_layer:
            r.error("recompute.full_recompute_layer", "required when recompute.mode is 'full'", hint="e.g. ['0-3']")
        else:
            _check_ascending_layers(rc.full_recompute_layer, layers + mtp, "recompute.full_recompute_layer", r)
    if rc.mode == "select" and not isinstance(rc.select_module, dict):
        r.error("recompute.select_module", "required when recompute.mode is 'select': a mapping of module glob → layer ranges")
    _check_exclude_op(rc, layers + mtp, world, r)
    if c.recompute_comm.enable and not c.recompute_comm.select_module:
        r.error("recompute_comm.select_module", "required when recompute_comm.enable is true")
    replays = rc.mode != "None" or c.recompute_comm.enable
    if replays and world == 1:
        r.note("recompute.mode" if rc.mode != "None" else "recompute_comm.enable", "no effect on one process: "
               "recompute replays layers only with several processes, as the reference does (same gradients)")
    if replays and world > 1 and getattr(m, "hidden_dropout", 0.0):
        r.error("recompute.mode", "recompute replays forwards in the backward, so model.hidden_dropout must be 0 "
                "(the dropout masks would differ)", rc.mode, "set model.hidden_dropout: 0.0 or recompute.mode: None")
    if replays and world > 1 and c.lora_config is not None and c.lora_config.lora_dropout:
        r.error("recompute.mode", "recompute replays forwards in the backward, so lora_config.lora_dropout must be "
                "0 (the dropout masks would differ)", rc.mode,
                "set lora_config.lora_dropout: 0.0 or recompute.mode: None")
    if not sw.enable:
        return
    r.error("swap.enable", "swapping activations to host memory is not built in mftk: on CPU they already live in "
            "host memory, and no accelerator path for it exists", True, "set swap.enable: false")
    if c.parallelism.pipeline_parallel > 1:
        r.error("swap.enable", "swap is not supported with pipeline parallel", True)
    if layers and not 1 <= sw.default_prefetch <= layers - 1:
        r.error("swap.default_prefetch", f"must be in [1, num_layers − 1] = [1, {layers - 1}], got {sw.default_prefetch}",
                sw.default_prefetch)
    for key, needed in (("layer_swap", ("layers",)), ("op_swap", ("layers", "op_name"))):
        for i, entry in enumerate(getattr(sw, key) or []):
            for name in needed:
                if not isinstance(entry, dict) or name not in entry:
                    r.error(f"swap.{key}[{i}]", f"entry needs '{name}'", entry)


def _check_exclude_op(rc, limit: int, world: int, r: _Rules) -> None:
    """2.1.0 form: module-path glob → layer ranges (2.1 §1.7). The older list of op-name substrings was removed;
    the reference raises on it when it applies recompute (world > 1) and ignores it on one card."""
    path, ex = "recompute.exclude_op", rc.exclude_op
    if ex is None:
        return
    if isinstance(ex, list):
        message = ("a list of op names (the form before MindSpore Transformers 2.1.0); it must be a dict (module "
                   "path -> list of layer ranges)")
        hint = "e.g. exclude_op: {'*self_attention.linear_proj': ['0-3']}"
        if world > 1:
            r.error(path, message, ex, hint)
        else:
            r.warn(path, message + "; ignored on one process, refused with more", ex, hint)
        return
    for key, ranges in ex.items():
        where = f"{path}.{key}"
        if not isinstance(key, str) or not key.strip():
            r.error(path, f"keys must be non-blank module-path globs, got {key!r}", key)
        elif not isinstance(ranges, list) or not ranges:
            r.error(where, "must be a non-empty list of layer ranges, e.g. ['0-3', 5]", ranges)
        else:
            _check_ascending_layers([str(x) for x in ranges], limit, where, r)
    if rc.mode == "None":
        r.note(path, "has no effect while recompute.mode is None", hint="set recompute.mode: full or select")


def _check_ascending_layers(entries: list[str], limit: int, path: str, r: _Rules) -> None:
    last = -1
    for i, entry in enumerate(entries):
        ids = parse_layer_range(entry)
        if ids is None:
            r.error(f"{path}[{i}]", f"{entry!r} is not 'n' or 'a-b'", entry)
            return
        if ids[0] <= last:
            r.error(f"{path}[{i}]", f"ranges must be strictly ascending ({entry!r} after layer {last})", entry)
            return
        last = ids[-1]
    if limit and last >= limit:
        r.error(path, f"layer {last} does not exist (layers and MTP layers: 0..{limit - 1})", entries)


def _check_profiler_monitor(c: Config, r: _Rules) -> None:
    pr = c.profiler
    if pr.start_step < 1 or pr.end_step < 1 or pr.start_step > pr.end_step:
        r.error("profiler", f"need 1 ≤ start_step ≤ end_step, got {pr.start_step}..{pr.end_step}")
    tb = c.monitor.tensorboard
    for name in ("log_interval", "queue_size"):
        if getattr(tb, name) <= 0:
            r.warn(f"monitor.tensorboard.{name}", f"must be positive; 1 is used instead of {getattr(tb, name)}")
    _check_moe_monitor(c, r)


def _check_moe_monitor(c: Config, r: _Rules) -> None:
    """The reference's own checks (2.0 §1.3), then what there is to monitor."""
    mm, base = c.monitor.moe_monitor, "monitor.moe_monitor"
    n = mm.save_tokens_per_expert_interval
    if n is not None and (isinstance(n, bool) or n <= 0):
        r.error(f"{base}.save_tokens_per_expert_interval", "must be a positive integer", n)
    t = mm.target_layers
    layers = (getattr(c.model, "num_hidden_layers", 0) or 0) + (getattr(c.model, "num_nextn_predict_layers", 0) or 0)
    if isinstance(t, bool) or (isinstance(t, int) and t <= 0):
        r.error(f"{base}.target_layers", "an int N (the layers 0..N-1) must be > 0", t)
    elif isinstance(t, list):
        bad = [x for x in t if isinstance(x, bool) or not isinstance(x, int) or x < 0]
        if bad:
            r.error(f"{base}.target_layers", f"a list of non-negative layer ids, got {bad}", t)
        elif layers and max(t, default=-1) >= layers:
            r.error(f"{base}.target_layers", f"layer {max(t)} does not exist (layers and MTP layers: 0..{layers - 1})", t)
    if (n and not isinstance(n, bool) and n > 0 and c.model is not None and hasattr(c.model, "is_moe")
            and not c.model.is_moe()):
        r.note(f"{base}.save_tokens_per_expert_interval", "the model has no MoE layer: nothing to monitor", n)


# ------------------------------------------------------------------ LoRA, run mode, inference

def _check_lora(c: Config, r: _Rules) -> None:
    """2.1.0's own LoRA checks (2.1 §1.2); the adapters themselves are `engine.lora`."""
    lora = c.lora_config
    if lora is None:
        return
    if not lora.target_modules.strip():
        r.error("lora_config.target_modules", "required: a regex of the module paths that get adapters", "",
                "e.g. '.*linear_qkv.*'")
    else:
        try:
            re.compile(lora.target_modules)
        except re.error as exc:
            r.error("lora_config.target_modules", f"not a valid regular expression ({exc})", lora.target_modules)
    if lora.exclude_layers:
        try:
            re.compile(lora.exclude_layers)
        except re.error as exc:
            r.error("lora_config.exclude_layers", f"not a valid regular expression ({exc})", lora.exclude_layers,
                    "MindSpore Transformers would raise re.error only when it builds the adapters")
    for name in ("lora_rank", "lora_alpha"):
        if getattr(lora, name) <= 0:
            r.error(f"lora_config.{name}", f"must be > 0, got {getattr(lora, name)}", getattr(lora, name))
    if not 0 <= lora.lora_dropout < 1:
        r.error("lora_config.lora_dropout", f"must be in [0, 1), got {lora.lora_dropout}", lora.lora_dropout)


def _note_device_traffic(c: Config, r: _Rules) -> None:
    """On a GPU/Ascend device (or with ``mftk.update_on_device: true``) the device-resident update runs: say what
    still crosses the host each step (`runnable.DEVICE_HOST_TRAFFIC`), so the promise is not larger than it is."""
    from mftk.config.runnable import DEVICE_HOST_TRAFFIC

    device = (c.context.device_target or "").upper()
    on = c.mftk.update_on_device is True or (c.mftk.update_on_device is None and device in ("GPU", "ASCEND"))
    if on:
        r.note("mftk.update_on_device", "weights, gradients and AdamW moments stay on the device between saves; "
               "still crossing the host: " + "; ".join(DEVICE_HOST_TRAFFIC), c.mftk.update_on_device)


def _check_run_mode(c: Config, r: _Rules) -> None:
    """Top-level ``run_mode`` and the ``inference:`` section (2.1 §1.3); mftk trains only."""
    mode = c.run_mode
    if mode not in RUN_MODES:
        r.error("run_mode", f"Invalid run mode: {mode!r}. Must be 'train' or 'predict'.", mode,
                "mftk trains: run_mode: train")
    elif mode == "predict":
        missing = "" if c.inference is not None else " (and run_mode='predict' requires an `inference:` section)"
        r.error("run_mode", f"mftk does not run inference{missing}", mode,
                "set run_mode: train, or run inference with MindSpore Transformers")
    inf = c.inference
    if inf is None:
        return
    for name in ("max_new_tokens", "batch_size"):
        if getattr(inf, name) <= 0:
            r.error(f"inference.{name}", f"must be > 0, got {getattr(inf, name)}", getattr(inf, name))
    suffix = PurePath(inf.output).suffix
    if suffix not in INFERENCE_SUFFIXES:
        r.error("inference.output", f"suffix {suffix!r} is not one of .jsonl, .json, .txt or none", inf.output)
    if mode == "train":
        r.note("inference", "not used by mftk train (MindSpore Transformers reads it only with run_mode: predict)")
