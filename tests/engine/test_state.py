"""write_masters in place, and the trainer's compiled blocks (jit_blocks) training like eager PyNative."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from tests.helpers.models import train_model as _model


def _train(jit: bool, steps: int = 3):
    from mftk.engine.optim import AdamW, decide_weight_decay
    from mftk.engine.state import TrainState
    from mftk.engine.step import BatchSchedule, StepPlan
    from mftk.engine.trainer import Trainer
    from mftk.engine.trainer_build import TrainerParts, build_path

    model = _model()
    params = list(model.trainable_params())
    opt = AdamW([p.name for p in params], [p.asnumpy() for p in params],
                decide_weight_decay([(p.name, tuple(p.shape)) for p in params], 0.1))
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 256, (2, 32)).astype(np.int32)
    batch = {"input_ids": ids, "labels": np.roll(ids, -1, 1)}
    path = build_path(model, opt, itertools.repeat(batch), jit_blocks=jit)
    trainer = Trainer(TrainerParts(path=path, schedule=lambda step: 3e-3,
                                   plan=StepPlan(BatchSchedule(2, 2), total_steps=steps, max_norm=1.0)))
    state = TrainState()
    losses = [trainer.train_step(state)["loss"] for _ in range(steps)]
    return losses, [p.asnumpy() for p in params], opt


def test_write_masters_updates_parameters_in_place():
    from mftk.engine.state import write_masters

    model = _model()
    params = list(model.trainable_params())
    before = [id(p) for p in params]
    new = [np.full(p.shape, 0.25 * (i + 1), np.float32) for i, p in enumerate(params)]
    write_masters(model, params, new)
    assert [id(p) for p in model.trainable_params()] == before
    for p, want in zip(params, new):
        np.testing.assert_array_equal(p.asnumpy(), want)
    new[0][...] = 7.0  # the parameter holds a copy, not a view of the optimizer's buffer
    assert float(params[0].asnumpy().max()) == 0.25


def test_jit_blocks_train_exactly_like_eager():
    """With ``set_data`` the compiled blocks kept the first weights (losses 4.87 vs 4.89 at step 2)."""
    eager_losses, eager_params, _ = _train(jit=False)
    jit_losses, jit_params, opt = _train(jit=True)
    assert eager_losses[-1] < eager_losses[0]
    np.testing.assert_allclose(jit_losses, eager_losses, rtol=1e-6)
    for a, b, m in zip(jit_params, eager_params, opt.masters()):
        # not elementwise: where a gradient is ~0, Adam turns rounding-level differences into ±lr steps
        assert float(np.mean(np.abs(a - b))) < 1e-6
        np.testing.assert_array_equal(a, m)  # the model holds exactly the optimizer's masters


@pytest.mark.parametrize("dist, minimum, want", [(None, 0, True), (None, 10 ** 9, False), ("dp", 0, False)])
def test_auto_jit_blocks_only_for_large_single_process_models(monkeypatch, dist, minimum, want):
    from mftk import derive
    from mftk.engine import trainer_build

    monkeypatch.setattr(derive, "JIT_MIN_PARAMS", minimum)
    assert trainer_build.auto_jit_blocks(_model(), dist) is want
