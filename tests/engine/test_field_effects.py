"""Each implemented config field changes what the engine does: a run with the field set differs from the run
without it. These are the proving tests the status table (`mftk/config/status.py`) names for most fields, and
what `scripts/field_effects.py` runs under each field's "forgetting" mutant (`mftk/config/mutant.py`: the field
reset to its default after validation), where they must fail.

What is compared is what the engine produced — losses, gradient norms, learning rates, the metrics rows, the
checkpoint's file names and tensor bytes, the files a monitor or profiler writes, the log lines a monitor
adds — never the config echoed back (the saved ``mftk-config.json`` and the start-up log are left out, since
a forgotten field would differ there while the engine ignored it). That these effects are the *right* ones
is shown by the tests named in each module's docstring (HF parity, float64 transcriptions); here only that
they happen at all.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine

TIMING = re.compile(r"time|throughput|rss|seconds")
DENSE_LORA = {"target_modules": r"(linear_qkv|linear_proj|linear_fc1|linear_fc2|linear_qb|linear_kvb)$",
              "lora_rank": 4, "lora_alpha": 8, "lora_a_std": 0.05, "lora_b_std": 0.02}
MUON = {"optimizer": {"type": "Muon", "weight_decay": 0.1}}
Q3, DS3, DS4, Q3M = "qwen3_tiny.yaml", "deepseek_v3_tiny.yaml", "deepseek_v4_tiny.yaml", "qwen3_moe_tiny.yaml"
SCHED = {"lr_scheduler": {"type": "ConstantWithCoolDownLR", "learning_rate": 3.0e-3, "warmup_steps": 2}}


class E:
    """One field's effect: set ``path`` to ``value`` on ``template`` (with ``extra`` on both sides) and compare
    ``what``: "run" (a 2-step run: losses, norms, metrics, checkpoint) or "lr" (the schedule over 24 steps);
    ``log``: a regex of log lines that count too; ``also``: what the value needs with it (a paired key);
    ``steps``: the run's length (one step: the saved weights
    show the update, the learning rate being the peak from the first step)."""

    def __init__(self, value: Any, *, extra: dict | None = None, template: str = Q3, what: str = "run",
                 log: str = "", steps: int = 1, also: dict | None = None) -> None:
        self.value, self.extra, self.template, self.what, self.log, self.steps = (
            value, extra or {}, template, what, log, steps)
        self.also = also or {}  # settings the field's value needs on its side only (None: removed)


def _cd(**kw: Any) -> dict:
    return {"lr_scheduler": {**SCHED["lr_scheduler"], **kw}}


def _data(**kw: Any) -> dict:
    return {"train_dataset": {"dataloader": {"config": kw}}}


def _cols(*names: str) -> dict:
    return {"train_dataset": {"dataloader": {"column_names": ["input_ids", "labels", *names]}}}


def _merge(a: dict, b: dict) -> dict:
    out = copy.deepcopy(a)
    for k, v in b.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _nest(path: str, value: Any) -> dict:
    node: Any = value
    for part in reversed(path.split(".")):
        node = {part: node}
    return node


EFFECTS: dict[str, E] = {
    # checkpoint
    "checkpoint.enable_save": E(False),
    "checkpoint.save_path": E("elsewhere"),
    "checkpoint.save_max": E(1, extra={"checkpoint": {"save_interleaved_steps": 1}}, steps=2),
    "checkpoint.save_interleaved_steps": E(1, steps=2),
    "checkpoint.no_save_optim": E(True),
    "checkpoint.async_save": E(True, extra={"checkpoint": {"save_interleaved_steps": 1}}, steps=2,
                               log=r"Checkpoint saved at step 1 .*async=True"),
    "checkpoint.load_path": E("@ckpt", steps=3),
    "checkpoint.no_load_optim": E(True, extra={"checkpoint": {"load_path": "@ckpt"}}, steps=3),
    "checkpoint.prefix": E("other"),
    # training
    "training.steps": E(2),
    "training.local_batch_size": E(2, extra={"training": {"global_batch_size": 2}}),
    "training.global_batch_size": E(2),
    "training.max_norm": E(0.05),
    "training.seed": E(7),
    "training.rampup_batch_size": E([1, 1, 2], extra={"training": {"global_batch_size": 2}}, steps=3),
    # optimizer (AdamW)
    "optimizer.betas": E([0.5, 0.6]),
    "optimizer.eps": E(0.5),
    "optimizer.weight_decay": E(0.9),
    "optimizer.weight_decay_include": E(["*layernorm*"]),
    "optimizer.weight_decay_exclude": E(["*linear_qkv*"]),
    "optimizer.type": E("Muon"),
    # Muon
    "optimizer.matched_adamw_rms": E(0.5, extra=MUON),
    "optimizer.momentum": E(0.5, extra=MUON),
    "optimizer.nesterov": E(False, extra=MUON),
    "optimizer.ns_steps": E(2, extra=MUON),
    "optimizer.ns_coefficients": E([3.0, -3.0, 1.0], extra=MUON),
    "optimizer.adamw_betas": E([0.5, 0.6], extra=MUON),
    "optimizer.adamw_eps": E(0.5, extra=MUON),
    "optimizer.adamw_include": E(["*linear_proj*"], extra=MUON),
    "optimizer.qk_clip_threshold": E(1e-3, extra=MUON, template=DS3, steps=2),  # QK-clip: MLA only
    "optimizer.qk_clip_enabled": E(False, extra=_merge(MUON, {"optimizer": {"qk_clip_threshold": 1e-3}}),
                                   template=DS3, steps=2),
    # schedules
    "lr_scheduler.type": E("LinearWithWarmUpLR", what="lr"),
    "lr_scheduler.learning_rate": E(1e-3, extra=SCHED, what="lr"),
    "lr_scheduler.warmup_steps": E(5, extra=SCHED, what="lr"),
    "lr_scheduler.warmup_ratio": E(0.5, extra=_cd(type="CosineWithWarmUpLR", warmup_steps=None), what="lr"),
    "lr_scheduler.warmup_lr_init": E(1e-4, extra=SCHED, what="lr"),
    "lr_scheduler.lr_end": E(1e-4, extra=_cd(type="CosineWithWarmUpLR"), what="lr"),
    "lr_scheduler.num_cycles": E(2.0, extra=SCHED, what="lr"),
    "lr_scheduler.decay_steps": E(4, extra=SCHED, what="lr"),
    "lr_scheduler.decay_ratio": E(0.25, extra=SCHED, what="lr"),
    "lr_scheduler.decay_start_steps": E(10, extra=_cd(type="WarmUpStableDecayLR"), what="lr"),
    "lr_scheduler.decay_start_ratio": E(0.5, extra=_cd(type="WarmUpStableDecayLR"), what="lr"),
    "lr_scheduler.keep_steps": E(4, extra=SCHED, what="lr"),
    "lr_scheduler.final_steps": E(4, extra=SCHED, what="lr"),
    "lr_scheduler.lr_end1": E(1e-4, extra=SCHED, what="lr"),
    "lr_scheduler.lr_end2": E(1e-5, extra=_cd(final_steps=2, decay_steps=4), what="lr"),
    "lr_scheduler.power": E(2.0, extra=_cd(type="PolynomialWithWarmUpLR"), what="lr"),
    # data: the first micro-batches the run's loader yields (`builders.build_data`), its length, its cache files
    "train_dataset.dataloader.sizes": E([200, 0, 0], what="data"),
    "train_dataset.dataloader.shuffle": E(True, what="data"),
    # without the loss_mask column the model masks its pad id (0, the EOD here); the column counts every token
    "train_dataset.dataloader.column_names": E(["input_ids", "labels"]),
    "train_dataset.dataloader.config.seed": E(7, what="data"),
    "train_dataset.dataloader.config.split": E("1, 1, 0", what="data"),
    "train_dataset.dataloader.config.data_path": E(["1", "@corpus2"], what="data"),
    "train_dataset.dataloader.config.train_data_path": E(["1", "@corpus2"], also=_data(data_path=None), what="data"),
    "train_dataset.dataloader.config.path_to_cache": E("elsewhere_cache", what="data"),
    "train_dataset.dataloader.config.eod": E(5, extra=_merge(_data(eod_mask_loss=True), _cols("loss_mask")),
                                             what="data"),
    "train_dataset.dataloader.config.pad": E(35, extra=_cols("loss_mask"), what="data"),  # a token of batch 1
    "train_dataset.dataloader.config.eod_mask_loss": E(True, extra=_cols("loss_mask"), what="data"),
    "train_dataset.dataloader.config.reset_attention_mask": E(True, extra=_merge(
        _data(create_attention_mask=True), _cols("attention_mask")), what="data"),
    "train_dataset.dataloader.config.create_attention_mask": E(True, extra=_merge(
        _data(reset_attention_mask=True), _cols("attention_mask")), what="data"),
    "train_dataset.dataloader.config.create_compressed_eod_mask": E(True, extra=_cols("actual_seq_len"), what="data"),
    "train_dataset.dataloader.config.eod_pad_length": E(64, extra=_merge(_data(create_compressed_eod_mask=True),
                                                                         _cols("actual_seq_len")), what="data"),
    "train_dataset.dataloader.config.mock": E(True, also=_data(data_path=None), what="data"),
    "train_dataset.dataloader.config.add_extra_token_to_sequence": E(False, what="data"),
    # monitors
    "monitor.train_state.local_loss": E(True, log=r"local_loss"),
    "monitor.train_state.local_norm": E("linear", log=r"local_norm"),
    "monitor.train_state.device_norm": E(True, log=r"device_norm"),
    "monitor.train_state.device_loss": E(True, log=r"device_loss"),
    "monitor.tensorboard.output_dir": E("tb"),
    "monitor.tensorboard.log_interval": E(2, extra={"monitor": {"tensorboard": {"output_dir": "tb"}}}, steps=2),
    "monitor.moe_monitor.save_tokens_per_expert_interval": E(1, template=DS3, log=r"tokens_per_expert"),
    "monitor.moe_monitor.target_layers": E([1], template=DS3, log=r"tokens_per_expert", extra={
        "monitor": {"moe_monitor": {"save_tokens_per_expert_interval": 1}}}),
    "callbacks.type": E("MaxLogitsMonitor", log=r"max_attention_logit|max_logit"),
    # LoRA
    "lora_config.target_modules": E(r"linear_qkv$", extra={"lora_config": DENSE_LORA}),
    "lora_config.exclude_layers": E(r"layers\.0\.", extra={"lora_config": DENSE_LORA}),
    "lora_config.lora_rank": E(2, extra={"lora_config": DENSE_LORA}),
    "lora_config.lora_alpha": E(2, extra={"lora_config": DENSE_LORA}),
    "lora_config.lora_dropout": E(0.5, extra={"lora_config": DENSE_LORA}),
    "lora_config.lora_a_std": E(0.5, extra={"lora_config": DENSE_LORA}),
    "lora_config.lora_b_std": E(0.5, extra={"lora_config": DENSE_LORA}),
    # model: dense
    "model.initializer_range": E(0.2),
    "model.rms_norm_eps": E(0.5),
    "model.rope_theta": E(10.0),
    "model.attention_bias": E(True),
    "model.tie_word_embeddings": E(True),
    "model.vocab_size": E(300),
    "model.hidden_size": E(48),
    "model.intermediate_size": E(40),
    "model.num_hidden_layers": E(1),
    "model.num_attention_heads": E(8),
    "model.num_key_value_heads": E(4),
    "model.head_dim": E(8),
    "model.hidden_dropout": E(0.5),
    "model.qk_layernorm": E(False, template=DS3),
    "model.track_max_attention_logit": E(True, log=r"max_attention_logit|max_logit"),
    # model: DeepSeek-V3 (MLA, MoE, YaRN, MTP)
    "model.q_lora_rank": E(8, template=DS3),
    "model.kv_lora_rank": E(8, template=DS3),
    "model.qk_nope_head_dim": E(4, template=DS3),
    "model.qk_rope_head_dim": E(4, template=DS3),
    "model.v_head_dim": E(4, template=DS3),
    "model.rotary_scaling_factor": E(2.0, template=DS3),
    "model.beta_fast": E(4.0, template=DS3, extra={"model": {"max_position_embeddings": 4096}}),  # YaRN's ramp
    "model.beta_slow": E(0.1, template=DS3),
    "model.mscale": E(2.0, template=DS3),
    "model.mscale_all_dim": E(2.0, template=DS3),
    "model.moe_intermediate_size": E(8, template=DS3),
    "model.n_shared_experts": E(0, template=DS3),
    "model.moe_shared_expert_intermediate_size": E(8, template=DS3),
    "model.use_shared_expert_gating": E(True, template=DS3),
    "model.n_routed_experts": E(16, template=DS3),
    "model.num_experts_per_tok": E(4, template=DS3),
    "model.routed_scaling_factor": E(0.5, template=DS3),
    "model.n_group": E(2, template=DS3),
    "model.topk_group": E(1, template=DS3),
    "model.norm_topk_prob": E(False, template=DS3),
    "model.moe_layer_freq": E([1, 0], template=DS3),
    "model.first_k_dense_replace": E(0, template=DS3),
    "model.moe_router_score_function": E("sqrtsoftplus", template=DS3),
    "model.moe_router_enable_expert_bias": E(False, template=DS3, steps=2),
    "model.moe_router_bias_update_rate": E(0.5, template=DS3, steps=2),
    "model.moe_router_load_balancing_type": E("aux_loss", template=DS3, extra={  # two sequences: aux ≠ seq_aux
        "model": {"moe_aux_loss_coeff": 0.1}, "training": {"local_batch_size": 2, "global_batch_size": 2}}),
    "model.moe_aux_loss_coeff": E(0.5, template=DS3),
    "model.num_nextn_predict_layers": E(0, template=DS3),
    "model.mtp_loss_scaling_factor": E(0.9, template=DS3),
    # model: DeepSeek-V4 (CSA/HCA attention, hyper-connections, hash routing)
    "model.o_groups": E(1, template=DS4),
    "model.o_lora_rank": E(8, template=DS4),
    "model.compress_ratios": E([0, 4, 4, 0], template=DS4),
    "model.csa_window_size": E(16, template=DS4),
    "model.compress_rope_theta": E(1000.0, template=DS4),
    "model.csa_dense_mode": E(True, template=DS4),
    "model.index_n_heads": E(2, template=DS4),
    "model.index_head_dim": E(8, template=DS4),
    "model.index_topk": E(4, template=DS4),
    "model.dsa_indexer_loss_coeff": E(0.5, template=DS4),
    "model.num_residual_streams": E(2, template=DS4),
    "model.mhc_sinkhorn_iterations": E(3, template=DS4),
    "model.mhc_init_gating_factor": E(0.5, template=DS4),
    "model.hc_eps": E(0.1, template=DS4),
    "model.num_hash_layers": E(0, template=DS4),
    "model.original_max_position_embeddings": E(4096, template=DS4),
    # model: the rest
    "model.max_position_embeddings": E(4096, template=DS3),  # DeepSeek-V3: YaRN's original length
    "model.pad_token_id": E(5),
    "model.rope_scaling": E({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}, template=DS3),
    "model.position_embedding_type": E("rope", template=DS3),
    # model: Qwen3-MoE
    "model.num_experts": E(4, template=Q3M),
    "model.decoder_sparse_step": E(2, template=Q3M),
    "model.mlp_only_layers": E([1], template=Q3M),
}


SEEN: dict[tuple, dict] = {}  # (template, extra, what, log, steps, mutant) → the run without the field


def _raw(e: E, corpus, d: Path, path: str | None) -> dict:
    raw = tiny_raw(e.template, corpus, d / "ckpt", steps=e.steps, gbs=1)
    raw["checkpoint"]["save_interleaved_steps"] = 2
    raw["lr_scheduler"] = {"type": "CosineWithWarmUpLR", "learning_rate": 3.0e-3, "warmup_steps": 0}
    raw = _merge(raw, e.extra)
    if path is not None and path.startswith("callbacks."):  # a list of callbacks: one, with the field set
        raw["callbacks"] = [{**e.extra.get("callback", {}), path.split(".")[1]: e.value}]
    elif path is not None:
        raw = _merge(_merge(raw, e.also), _nest(path, e.value))
    _drop_nones(raw)
    text = json.dumps(raw)
    if "@corpus2" in text:
        raw = json.loads(text.replace('"@corpus2"', json.dumps(str(_corpus2()))))
    if "@ckpt" in json.dumps(raw):
        raw["checkpoint"] = {k: (_checkpoint(corpus) if v == "@ckpt" else v) for k, v in raw["checkpoint"].items()}
    return raw


_CKPT: list[str] = []
_CORPUS2: list[Path] = []


def _corpus2() -> Path:
    """A second corpus (other documents) for the data-path fields."""
    if not _CORPUS2:
        import tempfile

        from tests.helpers.tiny import write_corpus

        _CORPUS2.append(write_corpus(Path(tempfile.mkdtemp(prefix="field-effects-data-")) / "other_text_document",
                                     seed=5))
    return _CORPUS2[0]


def _checkpoint(corpus) -> str:
    """A 2-step Qwen3 checkpoint to start from (written once per process; never under a mutant's config:
    it is the same file for both sides)."""
    if not _CKPT:
        import tempfile

        from mftk.config.mutant import ENV
        from mftk.engine.run import train

        d = Path(tempfile.mkdtemp(prefix="field-effects-ckpt-"))
        raw = tiny_raw(Q3, corpus, d / "ckpt", steps=2, gbs=1)
        saved = os.environ.pop(ENV, None)
        try:
            train(load(raw), output_dir=d / "out", install_signals=False, lock_save_path=False)
        finally:
            if saved is not None:
                os.environ[ENV] = saved
        _CKPT.append(str(d / "ckpt" / "iteration_00000002"))
    return _CKPT[0]


def _drop_nones(node: Any) -> None:
    if isinstance(node, dict):
        for k in [k for k, v in node.items() if v is None]:
            del node[k]
        for v in node.values():
            _drop_nones(v)


def observe(e: E, corpus, d: Path, path: str | None, monkeypatch) -> dict:
    """What the engine produced for the config with (``path``) or without (None) the field set."""
    d.mkdir(parents=True, exist_ok=True)
    raw = _raw(e, corpus, d, path)
    if e.what == "lr":
        from mftk.engine.builders import build_schedule

        config = load(raw).config
        sched = build_schedule(attrs_evolve_steps(config, 24))
        return {"lr": [sched(t) for t in range(24)]}
    if e.what == "data":
        from mftk.engine.builders import build_data

        monkeypatch.chdir(d)
        config = load(raw).config
        data = build_data(config, dp=1)
        batches = data.loader.iter_batches(data.loader.start_batch(0))
        got = [{k: hashlib.sha256(v.tobytes()).hexdigest()[:16] + str(v.shape) for k, v in next(batches).items()}
               for _ in range(3)]
        cache = sorted({p.parent.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()})  # where, not
        return {"batches": got, "len": len(data.loader), "cache": cache}  # the md5 names (a config echo)
    from mftk.engine.run import train

    monkeypatch.chdir(d)  # a forgotten save_path writes here
    result = _capped_train(load(raw), d, cap=e.steps + 2)
    rows = [json.loads(line) for line in Path(result.metrics_file).read_text().splitlines() if line.strip()]
    obs = {"losses": result.losses, "norms": result.grad_norms, "consumed": result.consumed_samples,
           "metrics": [{k: v for k, v in r.items() if not TIMING.search(k) and k != "per_step_time"} for r in rows],
           "files": _files(d)}
    if e.log:
        pattern = re.compile(e.log)
        obs["log"] = [_mask(line, d) for line in Path(result.log_file).read_text().splitlines() if pattern.search(line)]
    return obs


def _capped_train(loaded: Any, d: Path, *, cap: int) -> Any:
    """The run, stopped (as a signal would) after ``cap`` steps: a forgotten ``training.steps`` would otherwise
    train the default 1000. The stopped run's observation is its metrics and files so far."""
    from types import SimpleNamespace

    from mftk.engine.run import train
    from mftk.engine.trainer import StopFlag
    from mftk.errors import TrainingInterrupted
    from mftk.progress import BaseSink

    stop = StopFlag()

    class Cap(BaseSink):
        def on_step(self, metrics: dict) -> None:
            if metrics.get("step", 0) >= cap:
                stop.request("cap")

    try:
        return train(loaded, output_dir=d / "out", install_signals=False, lock_save_path=False, stop=stop,
                     sinks=[Cap()])
    except TrainingInterrupted:
        log = d / "out" / "log" / "rank_0"
        return SimpleNamespace(losses=("stopped",), grad_norms=(), consumed_samples=-1,
                               metrics_file=str(log / "metrics.jsonl"), log_file=str(log / "info.log"))


