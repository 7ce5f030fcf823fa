"""The pieces of a run, each built from the validated config: model, data, optimizer, LR schedule.

`engine/run.py` calls these in order; each logs what the reference logs when it builds the same piece.
"""
from __future__ import annotations

import logging
from typing import Any

import attrs
import numpy as np

from mftk.errors import ConfigError, Problem
from mftk.units import count_exact

log = logging.getLogger("mftk.train")


def model_config(config: Any) -> Any:
    """``model:`` with ``track_max_attention_logit`` switched on when a ``MaxLogitsMonitor`` callback asks
    for tracking (the reference's trainer sets it on the model config the same way)."""
    from mftk.config.sections import tracking_requested

    cfg = config.model
    if tracking_requested(config) and not getattr(cfg, "track_max_attention_logit", False):
        cfg = attrs.evolve(cfg, track_max_attention_logit=True)
    return cfg


def build_model(config: Any, *, lazy: bool = False) -> Any:
    """The family's model, initialised from ``training.seed``; ``lazy``: names and shapes only (a dry run)."""
    from mftk.engine.models.build import build_model as build
    from mftk.engine.models.gpt import GPTModel
    from mftk.engine.spec import build_spec

    cfg = model_config(config)
    model = GPTModel(build_spec(cfg)) if lazy else build(cfg, seed=config.training.seed)
    if config.lora_config is not None:  # adapters on the built model, base frozen (`engine.lora`)
        from mftk.engine.lora import apply_lora

        report = apply_lora(model, config.lora_config, seed=config.training.seed, init=not lazy)
        _check_muon_adapters(config, model)
        if not lazy:
            log.info("LoRA: adapters on %d modules (rank %d, alpha %s, scaling %s); trainable parameters: %d of %d",
                     len(report.modules), config.lora_config.lora_rank, config.lora_config.lora_alpha,
                     config.lora_config.lora_alpha / config.lora_config.lora_rank, report.trainable_params,
                     report.total_params)
    if lazy:
        return model
    total = sum(int(np.prod(p.shape)) for p in model.get_parameters())
    train = sum(int(np.prod(p.shape)) for p in model.trainable_params())
    log.info("Got total parameters: %s, trainable parameters: %s", count_exact(total), count_exact(train))
    return model


def _check_muon_adapters(config: Any, model: Any) -> None:
    """Muon orthogonalises 2-D weights and the experts' 3-D ``weight1``/``weight2`` only: the experts' 3-D
    adapters must go to its AdamW fallback (``optimizer.adamw_include``), or the first update would fail
    (the reference raises the same ValueError there, 2.1 §3)."""
    import fnmatch

    from mftk.config.optimizer_muon import adamw_globs

    o = config.optimizer
    if o.type != "Muon":
        return
    include = adamw_globs(o.adamw_include)
    bad = [p.name for p in model.trainable_params()
           if len(p.shape) == 3 and not any(fnmatch.fnmatchcase(p.name, g) for g in include)]
    if bad:
        raise ConfigError(message=f"Muon only supports 3-D weights of grouped experts, got {bad[0]}",
                          problems=[Problem(path="optimizer.adamw_include", value=o.adamw_include,
                                            message=f"{len(bad)} expert LoRA tensors would be orthogonalised by Muon "
                                            f"({bad[0]}, …)", hint="add '*_lora_*' to optimizer.adamw_include "
                                            "(keep '*word_embeddings*' and '*output_layer*'), or leave the experts "
                                            "out of lora_config.target_modules")])


def build_data(config: Any, *, dp: int, dp_rank: int = 0) -> Any:
    """This data rank's loader over the blended training samples (`mftk.data.loader`)."""
    from mftk.data.loader import build_train_dataset

    from mftk.derive import accumulation_steps

    tr = config.training
    balance = config.train_dataset.balance_enabled and dp > 1  # the rules allow it with a static batch only
    data = build_train_dataset(config.train_dataset.dataloader, global_batch_size=tr.global_batch_size,
                               local_batch_size=tr.local_batch_size, dp_size=dp, dp_rank=dp_rank,
                               drop_remainder=config.train_dataset.drop_remainder,
                               seq_length=config.model.seq_length, vocab_size=config.model.vocab_size,
                               balance_accum=accumulation_steps(tr.global_batch_size, tr.local_batch_size, dp)[0]
                               if balance else 0)
    for w in data.warnings:
        log.warning("data: %s", w)
    if not len(data.loader):
        raise ConfigError(message="the training data yields no micro-batch",
                          problems=[Problem(path="train_dataset.dataloader.sizes", message="no micro-batch of data",
                                            hint="add data or lower training.local_batch_size")])
    log.info("Building dataset from config... %d samples, %d micro-batches per epoch", data.train_samples,
             len(data.loader))
    return data


def build_optimizer(config: Any, model: Any, dist: Any = None, *, on_device: bool = False) -> Any:
    """AdamW (or Muon) over the trainable parameters; under FSDP they hold this rank's rows (sharded states).
    ``on_device`` (`device_optim.chosen`): the device-resident AdamW over the Parameters themselves."""
    from mftk.engine.optim import AdamW, decide_weight_decay

    o = config.optimizer
    params = list(model.trainable_params())
    decisions = decide_weight_decay([(p.name, tuple(p.shape)) for p in params], float(o.weight_decay),
                                    include=o.weight_decay_include, exclude=o.weight_decay_exclude)
    for d in decisions:
        log.debug(d.log_line())
    log.info(weight_decay_summary(decisions))
    if on_device:
        from mftk.engine.device_optim import DeviceAdamW

        return DeviceAdamW([p.name for p in params], params, decisions, betas=o.betas, eps=o.eps)
    arrays = [p.asnumpy() for p in params]
    if o.type == "Muon":
        from mftk.engine.muon import build_muon

        opt = build_muon(config, model, [p.name for p in params], arrays, decisions, [tuple(p.shape) for p in params],
                         dist=dist)
        log.info("Muon: %d parameters orthogonalised, %d by the AdamW fallback", len(opt.muon_names()),
                 len(params) - len(opt.muon_names()))
        return opt
    return AdamW([p.name for p in params], arrays, decisions, betas=o.betas, eps=o.eps)


def weight_decay_summary(decisions: Any) -> str:
    """One line for the per-parameter decisions (each is logged at debug level, ``MFTK_DEBUG=1``)."""
    from collections import Counter

    groups = Counter((d.weight_decay, d.reason) for d in decisions)
    parts = [f"{wd:.4f} on {n} parameter{'s' if n != 1 else ''} ({reason})"
             for (wd, reason), n in sorted(groups.items(), key=lambda kv: (-kv[0][0], kv[0][1]))]
    return "Weight decay: " + ", ".join(parts) + "; each parameter's decision is logged with MFTK_DEBUG=1"


def build_schedule(config: Any) -> Any:
    from mftk.engine.schedule import build_schedule as build

    return build(config.lr_scheduler, config.training.steps)
