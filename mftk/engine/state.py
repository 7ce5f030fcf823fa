"""Training state ↔ numpy dicts with the reference's names, plus mftk's extra state.

- model file: every parameter and buffer by its reference name (``decoder.layers.0...``);
- optimizer file: ``adam_m.*``, ``adam_v.*``, ``global_step`` (and ``main_param.*`` for low-precision
  parameters only, as the reference writes them);
- extra state (``mftk-state-*.json``, which the reference ignores): what an exact resume needs
  beyond that — the data position and batch plan it was computed with, the numpy RNG, the NaN-skip
  counter. The run's resolved config goes next to it, in ``mftk-config.json`` (`mftk.ckpt.run_config`).
"""
from __future__ import annotations

from typing import Any

import attrs
import numpy as np

EXTRA_KIND = "train"


@attrs.define
class TrainState:
    """What the loop advances: the absolute step, samples consumed, epoch, NaN-skip bookkeeping."""

    global_step: int = 0
    consumed_samples: int = 0
    epoch: int = 0
    consecutive_skipped: int = 0
    skipped_steps: int = 0
    micro_batches_read: int = 0  # by this rank since the start of the first epoch (the epoch count follows)
    common_extra: dict = attrs.field(factory=dict)  # common.json keys of another release, kept for the next save


def model_tensors(model: Any) -> dict[str, np.ndarray]:
    """Reference-named numpy copy of every model parameter and buffer."""
    return {p.name: p.asnumpy().copy() for p in model.get_parameters()}


def trainable(model: Any) -> list[Any]:
    return list(model.trainable_params())


def write_masters(model: Any, params: list[Any], masters: list[np.ndarray]) -> None:
    """Copy the optimizer's fp32 masters into the model's parameters (cast to their dtype), in place.

    In place (``copy_``), not ``set_data``: a block compiled by ``GPTModel.jit_blocks`` keeps reading
    the storage it was compiled against, so ``set_data`` would leave it training on stale weights
    (tests/engine/test_state.py). ``copy_`` from a zero-copy view is also 6× faster than
    ``set_data(Tensor(a))`` on a 29 M model (10 vs 60 ms).
    """
    import mindspore as ms
    from mindspore import Tensor

    for p, a in zip(params, masters):
        a = np.ascontiguousarray(a, np.float32)
        p.copy_(Tensor.from_numpy(a) if p.dtype == ms.float32 else Tensor(a, dtype=p.dtype))


def share_masters(params: list[Any], optimizer: Any) -> bool:
    """Make every fp32 parameter's storage the optimizer's fp32 master (a view of its flat buffer), so the
    update writes the weights and no second fp32 copy exists (4 B/param less); ``write_masters`` is then a
    no-op. True when every parameter shares (``optimizer.shares_weights``); False leaves them as they were."""
    import mindspore as ms
    from mindspore import Tensor

    if any(p.dtype != ms.float32 for p in params):
        return False
    views = [optimizer.view(optimizer.master, i) for i in range(len(params))]
    if any(not v.flags["C_CONTIGUOUS"] for v in views):
        return False
    for p, v in zip(params, views):
        p.set_data(Tensor.from_numpy(v))
    shared = all(np.shares_memory(p.asnumpy(), v) for p, v in zip(params, views))
    optimizer.shares_weights = shared
    return shared


def low_precision(params: list[Any]) -> bool:
    """True when some parameter is not fp32, so the optimizer must save ``main_param.*`` masters."""
    import mindspore as ms

    return any(p.dtype != ms.float32 for p in params)


def extra_state(state: TrainState, *, global_batch_size: int, dp: int, local_batch_size: int) -> dict[str, Any]:
    """mftk's additions for an exact resume (never put in common.json: the reference refuses extra keys)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "kind": EXTRA_KIND,
        "global_step": state.global_step,
        "consumed_samples": state.consumed_samples,
        "epoch": state.epoch,
        "consecutive_skipped": state.consecutive_skipped,
        "skipped_steps": state.skipped_steps,
        "global_batch_size": global_batch_size,
        "data_parallel": dp,
        "local_batch_size": local_batch_size,
        "numpy_rng": {"kind": kind, "keys": keys, "pos": int(pos), "has_gauss": int(has_gauss),
                      "cached_gaussian": float(cached)},
    }


def restore_rng(extra: dict[str, Any]) -> bool:
    """Restore the numpy RNG from the extra state; False when it holds none."""
    rng = extra.get("numpy_rng") if extra else None
    if not rng:
        return False
    np.random.set_state((rng["kind"], np.asarray(rng["keys"], np.uint32), int(rng["pos"]),
                         int(rng["has_gauss"]), float(rng["cached_gaussian"])))
    return True
