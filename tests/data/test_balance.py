"""Attention-load balancing across data-parallel ranks (`train_dataset.balance_enabled`, mftk.data.balance)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from mftk.data.balance import assign, sample_load
from mftk.data.gpt_dataset import InMemoryDataset
from mftk.data.loader import build_train_dataset
from tests.helpers.config import dataloader

# documents of very different lengths, so balancing has work to do (every one ends in EOD 1)
LENGTHS = [30, 2, 3, 25, 4, 2, 28, 3, 2, 31, 5, 2, 27, 3, 4, 26]
CORPUS = InMemoryDataset([[100 * (k + 1) + j for j in range(n - 1)] + [1] for k, n in enumerate(LENGTHS)])


def test_sample_load_is_the_sum_of_squared_document_lengths():
    # ends at 3, 5 and the padding length 8: documents of 3, 2 and 3 tokens
    assert sample_load(np.array([3, 5, 8, 8, 8])) == 3 * 3 + 2 * 2 + 3 * 3
    assert sample_load(np.array([8, 8])) == 64


@pytest.mark.parametrize("dp, per_rank", [(2, 1), (2, 3), (3, 2), (4, 4)])
def test_assign_gives_each_rank_its_count_covers_every_item_and_balances(dp, per_rank):
    rng = np.random.default_rng(dp * 10 + per_rank)
    loads = [float(x) for x in rng.integers(1, 1000, dp * per_rank)]
    plan = assign(loads, dp, per_rank)
    assert [len(p) for p in plan] == [per_rank] * dp
    assert sorted(i for p in plan for i in p) == list(range(dp * per_rank))
    assert assign(loads, dp, per_rank) == plan  # deterministic: every rank computes the same plan
    best = min(max(sum(loads[i] for i in part) for part in parts) for parts in _partitions_of(list(range(dp * per_rank)), dp, per_rank)) \
        if dp * per_rank <= 8 else None
    worst = max(sum(loads[i] for i in p) for p in plan)
    if best is not None:  # the greedy plan is within 4/3 of the optimum (LPT bound), checked by brute force
        assert worst <= 4 / 3 * best + 1e-9


def _partitions_of(items, dp, per_rank):
    """Every split of ``items`` into dp groups of per_rank (brute force, small inputs only)."""
    if dp == 1:
        yield [items]
        return
    for first in itertools.combinations(items[1:], per_rank - 1):
        group = [items[0], *first]
        rest = [i for i in items if i not in group]
        for tail in _partitions_of(rest, dp - 1, per_rank):
            yield [group, *tail]


def _loaders(dp, accum, balance):
    sec = dataloader({"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": [32, 0, 0],
                      "config": {"data_path": ["corpus"], "split": "1, 0, 0", "seq_length": 8, "eod": 1,
                                 "create_compressed_eod_mask": True, "eod_pad_length": 8}})
    return [build_train_dataset(sec, global_batch_size=dp * accum, local_batch_size=1, dp_size=dp, dp_rank=r,
                                open_dataset=lambda p: CORPUS, balance_accum=accum if balance else 0).loader
            for r in range(dp)]


def _steps(loaders, accum, steps, start=0):
    """[step][rank] → list of the micro-batches' input_ids (as tuples)."""
    its = [lo.iter_batches(start) for lo in loaders]
    return [[[tuple(next(it)["input_ids"].ravel()) for _ in range(accum)] for it in its] for _ in range(steps)]


def test_each_step_reads_the_same_micro_batches_only_moved_between_ranks_and_better_balanced():
    dp, accum, steps = 2, 3, 4
    base, bal = _steps(_loaders(dp, accum, False), accum, steps), _steps(_loaders(dp, accum, True), accum, steps)
    moved = 0
    for s in range(steps):
        assert sorted(mb for r in base[s] for mb in r) == sorted(mb for r in bal[s] for mb in r)
        assert all(len(r) == accum for r in bal[s])
        moved += base[s] != bal[s]
    assert moved > 0  # the balancing did something on this corpus
    lo = _loaders(dp, accum, True)[0]

    def load_of(mb):  # the load of a micro-batch, from its tokens (EOD = 1) — independent of sample_load
        ids, docs, n = list(mb), [], 0
        for t in ids:
            n += 1
            if t == 1:
                docs.append(n)
                n = 0
        return sum(d * d for d in docs + ([n] if n else []))

    for s in range(steps):
        spread_base = max(sum(map(load_of, r)) for r in base[s]) - min(sum(map(load_of, r)) for r in base[s])
        spread_bal = max(sum(map(load_of, r)) for r in bal[s]) - min(sum(map(load_of, r)) for r in bal[s])
        assert spread_bal <= spread_base
    assert lo.balance_accum == accum


def test_resume_position_gives_the_same_balanced_steps():
    dp, accum = 2, 2
    full = _steps(_loaders(dp, accum, True), accum, 5)
    loaders = _loaders(dp, accum, True)
    start = loaders[0].start_batch(3 * dp * accum)  # consumed samples after 3 steps (local batch 1)
    assert _steps(loaders, accum, 2, start=start) == full[3:5]


def test_the_loaded_config_turns_balancing_on(tmp_path):
    """The proving test of ``train_dataset.balance_enabled`` (one process, cheap enough to run under its
    forgetting mutant): the two data ranks' loaders that `engine.builders.build_data` makes from the loaded
    config read each step's micro-batches moved between the ranks (the same ones as without it). The dp2 run's
    losses: tests/commands/test_train_distributed.py."""
    import copy

    from mftk.config.load import load_data
    from mftk.engine.builders import build_data
    from tests.helpers.tiny import tiny_raw, write_corpus

    raw = tiny_raw("qwen3_tiny.yaml", write_corpus(tmp_path / "corpus" / "tiny_text_document"), tmp_path / "ckpt",
                   steps=3, gbs=8)  # local batch 1: 4 micro-batches per rank and step on 2 ranks
    raw["train_dataset"]["dataloader"]["config"]["create_compressed_eod_mask"] = True
    raw["parallelism"]["data_parallel_shard"] = 1

    def steps(balance: bool):
        raw["train_dataset"]["balance_enabled"] = balance
        config = load_data(copy.deepcopy(raw), world_size=2).config
        return _steps([build_data(config, dp=2, dp_rank=r).loader for r in range(2)], 4, 3)

    base, bal = steps(False), steps(True)
    for s in range(3):
        assert sorted(mb for r in base[s] for mb in r) == sorted(mb for r in bal[s] for mb in r)
    assert base != bal
