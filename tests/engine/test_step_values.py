"""The step's logged values: `step.reduce_step` over micro-batches and `StepOutput.across` over ranks (hand
figures), the model's named outputs (DeepSeek-V4's ``indexer_loss`` against its layers' own losses in
float64; none for Qwen3), and a `Trainer` logging a named output it knows nothing about (any `GradientPath`)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from mftk.engine.step import BatchSchedule, StepOutput, StepPlan, reduce_step

pytestmark = pytest.mark.engine


def test_reduce_step_means_the_micro_batches():
    rows = np.array([[2.0, 0.1, 0.3, 0.5],   # loss, aux (1 MoE layer), mtp (1 depth), named "x"
                     [4.0, 0.3, 0.5, 1.5]])
    out = reduce_step(rows, n_aux=1, names=("x",), counts=None, scale=0.5)
    assert out.loss == 3.0 and out.local_losses == [1.0, 2.0]
    assert out.aux == pytest.approx([0.2]) and out.mtp == pytest.approx([0.4]) and out.named == {"x": 1.0}


def test_across_reduces_every_value_in_its_place():
    out = StepOutput(loss=1.0, aux=[2.0, 3.0], mtp=[4.0], tokens_per_expert=np.ones((1, 2)), local_losses=[0.5],
                     named={"indexer_loss": 5.0})
    sent = []
    got = out.across(lambda v: sent.append(list(v)) or np.asarray(v) * 10, lambda c: c + 1)
    assert sent == [[1.0, 2.0, 3.0, 4.0, 5.0]]
    assert (got.loss, got.aux, got.mtp, got.named) == (10.0, [20.0, 30.0], [40.0], {"indexer_loss": 50.0})
    assert got.tokens_per_expert.tolist() == [[2.0, 2.0]] and got.local_losses == [0.5]


def _batch(vocab: int):
    from mindspore import Tensor

    ids = np.random.default_rng(3).integers(1, vocab, (2, 32))
    return Tensor(ids.astype(np.int32)), Tensor(np.roll(ids, -1, 1).astype(np.int32))


def test_deepseek_v4_names_its_indexer_loss_and_qwen3_names_nothing(tiny_dsv4):
    from mftk.engine.models.build import build_model
    from tests.helpers.models import train_model

    qwen3 = train_model()
    assert qwen3(*_batch(256))[5] == {}
    cfg = tiny_dsv4(dsa_indexer_loss_coeff=0.5)
    model = build_model(cfg, seed=8)
    model.set_train(True)
    named = model(*_batch(cfg.vocab_size))[5]
    per_layer = [float(c.indexer_loss.asnumpy()) for c in model.indexer_cells() if c.indexer_loss is not None]
    assert per_layer and set(named) == {"indexer_loss"}
    assert float(named["indexer_loss"].asnumpy()) == pytest.approx(np.mean(per_layer, dtype=np.float64) * 0.5,
                                                                   rel=1e-6)


class _Path:
    """A `GradientPath` of fixed values: the loop needs nothing else of a strategy."""

    holds_loss = True
    dist = None
    params: list = []

    def __init__(self) -> None:
        self.model = SimpleNamespace(update_expert_bias=lambda counts: None)
        self.optimizer = SimpleNamespace(global_step=0)
        self.calls: list[str] = []

    def accumulate(self, plan, state, timer):
        self.calls.append("accumulate")
        return np.array([3.0, 4.0]), StepOutput(loss=2.0, aux=[], mtp=[], tokens_per_expert=None, local_losses=[2.0],
                                                named={"made_up_loss": 0.25})

    def norm(self, grads):
        self.calls.append("norm")
        return float(np.linalg.norm(grads))

    def clip(self, grads, factor):
        self.calls.append(f"clip {factor:.1f}")

    def update(self, grads, lr, timer):
        self.calls.append(f"update {lr}")
        self.optimizer.global_step += 1

    def host_grads(self, grads):
        return grads

    def close(self):
        self.calls.append("close")


def test_the_loop_logs_a_named_output_of_any_path():
    from mftk.engine.state import TrainState
    from mftk.engine.trainer import Trainer
    from mftk.engine.trainer_build import TrainerParts
    from mftk.progress import RecordingSink

    path, sink = _Path(), RecordingSink()
    tr = Trainer(TrainerParts(path=path, schedule=lambda step: 0.1 * (step + 1), sinks=[sink],
                              plan=StepPlan(BatchSchedule(1, 1), total_steps=1, max_norm=2.5)))
    tr.fit(TrainState())
    assert path.calls == ["accumulate", "norm", "clip 0.5", "update 0.1", "close"]  # |(3, 4)| = 5 → × 2.5/5
    step = sink.steps[0]
    assert step["made_up_loss"] == 0.25 and step["grad_norm"] == 5.0 and step["lr"] == pytest.approx(0.2)
