"""What one training step plans, times and reduces: the records every gradient path and the `Trainer` share.

`reduce_step` is the one place a step's logged values are reduced (over micro-batches, in float64, in
micro-batch order); `StepOutput.across` is the one place they are reduced over ranks (a mean over dp×cp,
or the pipeline stages' sum). The model's named outputs (`GPTModel.finish`: DeepSeek-V4's ``indexer_loss``)
ride along by name, so nothing here knows a model family.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import numpy as np

from mftk.derive import accumulation_steps, rampup_gbs


@attrs.frozen
class BatchPlan:
    global_batch_size: int
    accumulation: int


@attrs.frozen
class BatchSchedule:
    """Static gbs, or ``rampup_batch_size: [start, increment, samples]`` up to gbs (reference §2.8)."""

    global_batch_size: int
    local_batch_size: int
    dp: int = 1
    rampup: tuple[int, int, int] | None = None

    def at(self, consumed_samples: int) -> BatchPlan:
        gbs = self.global_batch_size
        if self.rampup is not None:
            start, inc, samples = self.rampup
            gbs = rampup_gbs(consumed_samples, start, inc, samples, self.global_batch_size)
        return BatchPlan(gbs, accumulation_steps(gbs, self.local_batch_size, self.dp)[0] or 1)


@attrs.frozen
class NanPolicy:
    """``use_skip_step_on_nan``: drop the update of a step whose loss or grad norm is not finite, until
    ``max_consecutive_skipped_steps`` (> 0) steps in a row were dropped (0: no limit); otherwise a NaN stops the run."""

    skip: bool
    max_consecutive: int


@attrs.frozen
class StepPlan:
    """What every step of a run does, from its config: the batch plan, the length, clipping, the NaN policy
    and what the metrics count by."""

    batches: BatchSchedule
    total_steps: int
    max_norm: float
    nan_policy: NanPolicy = NanPolicy(skip=False, max_consecutive=0)
    flops_per_sample: float = 0.0
    seq_length: int = 0
    show_mtp: bool = True
    epoch_micro_batches: int = 0


class StopFlag:
    """Set by a signal handler; the loop saves and raises TrainingInterrupted at the next step end."""

    def __init__(self) -> None:
        self.signal_name: str | None = None

    def request(self, name: str) -> None:
        self.signal_name = name

    @property
    def requested(self) -> bool:
        return self.signal_name is not None


class PhaseTimer:
    """Seconds spent per phase within one step (data, forward_backward, optimizer, save)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, phase: str, seconds: float) -> None:
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds


@attrs.frozen
class StepOutput:
    loss: float
    aux: list[float]  # per MoE layer, mean over micro-batches (α-free)
    mtp: list[float]  # per MTP depth, mean over micro-batches (× λ/D)
    tokens_per_expert: np.ndarray | None  # (n_moe, E) summed over micro-batches
    local_losses: list[float]
    named: dict[str, float] = attrs.field(factory=dict)  # the model's named outputs (`GPTModel.finish`)

    def across(self, reduce: Callable[[Sequence[float]], np.ndarray],
               counts: Callable[[np.ndarray], np.ndarray] | None = None) -> "StepOutput":
        """The logged values reduced over ranks by ``reduce`` (`DistContext.mean`, or `stage_sum` between
        pipeline stages), the expert counts by ``counts``; this rank's micro-batch losses kept."""
        na, nm = len(self.aux), len(self.mtp)
        v = reduce([self.loss, *self.aux, *self.mtp, *self.named.values()])
        tpe = self.tokens_per_expert
        return StepOutput(loss=float(v[0]), aux=[float(x) for x in v[1:1 + na]],
                          mtp=[float(x) for x in v[1 + na:1 + na + nm]],
                          tokens_per_expert=counts(tpe) if counts is not None and tpe is not None else tpe,
                          local_losses=self.local_losses,
                          named={k: float(x) for k, x in zip(self.named, v[1 + na + nm:])})


def reduce_step(rows: np.ndarray, n_aux: int, names: Sequence[str], counts: np.ndarray | None,
                scale: float) -> StepOutput:
    """The step's `StepOutput` of its micro-batches' values, one row each: ``[loss, *aux, *mtp, *named]``.
    Losses and named outputs are float64 means, aux and MTP terms summed in micro-batch order, then
    divided; ``local_losses`` are the losses × ``scale`` (1/accumulation), as the monitors log them."""
    rows = np.asarray(rows, np.float64)
    n, nn = rows.shape[0], len(names)
    losses = [float(x) for x in rows[:, 0]]
    sums = np.zeros(rows.shape[1] - 1 - nn, np.float64)
    for row in rows[:, 1:rows.shape[1] - nn]:
        sums = sums + row
    named = {k: float(np.mean([float(x) for x in rows[:, rows.shape[1] - nn + i]])) for i, k in enumerate(names)}
    return StepOutput(loss=float(np.mean(losses)), aux=list(sums[:n_aux] / n), mtp=list(sums[n_aux:] / n),
                      tokens_per_expert=counts, local_losses=[x * scale for x in losses], named=named)


def output_row(outputs: Any) -> tuple[list[Any], int, tuple[str, ...], tuple]:
    """One micro-batch's model outputs (`GPTModel.construct`) as its row of logged values (tensors, in the
    `reduce_step` order), the number of aux terms, the named outputs' names and the expert counts."""
    _, lm, aux, mtp, tpe, named = outputs
    return [lm, *aux, *mtp, *named.values()], len(aux), tuple(named), tpe