def attrs_evolve_steps(config: Any, steps: int) -> Any:
    import attrs

    return attrs.evolve(config, training=attrs.evolve(config.training, steps=steps))


def _mask(line: str, d: Path) -> str:
    line = line.replace(str(d), "<run>")
    return re.sub(r"\d+\.\d+s|\d{4}-\d\d-\d\d[ T][\d:,.]+|\d+ms", "#", line)


def _files(d: Path) -> dict[str, str]:
    """Every file the run wrote under ``d`` but the data cache, the logs and the saved config: its relative
    name → a digest of its bytes (tensors) or its size class (anything else)."""
    out = {}
    for p in sorted(d.rglob("*")):
        rel = p.relative_to(d).as_posix()
        if not p.is_file() or rel.startswith(("cache/", "out/log/")) or p.name in ("mftk-config.json",):
            continue
        if p.suffix == ".safetensors":
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        elif "tfevents" in p.name:  # named by time and host: what it holds is its scalars' tags and steps
            from tests.helpers.tfevents import scalars

            tags, _ = scalars(p)
            out[f"{p.parent.relative_to(d).as_posix()}/<events>"] = sorted((t, [s for s, _ in v]) for t, v in tags.items())
        elif p.name == "common.json":
            out[rel] = p.read_text()
        else:
            out[rel] = "file"
    return out


