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
    if lazy:
        return GPTModel(build_spec(cfg))
    model = build(cfg, seed=config.training.seed)
    total = sum(int(np.prod(p.shape)) for p in model.get_parameters())
    train = sum(int(np.prod(p.shape)) for p in model.trainable_params())
    log.info("Got total parameters: %s, trainable parameters: %s", count_exact(total), count_exact(train))
    return model


def param_shapes(model: Any) -> dict[str, tuple[int, ...]]:
    return {p.name: tuple(p.shape) for p in model.get_parameters()}


def build_data(config: Any, *, dp: int, dp_rank: int = 0) -> Any:
    """This data rank's loader over the blended training samples (`mftk.data.loader`)."""
    from mftk.data.loader import build_train_dataset

    from mftk.derive import accumulation_steps

    tr = config.training
    balance = config.train_dataset.balance_enabled and dp > 1  # the rules allow it with a static batch only
    data = build_train_dataset(config.train_dataset.dataloader, global_batch_size=tr.global_batch_size,
                               local_batch_size=tr.local_batch_size, dp_size=dp, dp_rank=dp_rank,
                               drop_remainder=config.train_dataset.drop_remainder,
                               seq_length=config.model.seq_length,
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


def build_optimizer(config: Any, model: Any, sharding: Any = None, dist: Any = None) -> Any:
    """AdamW (or Muon) over the trainable parameters; under FSDP over this rank's rows of each (sharded states)."""
    from mftk.engine.optim import AdamW, decide_weight_decay

    o = config.optimizer
    params = list(model.trainable_params())
    decisions = decide_weight_decay([(p.name, tuple(p.shape)) for p in params], float(o.weight_decay),
                                    include=o.weight_decay_include, exclude=o.weight_decay_exclude)
    for d in decisions:
        log.debug(d.log_line())
    log.info(weight_decay_summary(decisions))
    arrays = [p.asnumpy() for p in params]
    if sharding is not None:
        arrays = [sharding.local(i, a) for i, a in enumerate(arrays)]
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
