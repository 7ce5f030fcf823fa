"""The static-graph → PyNative key mapping of MindSpore Transformers 2.1 §7, one function per section.

Each function reads static keys through `_Walk` (which remembers what was read), writes PyNative keys,
and records every key's fate: mapped (static path → PyNative path, with the derivation) or not
converted (with the reason). `map_static` runs them all and sweeps what nobody read into the
not-converted list, so no key disappears silently. `mftk/config/convert.py` is the public entry point.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

from mftk.config.static import STATIC_TOP_LEVEL

DEFAULT_COLUMNS = ["input_ids", "labels", "loss_mask", "position_ids"]  # §7.4: PyNative's default drops two
HUGE_MAX_NORM = 1.0e30  # use_clip_grad: False has no exact PyNative equivalent (§7.2)
_OPTIMIZER_KEYS = ("type", "betas", "eps", "weight_decay", "weight_decay_include", "weight_decay_exclude",
                   "enable_fused_opt", "use_fused", "amsgrad", "maximize")
_LR_KEYS = ("type", "learning_rate", "lr_end", "warmup_lr_init", "warmup_steps", "warmup_ratio", "num_cycles",
            "decay_steps", "decay_ratio", "decay_start_steps", "decay_start_ratio", "keep_steps", "final_steps",
            "lr_end1", "lr_end2", "power")
_DATASET_KEYS = ("num_parallel_workers", "drop_remainder", "numa_enable", "prefetch_size")
_CONTEXT_KEYS = ("device_target", "max_device_memory")
_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved_1f1b": "interleaved_1f1b"}
_MODEL_RENAMES = {"mtp_loss_factor": "mtp_loss_scaling_factor", "router_dense_type": "moe_router_dtype"}
# Static-graph model values PyNative rejects: (key, static value) → (PyNative value, why it is the same).
_MODEL_VALUES = {
    # §6.3: the aux loss over the global batch; PyNative's router rejects the static name
    ("moe_router_load_balancing_type", "gbs_aux_loss"): ("global_aux_loss", "the aux loss over the global batch; "
                                                         "PyNative's router rejects the static name"),
    # static `swiglu` halves the gated fc1 output and returns silu(x0)·x1 (mindformers 2.1.0 wheel,
    # parallel_core/training_graph/transformer/mlp.py:140-150), which PyNative calls silu with gated_linear_unit
    ("hidden_act", "swiglu"): ("silu", "the same gated SiLU (SwiGLU) MLP; PyNative has no 'swiglu' activation"),
}
# model_type from older static configs that do not name it (§7.7), tried in this order; names compared
# lower-case without punctuation. A Qwen3 name with experts in model_config is qwen3_moe.
_TYPE_BY_CONFIG_CLASS = {"deepseekv3config": "deepseek_v3", "deepseekv4config": "deepseek_v4",
                         "qwen3config": "qwen3", "qwen3moeconfig": "qwen3_moe"}
_TYPE_BY_NAME_PREFIX = (("deepseekv3", "deepseek_v3"), ("deepseekv4", "deepseek_v4"), ("qwen3moe", "qwen3_moe"),
                        ("qwen3", "qwen3"))
_MOE_KEYS = ("num_experts", "n_routed_experts", "num_moe_experts")
_RUN_MODES = {"train": "train", "finetune": "train", "eval": "train", "predict": "predict"}


def map_static(raw: dict) -> tuple[dict[str, Any], list[tuple[str, str]], list[tuple[str, str]], int]:
    """(PyNative data, mapped, not converted, world size) for static-graph data ``raw`` (not modified)."""
    w = _Walk(copy.deepcopy(raw))
    layout = _parallel(w)
    _model(w, layout)
    _batches_and_steps(w, layout)
    _top_level(w)
    _optimizer_and_schedule(w)
    _dataset(w)
    _context(w)
    _recompute(w)
    _callbacks(w)
    for key in ("trainer", "train_dataset_task", "eval_dataset", "eval_dataset_task", "moe_config"):
        w.drop(key, _DROPPED_SECTIONS[key])
    w.leftovers()
    return _ordered(w.out), w.mapped, w.unmapped, layout["world"]


class _Walk:
    """The static data, the PyNative data being built, and the bookkeeping of every key's fate."""

    def __init__(self, raw: dict) -> None:
        self.raw = raw
        self.out: dict[str, Any] = {}
        self.mapped: list[tuple[str, str]] = []
        self.unmapped: list[tuple[str, str]] = []
        self.seen: set[str] = set()

    def has(self, path: str) -> bool:
        return _get(self.raw, path, _MISSING) is not _MISSING

    def get(self, path: str, default: Any = None) -> Any:
        """A static value; reading it marks the key (and everything under it) as handled."""
        value = _get(self.raw, path, _MISSING)
        if value is _MISSING:
            return default
        self.seen.add(path)
        return value

    def put(self, target: str, value: Any, source: str | None = None, how: str = "") -> None:
        """Set a PyNative value; with ``source`` (static key(s)), record the mapping (``how``: the derivation)."""
        node = self.out
        *parents, key = target.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[key] = value
        if source is not None:
            self.mapped.append((source, f"{target} {how}" if how else target))

    def map(self, source: str, target: str, convert: Callable[[Any], Any] = lambda v: v) -> None:
        if self.has(source):
            self.put(target, convert(self.get(source)), source)

    def drop(self, path: str, reason: str) -> None:
        """Not converted, with the reason (a key already handled is left alone)."""
        if self.has(path) and not self.handled(path):
            self.get(path)
            self.unmapped.append((path, reason))

    def nothing(self, path: str, why: str) -> None:
        """A key whose value needs nothing in PyNative (a default, an empty path): mapped to nothing, saying why."""
        if self.has(path) and not self.handled(path):
            self.get(path)
            self.mapped.append((path, f"(nothing: {why})"))

    def handled(self, path: str) -> bool:
        return any(path == s or path.startswith(s + ".") or path.startswith(s + "[") for s in self.seen)

    def leftovers(self) -> None:
        """Every key nobody read: not converted, saying so."""
        for path in _leaf_paths(self.raw):
            if not self.handled(path):
                top = path.split(".")[0].split("[")[0]
                why = STATIC_TOP_LEVEL.get(top, "")
                reason = (f"no PyNative equivalent ({why})" if why.startswith("none") else
                          "not a key of the static schema mftk converts")
                self.unmapped.append((path, reason))