@pytest.mark.parametrize("path", sorted(EFFECTS))
def test_field_changes_what_the_engine_does(path, corpus, tmp_path, monkeypatch):
    """The run with the field set differs from the run without it (shared by the fields with the same
    template and extra settings; a mutant's runs are cached apart, since it changes both)."""
    from mftk.config.mutant import ENV

    e = EFFECTS[path]
    key = (e.template, json.dumps(e.extra, sort_keys=True), e.what, e.log, e.steps, os.environ.get(ENV, ""))
    if key not in SEEN:
        SEEN[key] = observe(e, corpus, tmp_path / "default", None, monkeypatch)
    got = observe(e, corpus, tmp_path / "set", path, monkeypatch)
    assert got != SEEN[key], f"{path}: {e.value!r} gives the same run as the default"


def test_process_setup_takes_the_device_and_determinism_from_the_config(monkeypatch):
    """context.device_target is what the run asks MindSpore for (on a CPU-only machine the unset default finds
    the same CPU, so the request itself is observed), and training.deterministic switches MindSpore's
    deterministic mode on."""
    import mindspore as ms

    from mftk.engine import device
    from mftk.engine.process import setup_process

    asked, deterministic = [], []
    monkeypatch.setattr(device, "select", lambda target: asked.append(target) or "CPU")
    monkeypatch.setattr(ms, "set_deterministic", lambda on: deterministic.append(on))
    raw = tiny_raw(Q3, Path("unused"), Path("unused") / "ck")
    raw["context"] = {"device_target": "CPU"}
    raw["training"]["deterministic"] = True
    from mftk.config.load import load_data

    setup_process(load_data(raw, check_files=False).config)
    assert asked == ["CPU"] and deterministic == [True]


