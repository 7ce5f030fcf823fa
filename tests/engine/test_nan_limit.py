"""`Trainer.nan_guard` with the reference's limit rule (mindformers-2.1.md §1.4): with
N = max_consecutive_skipped_steps > 0 the run stops once `N <= consecutive skips` (N=1: at the first NaN
step); N = 0 means no limit; without skipping mftk stops at the first non-finite step (the reference
would apply it and continue)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from mftk.engine.state import TrainState
from mftk.engine.step import NanPolicy
from mftk.engine.trainer import Trainer
from mftk.errors import TrainingError

pytestmark = pytest.mark.engine


def guard(policy: NanPolicy, losses: list[float]) -> tuple[list[bool], TrainState, TrainingError | None]:
    """Feed one loss per step (grad norm 1.0) through nan_guard, advancing the step as the loop does."""
    fake, state, applied = SimpleNamespace(plan=SimpleNamespace(nan_policy=policy)), TrainState(), []
    for loss in losses:
        try:
            applied.append(Trainer.nan_guard(fake, state, loss, 1.0))
        except TrainingError as exc:
            return applied, state, exc
        state.global_step += 1
    return applied, state, None


def reference_stop_step(limit: int, losses: list[float]) -> int | None:
    """The reference's counter, written out: consecutive += 1 on a skip, reset on a finite step; stop when
    0 < limit <= consecutive (checked right after the increment)."""
    consecutive = 0
    for step, loss in enumerate(losses, start=1):
        if math.isfinite(loss):
            consecutive = 0
            continue
        consecutive += 1
        if 0 < limit <= consecutive:
            return step
    return None


NAN = math.nan
PATTERN = [1.0, NAN, NAN, 1.0, NAN, NAN, NAN, 1.0]


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 4])
def test_limit_matches_the_reference_rule(limit):
    applied, state, exc = guard(NanPolicy(skip=True, max_consecutive=limit), PATTERN)
    want = reference_stop_step(limit, PATTERN)
    assert (exc.step if exc else None) == want
    if want is None:  # 0 = no limit (and 4 > the longest run of 3): every NaN step skipped, the rest applied
        assert applied == [math.isfinite(x) for x in PATTERN] and state.skipped_steps == 5


def test_limit_one_stops_at_the_first_nan_step():
    _, state, exc = guard(NanPolicy(skip=True, max_consecutive=1), [1.0, NAN])
    assert exc.step == 2 and state.skipped_steps == 1
    assert "reaching training.max_consecutive_skipped_steps=1" in exc.message


def test_without_skipping_mftk_stops_and_says_why():
    applied, _, exc = guard(NanPolicy(skip=False, max_consecutive=0), [1.0, 1.0, NAN])
    assert applied == [True, True] and exc.step == 3
    assert "MindSpore Transformers would apply it, log nan and continue" in exc.message
    assert "use_skip_step_on_nan: true" in exc.hint


def test_the_config_sets_skipping_and_its_limit():
    """training.use_skip_step_on_nan and max_consecutive_skipped_steps reach the trainer's policy from the YAML:
    skipping with a limit of 2 stops where the reference's counter does (step 3 of PATTERN)."""
    from pathlib import Path

    import yaml

    from mftk.config.load import load_data
    from mftk.engine.trainer_build import nan_policy_from

    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "templates" / "qwen3_tiny.yaml").read_text())
    raw["training"].update(use_skip_step_on_nan=True, max_consecutive_skipped_steps=2)
    policy = nan_policy_from(load_data(raw, check_files=False).config)
    applied, state, exc = guard(policy, PATTERN)
    assert exc is not None and exc.step == reference_stop_step(2, PATTERN) == 3
    assert applied == [True, False] and state.skipped_steps == 2