_MISSING = object()


def _get(data: Any, path: str, default: Any) -> Any:
    node = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            return default
        node = node[key]
    return node


def _leaf_paths(data: Any, prefix: str = "") -> list[str]:
    if isinstance(data, dict) and data:
        return [p for k, v in data.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(data, list) and data and all(isinstance(v, dict) for v in data):
        return [p for i, v in enumerate(data) for p in _leaf_paths(v, f"{prefix}[{i}]")]
    return [prefix]


def _float(value: Any) -> Any:
    """Numbers as floats (YAML 1.1 reads ``1e-5`` as a string; PyNative needs ``0.0``, not ``0``)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


def _int(value: Any, default: int = 1) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


_DROPPED_SECTIONS = {
    "trainer": "the PyNative trainer is chosen by model.architectures",
    "train_dataset_task": "an alias of train_dataset (converted once)",
    "eval_dataset": "no evaluation runs in PyNative pretraining",
    "eval_dataset_task": "no evaluation runs in PyNative pretraining",
    "moe_config": "graph-era MoE section: put MoE keys in model (model_config already holds them in 2.1.0 configs)",
}
_ORDER = ("run_mode", "checkpoint", "training", "parallelism", "optimizer", "lr_scheduler", "train_dataset", "model",
          "monitor", "context", "profiler", "recompute", "recompute_comm", "swap", "callbacks")


def _ordered(out: dict) -> dict:
    return {k: out[k] for k in _ORDER if k in out} | {k: v for k, v in out.items() if k not in _ORDER}


# ------------------------------------------------------------------------------------------------ sections

def _parallel(w: _Walk) -> dict[str, int]:
    """§7.6: degrees (dp is derived in PyNative), interleave and schedule; returns the static layout."""
    pc = "parallel_config"
    dp = _int(w.get(f"{pc}.data_parallel", 1))
    tp, pp = _int(_get(w.raw, f"{pc}.model_parallel", 1)), _int(_get(w.raw, f"{pc}.pipeline_stage", 1))
    cp = _int(_get(w.raw, f"{pc}.context_parallel", 1))
    if w.has(f"{pc}.data_parallel"):
        w.unmapped.append((f"{pc}.data_parallel", f"derived in PyNative as world/(tp·pp·cp) = {dp}; used for the "
                           "world size and global_batch_size"))
    w.map(f"{pc}.model_parallel", "parallelism.tensor_parallel")
    w.map(f"{pc}.pipeline_stage", "parallelism.pipeline_parallel")
    w.map(f"{pc}.context_parallel", "parallelism.context_parallel")
    w.map(f"{pc}.expert_parallel", "parallelism.expert_parallel")
    w.map(f"{pc}.use_seq_parallel", "parallelism.sequence_parallel")
    if tp > 1 and not _get(w.out, "parallelism.sequence_parallel", False):
        w.put("parallelism.sequence_parallel", True, f"{pc}.model_parallel",
              f"= true (model_parallel {tp} > 1: PyNative tensor parallel requires it)")
    w.get(f"{pc}.micro_batch_num")  # folded into global_batch_size (_batches_and_steps)
    for key in ("gradient_aggregation_group", "vocab_emb_dp"):
        w.drop(f"{pc}.{key}", "graph-mode setting; no PyNative equivalent")
    interleave = 1
    switch, count = "parallel.pipeline_config.pipeline_interleave", "model.model_config.pp_interleave_num"
    vpp = _int(_get(w.raw, count, 1))
    if _get(w.raw, switch, False) is True and vpp > 1:
        interleave = vpp
        w.get(switch), w.get(count)
        w.put("parallelism.pipeline_parallel_interleave_num", vpp, f"{switch}, {count}")
    else:
        w.drop(count, f"{switch} is not true: no interleave")
        w.nothing(switch, "false: no interleave")
    schedule = _get(w.raw, "parallel.pipeline_config.pipeline_scheduler", None)
    if schedule is not None:
        w.get("parallel.pipeline_config.pipeline_scheduler")
        if str(schedule).lower() in _SCHEDULES:
            w.put("parallelism.pipeline_parallel_schedule", _SCHEDULES[str(schedule).lower()],
                  "parallel.pipeline_config.pipeline_scheduler")
        else:
            w.unmapped.append(("parallel.pipeline_config.pipeline_scheduler", f"{schedule!r} has no PyNative schedule "
                               "(1f1b / interleaved_1f1b / gpipe); the default 1f1b is used"))
    w.drop("parallel.parallel_optimizer_config.optimizer_weight_shard_size",
           "closest is parallelism.data_parallel_shard (FSDP is always on in PyNative); left at -1 (all of DP)")
    w.drop("parallel.enable_parallel_optimizer", "FSDP is always on in PyNative (degree: data_parallel_shard)")
    if isinstance(_get(w.raw, "parallel", None), dict):
        for path in _leaf_paths(w.raw["parallel"], "parallel"):
            w.drop(path, "graph-mode auto-parallel setting; no PyNative equivalent")
    if pp > 1:
        w.put("parallelism.pipeline_parallel_layers_per_stage", "auto")
    return {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "interleave": interleave, "world": dp * tp * pp * cp}


def _model(w: _Walk, layout: dict[str, int]) -> None:
    """§7.7: ``model.model_config`` lifted one level; architectures a string; offset → layers per stage."""
    mc = w.get("model.model_config", {}) or {}
    if w.has("model.arch"):
        w.drop("model.arch", "the model class comes from model.architectures")
    model: dict[str, Any] = {}
    for key, value in mc.items():
        path = f"model.model_config.{key}"
        if key in ("offset", "pp_interleave_num"):
            continue
        if key == "type":  # the graph-era config class: read by _infer_model_type, never a PyNative model key
            if "model_type" in mc or "".join(c for c in str(value).lower() if c.isalnum()) \
                    not in _TYPE_BY_CONFIG_CLASS:
                w.unmapped.append((path, f"the graph-era config class {value!r}: PyNative picks the model by "
                                   "model_type and architectures"))
            continue
        if key == "architectures" and isinstance(value, list):
            model[key] = value[0] if value else value
            w.mapped.append((path, "model.architectures (a string: the first list item)"))
        elif key in _MODEL_RENAMES:
            model[_MODEL_RENAMES[key]] = value
            w.mapped.append((path, f"model.{_MODEL_RENAMES[key]}"))
        elif key == "hidden_act" and value == "swiglu" and mc.get("bias_swiglu_fusion") is True:
            model[key] = "fusedswiglu"  # what the reference turns swiglu + bias_swiglu_fusion into (model.py)
            w.mapped.append((path, "model.hidden_act: 'fusedswiglu' (static 'swiglu' with bias_swiglu_fusion: "
                             "true)"))
        elif isinstance(value, (str, int, float)) and (key, value) in _MODEL_VALUES:
            model[key], why = _MODEL_VALUES[(key, value)]
            w.mapped.append((path, f"model.{key}: {model[key]!r} (static {value!r}: {why})"))
        else:
            model[key] = value
            w.mapped.append((path, f"model.{key}"))
    if "model_type" not in model:
        _infer_model_type(w, mc, model)
    seq = _get(w.raw, "train_dataset.data_loader.config.seq_length", None)
    if "seq_length" not in model and isinstance(seq, int):
        model["seq_length"] = seq
        w.mapped.append(("train_dataset.data_loader.config.seq_length", "model.seq_length (the model_config has none)"))
    w.out["model"] = model
    offset = mc.get("offset", 0)
    if "offset" in mc and layout["pp"] <= 1:
        w.unmapped.append(("model.model_config.offset", "no pipeline stages: nothing to place"))
    elif layout["pp"] > 1:
        layers = _layers(model)
        stages = stages_from_offset(layers, layout["pp"], layout["interleave"], offset)
        if stages is None:
            w.unmapped.append(("model.model_config.offset", f"{offset!r} does not place {layers} layers on "
                               f"{layout['pp']}×{layout['interleave']} stage chunks; layers per stage left 'auto'"))
        else:
            w.put("parallelism.pipeline_parallel_layers_per_stage", stages,
                  "model.model_config.offset" if "offset" in mc else None)


def _layers(model: dict) -> int:
    """The model's layer count: its own key, else its family's default (a finetune config leaves it to the
    Hugging Face config.json, whose real models the family defaults are)."""
    layers = _int(model.get("num_hidden_layers", model.get("num_layers")), 0)
    if layers == 0 and isinstance(model.get("model_type"), str):
        import attrs

        from mftk.config.model import model_configs

        cls = model_configs().get(model["model_type"])
        if cls is not None and "num_hidden_layers" in attrs.fields_dict(cls):
            layers = _int(attrs.fields_dict(cls)["num_hidden_layers"].default, 0)
    return layers


def _infer_model_type(w: _Walk, mc: dict, model: dict) -> None:
    """``model.model_type`` from ``model_config.type``, ``trainer.model_name`` or ``pretrained_model_dir``."""
    def norm(v: Any) -> str:
        return "".join(ch for ch in str(v).lower() if ch.isalnum())

    found: tuple[str, str] | None = None
    kind = norm(mc.get("type", ""))
    if kind in _TYPE_BY_CONFIG_CLASS:
        found = (_TYPE_BY_CONFIG_CLASS[kind], "model.model_config.type")
    for path in ("trainer.model_name", "pretrained_model_dir"):
        value = _get(w.raw, path, None)
        if found or not isinstance(value, str) or not value.strip():
            continue
        name = norm(value.rstrip("/").rsplit("/", 1)[-1]) if path == "pretrained_model_dir" else norm(value)
        hit = next((t for prefix, t in _TYPE_BY_NAME_PREFIX if name.startswith(prefix)), None)
        if hit is not None:
            found = (hit, path)
    if found is None:
        return
    kind, path = found
    w.get(path)
    if kind == "qwen3" and any(_int(mc.get(k), 0) > 0 for k in _MOE_KEYS):
        kind = "qwen3_moe"
    model["model_type"] = kind
    w.mapped.append((path, f"model.model_type: {kind!r} (inferred: the model_config names no model_type)"))


def stages_from_offset(layers: int, pp: int, interleave: int, offset: Any) -> str | list[str] | None:
    """The static ``offset`` as PyNative ``pipeline_parallel_layers_per_stage`` (one string per stage).

    Each of the ``pp·interleave`` chunks gets ``layers // (pp·interleave)`` layers plus its offset; layers
    are assigned in chunk-major order (chunk c of stage s is stage id c·pp + s), as the static trainer
    does. An all-zero offset that divides evenly is ``'auto'``; None when the counts do not add up."""
    chunks = pp * interleave
    if layers <= 0 or chunks <= 0:
        return None
    rows = _offset_rows(offset, pp, interleave)
    if rows is None:
        return None
    base = layers // chunks
    counts = [[base + rows[c][s] for s in range(pp)] for c in range(interleave)]
    if sum(map(sum, counts)) != layers or any(n < 1 for row in counts for n in row):
        return None
    if all(n == base for row in counts for n in row):
        return "auto"
    parts: list[list[str]] = [[] for _ in range(pp)]
    start = 0
    for c in range(interleave):
        for s in range(pp):
            end = start + counts[c][s] - 1
            parts[s].append(str(start) if end == start else f"{start}-{end}")
            start = end + 1
    return [",".join(p) for p in parts]


def _offset_rows(offset: Any, pp: int, interleave: int) -> list[list[int]] | None:
    if isinstance(offset, int) and not isinstance(offset, bool):
        return [[offset] * pp for _ in range(interleave)]
    if not isinstance(offset, list):
        return None
    rows = offset if offset and all(isinstance(r, list) for r in offset) else [offset]
    if len(rows) != interleave or any(len(r) != pp for r in rows):
        return None
    if not all(isinstance(x, int) and not isinstance(x, bool) for r in rows for x in r):
        return None
    return [list(r) for r in rows]


def _batches_and_steps(w: _Walk, layout: dict[str, int]) -> None:
    """§7.2: local batch, derived global batch (base_trainer.py rules), steps from epochs × sizes[0] // gbs."""
    lbs = _int(_get(w.raw, "runner_config.batch_size", 1))
    w.map("runner_config.batch_size", "training.local_batch_size")
    mbi = _int(_get(w.raw, "micro_batch_interleave_num", 1))
    if layout["pp"] > 1:  # mindformers/trainer/base_trainer.py:214-276
        mbn = _int(_get(w.raw, "parallel_config.micro_batch_num", 1))
        gbs, factors = lbs * layout["dp"] * mbn * mbi, (lbs, layout["dp"], mbn, mbi)
        keys = ("runner_config.batch_size", "parallel_config.data_parallel", "parallel_config.micro_batch_num",
                "micro_batch_interleave_num")
        w.drop("runner_config.gradient_accumulation_steps", "ignored by the static trainer with pipeline stages")
    else:
        gas = _int(_get(w.raw, "runner_config.gradient_accumulation_steps", 1))
        gbs, factors = lbs * layout["dp"] * mbi * gas, (lbs, layout["dp"], mbi, gas)
        keys = ("runner_config.batch_size", "parallel_config.data_parallel", "micro_batch_interleave_num",
                "runner_config.gradient_accumulation_steps")
        w.drop("parallel_config.micro_batch_num", "only used with pipeline stages")
    for k in keys:
        w.get(k)
    w.put("training.local_batch_size", lbs)
    w.put("training.global_batch_size", gbs, ", ".join(k for k in keys if w.has(k)) or "(defaults)",
          f"= {'·'.join(map(str, factors))} = {gbs}")
    epochs = _int(w.get("runner_config.epochs", 1))
    sizes = _get(w.raw, "train_dataset.data_loader.sizes", None)
    if isinstance(sizes, list) and sizes and isinstance(sizes[0], int) and gbs > 0:
        steps = max(epochs * (sizes[0] // gbs), 1)
        w.put("training.steps", steps, "runner_config.epochs, train_dataset.data_loader.sizes",
              f"= epochs × floor(sizes[0] / global_batch_size) = {epochs} × floor({sizes[0]} / {gbs}) = {steps}")
    elif w.has("runner_config.epochs"):
        w.unmapped.append(("runner_config.epochs", "no train_dataset sizes to count steps from: set training.steps"))
    for key in ("sink_mode", "sink_size"):
        w.drop(f"runner_config.{key}", "no data sinking in PyNative")
    w.drop("runner_wrapper.type", "PyNative has one training step")
    w.drop("runner_wrapper.scale_sense", "no loss scaling in PyNative")
    clip = w.get("runner_wrapper.use_clip_grad", None)
    keys = ", ".join(k for k in ("runner_wrapper.use_clip_grad", "runner_wrapper.max_grad_norm") if w.has(k))
    norm = _float(w.get("runner_wrapper.max_grad_norm", 1.0))
    if clip is True:
        w.put("training.max_norm", norm, keys)
    elif clip is False:
        w.put("training.max_norm", HUGE_MAX_NORM, keys, f"= {HUGE_MAX_NORM:g} (use_clip_grad: False has no exact "
              "equivalent: a huge max_norm never clips)")


def _top_level(w: _Walk) -> None:
    """§7.1."""
    w.map("seed", "training.seed")
    w.map("train_precision_sync", "training.deterministic")
    mode = w.get("run_mode", None)
    if mode is not None:
        target = _RUN_MODES.get(str(mode), str(mode))
        w.put("run_mode", target, "run_mode", f"({mode!r} is not a PyNative mode)" if target != mode else "")
    load = _get(w.raw, "load_checkpoint", "")
    if load:
        w.map("load_checkpoint", "checkpoint.load_path")
        w.map("resume_training", "checkpoint.no_load_optim", lambda v: not v)
    else:
        w.nothing("load_checkpoint", "empty, nothing to load")
        if _get(w.raw, "resume_training", False):
            w.drop("resume_training", "no load_checkpoint to resume from (use `mftk resume --from DIR`)")
        w.nothing("resume_training", "nothing to resume")
    w.drop("pretrained_model_dir", "the Hugging Face model folder (config.json, tokenizer): PyNative needs the "
           "model: section written out (`mftk validate-config --model-from-hf <dir>/config.json` prints it) and "
           "loads weights from checkpoint.load_path")
    w.map("profile", "profiler.enable_profiling")
    w.map("profile_start_step", "profiler.start_step")
    w.map("profile_stop_step", "profiler.end_step")
    w.map("profile_memory", "profiler.profile_memory")
    for key, why in STATIC_TOP_LEVEL.items():
        if why.startswith("none") and key not in ("trainer", "train_dataset_task", "eval_dataset_task",
                                                  "micro_batch_interleave_num"):
            w.drop(key, why.removeprefix("none: "))


def _optimizer_and_schedule(w: _Walk) -> None:
    """§7.3."""
    for key in _OPTIMIZER_KEYS:
        w.map(f"optimizer.{key}", f"optimizer.{key}", _float if key in ("eps", "weight_decay") else lambda v: v)
    if isinstance(_get(w.out, "optimizer.betas", None), list):
        w.out["optimizer"]["betas"] = [_float(b) for b in w.out["optimizer"]["betas"]]
    w.drop("optimizer.swap", "no optimizer swap in PyNative (Muon raises on it)")
    for key in _LR_KEYS:
        convert = _float if key in ("learning_rate", "lr_end", "warmup_lr_init", "warmup_ratio", "lr_end1", "lr_end2") \
            else (lambda v: v)
        w.map(f"lr_schedule.{key}", f"lr_scheduler.{key}", convert)
    w.drop("lr_schedule.total_steps", "PyNative forces it to training.steps")


def _dataset(w: _Walk) -> None:
    """§7.4: ``data_loader`` → ``dataloader`` (config copied), columns, loader-level settings."""
    dl = w.get("train_dataset.data_loader", None)
    if isinstance(dl, dict):
        loader = copy.deepcopy(dl)
        cfg = loader.get("config")
        if loader.get("type") == "BlendedMegatronDatasetDataLoader" and isinstance(cfg, dict) \
                and "create_compressed_eod_mask" not in cfg:
            cfg["create_compressed_eod_mask"] = False
            w.mapped.append(("(absent)", "train_dataset.dataloader.config.create_compressed_eod_mask = false "
                             "(PyNative requires the key)"))
        columns = w.get("train_dataset.input_columns", None)
        loader["column_names"] = list(columns) if isinstance(columns, list) else list(DEFAULT_COLUMNS)
        if w.has("train_dataset.python_multiprocessing"):
            loader["python_multiprocessing"] = w.get("train_dataset.python_multiprocessing")
            w.mapped.append(("train_dataset.python_multiprocessing", "train_dataset.dataloader.python_multiprocessing"))
        w.put("train_dataset.dataloader", loader, "train_dataset.data_loader")
        w.mapped.append(("train_dataset.input_columns", "train_dataset.dataloader.column_names") if isinstance(
            columns, list) else ("(absent)", f"train_dataset.dataloader.column_names = {DEFAULT_COLUMNS} (PyNative's "
                                 "default [input_ids, labels] would drop loss_mask and position_ids)"))
    for key in _DATASET_KEYS:
        w.map(f"train_dataset.{key}", f"train_dataset.{key}")
    w.drop("train_dataset.construct_args_key", "the column names are the model's arguments in PyNative")
    w.drop("train_dataset.seed", "sampling uses train_dataset.dataloader.config.seed")


def _context(w: _Walk) -> None:
    """§7.5: ``mode`` becomes 1; the PyNative ContextConfig rejects every other graph-mode key."""
    if w.has("context.mode"):
        mode = w.get("context.mode")
        w.put("context.mode", 1, "context.mode", f"= 1 (was {mode}, GRAPH_MODE; PyNative ignores the section)")
    for key in _CONTEXT_KEYS:
        w.map(f"context.{key}", f"context.{key}")
    if isinstance(_get(w.raw, "context", None), dict):
        for path in _leaf_paths(w.raw["context"], "context"):
            w.drop(path, "graph-mode context setting (the PyNative context section rejects it)")


def _recompute(w: _Walk) -> None:
    """§7.6: ``recompute: True`` → full recompute of every layer (and the MTP layers)."""
    rc = "recompute_config"
    value = w.get(f"{rc}.recompute", None)
    model = w.out.get("model", {})
    layers = _layers(model)
    mtp = _int(model.get("num_nextn_predict_layers", model.get("mtp_num_layers", 0)), 0)
    if value is True and layers > 0:
        ids = f"0-{layers + mtp - 1}" if layers + mtp > 1 else "0"
        w.put("recompute.mode", "full", f"{rc}.recompute", f"= full, full_recompute_layer = [{ids}] (every layer"
              + (", MTP included)" if mtp else ")"))
        w.put("recompute.full_recompute_layer", [ids])
    elif value not in (None, False):
        w.unmapped.append((f"{rc}.recompute", "per-stage recompute lists have no PyNative form; set recompute.mode "
                           "and full_recompute_layer by hand"))
    elif value is False:
        w.nothing(f"{rc}.recompute", "false: recompute.mode stays None")
    if _get(w.raw, f"{rc}.select_recompute", False) not in (False, None):
        w.drop(f"{rc}.select_recompute", "different format: set recompute.mode: select and recompute.select_module "
               "(module glob -> layer ranges)")
    w.nothing(f"{rc}.select_recompute", "false")
    if isinstance(_get(w.raw, rc, None), dict):
        for path in _leaf_paths(w.raw[rc], rc):
            w.drop(path, "no direct PyNative equivalent (recompute_comm.enable + select_module of comm-op paths)")


def _callbacks(w: _Walk) -> None:
    """§7.8: CheckpointMonitor → checkpoint.*; the built-in monitors need nothing; PyNative ones are kept."""
    items = w.get("callbacks", None)
    saving = False
    kept = []
    for i, cb in enumerate(items if isinstance(items, list) else []):
        path = f"callbacks[{i}]"
        kind = cb.get("type") if isinstance(cb, dict) else None
        if kind == "CheckpointMonitor":
            saving = True
            w.mapped.append((f"{path}.type", "checkpoint.enable_save = true (+ save_path)"))
            for key, target in (("prefix", "prefix"), ("save_checkpoint_steps", "save_interleaved_steps"),
                                ("keep_checkpoint_max", "save_max"), ("async_save", "async_save")):
                if key in cb:
                    w.put(f"checkpoint.{target}", cb[key], f"{path}.{key}")
            for key in cb:
                if key not in ("type", "prefix", "save_checkpoint_steps", "keep_checkpoint_max", "async_save"):
                    w.unmapped.append((f"{path}.{key}", "PyNative writes per-rank safetensors shards; no such option"))
        elif kind in ("MFLossMonitor", "TopkBiasBalanceCallback"):
            w.unmapped.append((path, f"{kind}: built into the PyNative trainer"))
        elif kind in ("MaxLogitsMonitor", "MaxLogitsReset"):
            kept.append(cb)
            w.mapped.append((path, f"callbacks[{len(kept) - 1}]"))
        else:
            w.unmapped.append((path, f"{kind}: a static-graph callback; PyNative callbacks are TrainerCallback types"))
    if kept:
        w.put("callbacks", kept)
    output = _get(w.raw, "output_dir", "./output") or "./output"
    if saving:
        w.put("checkpoint.enable_save", True)
        w.put("checkpoint.save_path", f"{str(output).rstrip('/')}/checkpoint", "output_dir" if w.has("output_dir")
              else "(absent)", "= <output_dir>/checkpoint (logs: `mftk train --output-dir`)")
        w.get("output_dir")
    else:
        w.put("checkpoint.enable_save", False)
        w.drop("output_dir", "no CheckpointMonitor callback: nothing is saved (checkpoint.enable_save: false); "
               "logs: `mftk train --output-dir`")