# profiler and TensorBoard settings: what mftk hands MindSpore's profiler and the TensorBoard writer, spied on
PROFILER = {"enable_profiling": True, "start_step": 1, "end_step": 2}
MONITOR_SETTINGS = {
    "profiler.enable_profiling": (True, {"profiler": {"start_step": 1, "end_step": 2}}),
    "profiler.start_step": (2, {"profiler": {**PROFILER, "end_step": 3}}),
    "profiler.end_step": (3, {"profiler": PROFILER}),
    "profiler.output_path": ("prof_here", {"profiler": PROFILER}),
    "profiler.profiler_rank": ([1], {"profiler": PROFILER}),
    "profiler.profiler_level": (2, {"profiler": PROFILER}),
    "profiler.mstx": (True, {"profiler": PROFILER}),
    "profiler.profile_memory": (True, {"profiler": PROFILER}),
    "profiler.profile_cpu": (False, {"profiler": PROFILER}),
    "profiler.with_stack": (False, {"profiler": PROFILER}),
    "monitor.tensorboard.queue_size": (7, {"monitor": {"tensorboard": {"output_dir": "tb"}}}),
}


def _monitors_seen(raw: dict, monkeypatch, d: Path) -> dict:
    """Build the run's monitors from the config and drive three steps; return what reached MindSpore's
    profiler (its arguments, when it started and stopped, where it writes) and the TensorBoard writer."""
    import mindspore.profiler as P

    from mftk.config.load import load_data
    from mftk.engine import monitor

    calls: list = []

    class FakeProfile:
        def __init__(self, **kw):
            calls.append(("profile", {k: repr(v) for k, v in kw.items() if k not in ("schedule", "on_trace_ready")}))

        def start(self):
            calls.append(("start", seen[0]))

        def step(self):
            calls.append(("step", seen[0]))

        def stop(self):
            calls.append(("stop", seen[0]))

    seen = [0]
    monkeypatch.setattr(P, "profile", FakeProfile)
    monkeypatch.setattr(P, "_ExperimentalConfig", lambda **kw: sorted((k, repr(v)) for k, v in kw.items()))
    monkeypatch.setattr(P, "tensorboard_trace_handler", lambda path: calls.append(
        ("out", Path(path).relative_to(d).as_posix())))
    writers: list = []
    import tensorboardX

    monkeypatch.setattr(tensorboardX, "SummaryWriter", lambda **kw: writers.append(kw["max_queue"]) or _NullWriter())
    monkeypatch.chdir(d)
    _, sinks = monitor.build_monitors(load_data(raw, check_files=False), rank=0, world=1, cwd=str(d))
    for step in (1, 2, 3):
        seen[0] = step
        for s in sinks:
            if hasattr(s, "on_step") and type(s).__name__ == "StepProfiler":
                s.on_step({"step": step})
    for s in sinks:
        if type(s).__name__ == "StepProfiler":
            s.close()
    return {"profiler": calls, "tensorboard": writers}


class _NullWriter:
    def __getattr__(self, name):
        return lambda *a, **k: None


@pytest.mark.parametrize("path", sorted(MONITOR_SETTINGS))
def test_monitor_setting_reaches_the_profiler_or_writer(path, tmp_path, monkeypatch):
    value, extra = MONITOR_SETTINGS[path]
    base = _merge(tiny_raw(Q3, Path("unused"), tmp_path / "ck"), extra)
    d = tmp_path / "run"
    d.mkdir()
    without = _monitors_seen(base, monkeypatch, d)
    with_it = _monitors_seen(_merge(base, _nest(path, value)), monkeypatch, d)
    assert with_it != without, f"{path}: {value!r} reaches neither the profiler nor the writer differently"


# recompute: the cells the run replays and keeps (`parallel.startup.distribute` → `recompute.apply_exclusions`,
# `apply_recompute`; applied with several processes, so the config is loaded for two)
FULL = {"mode": "full", "full_recompute_layer": ["0-1"]}
RECOMPUTE_SETTINGS = {
    "recompute.mode": ("full", {"recompute": {"full_recompute_layer": ["0-1"]}}),
    "recompute.full_recompute_layer": (["1"], {"recompute": {"mode": "select", "select_module": {"mlp": ["0"]}}}),
    "recompute.select_module": ({"mlp": ["0-1"]}, {"recompute": {"mode": "select",
                                                                  "select_module": {"self_attention": ["0"]}}}),
    "recompute.exclude_op": ({"*self_attention.linear_proj": ["0"]}, {"recompute": FULL}),
    "recompute_comm.enable": (True, {"recompute_comm": {"select_module": {"mlp": ["0"]}}}),
    "recompute_comm.select_module": ({"mlp": ["0-1"]}, {"recompute_comm": {"enable": True,
                                                                           "select_module": {"mlp": ["0"]}}}),
}


def _recomputed(raw: dict) -> tuple[list, list]:
    from mftk.config.load import load_data
    from mftk.engine.builders import build_model
    from mftk.engine.recompute import apply_exclusions, apply_recompute, excluded_cells

    config = load_data(raw, check_files=False, world_size=2).config
    model = build_model(config)
    apply_exclusions(model, config.recompute, config.recompute_comm)
    return apply_recompute(model, config.recompute, config.recompute_comm), excluded_cells(model)


@pytest.mark.parametrize("path", sorted(RECOMPUTE_SETTINGS))
def test_recompute_setting_changes_the_replayed_cells(path, tmp_path):
    value, extra = RECOMPUTE_SETTINGS[path]
    base = _merge(tiny_raw(Q3, Path("unused"), tmp_path / "ck", gbs=2), extra)
    without = _recomputed(base)
    with_it = _recomputed(_merge(base, _nest(path, value)))
    assert with_it != without, f"{path}: {value!r} replays and keeps the same cells"


def test_low_priority_dispatch_reaches_the_trainer(corpus, tmp_path, monkeypatch):
    """mftk.low_priority_dispatch: true gives the run's trainer a low-priority dispatcher (null, on this tiny
    model: a normal one; `test_dispatch.py` shows what the low priority does to the threads)."""
    from mftk.engine import host_path
    from mftk.engine.run import train

    made = []
    real = host_path.Dispatcher
    monkeypatch.setattr(host_path, "Dispatcher", lambda low_priority=False: made.append(low_priority) or real(False))
    for setting, d in ((None, tmp_path / "a"), (True, tmp_path / "b")):
        raw = tiny_raw(Q3, corpus, d / "ck", steps=1, gbs=1)
        raw["checkpoint"]["enable_save"] = False
        raw["mftk"] = {"low_priority_dispatch": setting}
        train(load(raw), output_dir=d / "out", install_signals=False, lock_save_path=False)
    assert made == [False, True]


def test_model_seq_length_is_what_each_step_counts(corpus, tmp_path, monkeypatch):
    """model.seq_length (validated equal to the data's) is the sequence length the trainer counts tokens by
    (and pipeline stages size their activations by): 16-token sequences, 16 tokens per sample in the metrics."""
    raw = tiny_raw(Q3, corpus, tmp_path / "ck", steps=1, gbs=1, seq=16)
    monkeypatch.chdir(tmp_path)
    result = _capped_train(load(raw), tmp_path, cap=3)
    rows = [json.loads(line) for line in Path(result.metrics_file).read_text().splitlines() if line.strip()]
    assert [r["tokens"] for r in rows] == [16]
