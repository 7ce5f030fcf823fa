"""build_train_dataset end to end: blends B1–B4, sharding, resume position, show_samples, bad configs."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.data import blend
from mftk.data.gpt_dataset import InMemoryDataset, SampleOptions, build_gpt_dataset
from mftk.data.loader import build_train_dataset, collate, shard_indices, show_samples
from mftk.derive import skip_micro_batches
from mftk.errors import ConfigError, DataFormatError, InputError
from tests.helpers.config import dataloader

LEN_A = [5, 9, 3, 12, 7, 1, 4, 8, 6, 10]
LEN_B = [20, 3, 11, 6, 9, 15]


def corpus(lengths, base, step):
    return InMemoryDataset([[base + step * k + j for j in range(n - 1)] + [1] for k, n in enumerate(lengths)])


# Corpus A: 100·(k+1)+j; corpus B: 5000+100·k+j; every sequence ends in EOD 1 (§7).
CORPORA = {"corpA": corpus(LEN_A, 100, 100), "corpB": corpus(LEN_B, 5000, 100)}


def raw_section(data_path, sizes, **config):
    cfg = {"data_path": data_path, "split": "1, 0, 0", "seq_length": 8, "eod": 1, **config}
    return {"type": "BlendedMegatronDatasetDataLoader", "datasets_type": "GPTDataset", "sizes": sizes,
            "config": cfg}


def section(data_path, sizes, *, shuffle=False, **config):
    """The typed section (the config rules validate it before the loader sees it)."""
    raw = raw_section(data_path, sizes, **config)
    raw["shuffle"] = shuffle
    return dataloader(raw)


def build(loader_section, gbs=1, lbs=1, dp=1, rank=0, **kw):
    return build_train_dataset(loader_section, global_batch_size=gbs, local_batch_size=lbs, dp_size=dp,
                               dp_rank=rank, open_dataset=CORPORA.__getitem__, **kw)


def test_b1_single_weighted_prefix():
    data = build(section(["1", "corpA"], [20, 0, 0]))
    ds = data.dataset
    assert isinstance(ds, blend.BlendedDataset) and len(ds) == 21
    gpt = ds.datasets[0]
    assert len(gpt) == 24 and gpt.indices.epochs == 3 and gpt.indices.separate_final_epoch
    assert ds.dataset_index.tolist() == [0] * 21 and ds.dataset_sample_index.tolist() == list(range(21))
    assert [ds[i]["input_ids"].tolist() for i in range(3)] == [
        [100, 101, 102, 103, 1, 1000, 1001, 1002], [501, 502, 503, 504, 505, 1, 100, 101],
        [801, 802, 803, 804, 805, 806, 1, 200]]
    assert any("3 epochs will be used" in w for w in data.warnings)


def test_b1_unweighted_single_prefix_is_plain():
    ds = build(section(["corpA"], [20, 0, 0])).dataset
    assert isinstance(ds, blend.SingleDataset) and len(ds) == 24
    assert ds.datasets[0].indices.sample_index.shape == (25, 2)


def test_b2_two_weighted_prefixes():
    data = build(section(["0.3", "corpA", "0.7", "corpB"], [30, 0, 0]))
    ds = data.dataset
    assert [s.num_samples for s in data.sources] == [10, 22] and len(ds) == 32
    assert ds.weights == [0.3, 0.7]
    assert ds.dataset_index.tolist()[:8] == [1, 0, 1, 1, 0, 1, 1, 0]
    a, b = ds.datasets
    assert (a.indices.epochs, len(a)) == (2, 16)
    assert (b.indices.epochs, b.indices.separate_final_epoch, len(b)) == (3, False, 23)
    assert b.indices.document_index.tolist() == [5, 3, 5, 4, 1, 2, 0, 2, 4, 1, 1, 3, 2, 4, 0, 5, 0, 3]
    assert b.indices.shuffle_index.tolist() == [8, 17, 21, 1, 4, 20, 19, 13, 14, 9, 0, 11, 7, 3, 10, 6, 2, 5,
                                                12, 16, 18, 15, 22]
    ids = [ds[i]["input_ids"].tolist() for i in range(4)]
    assert ids[0] == list(range(5005, 5013)) and ids[2] == list(range(5005, 5013))
    assert ids[1] == [1, 500, 501, 502, 503, 504, 505, 1] and ids[3] == list(range(5002, 5010))


def test_b3_unweighted_blend():
    ds = build(section(["corpA", "corpB"], [10, 0, 0])).dataset
    assert [len(d) for d in ds.datasets] == [8, 7] and len(ds) == 10
    assert ds.dataset_index.tolist() == [0, 1] * 5
    assert ds.dataset_sample_index.tolist() == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]


def test_b4_exhaustive_blend():
    opts = SampleOptions(seq_length=8, eod=1)
    gpts = [build_gpt_dataset(CORPORA[p], (0, len(CORPORA[p])), None, opts, 1234) for p in ("corpA", "corpB")]
    ds = blend.BlendedDataset(gpts, None, None)
    assert len(ds) == 15 and ds.dataset_index.tolist() == [0, 1] * 7 + [0]


def test_sharding_vector():
    assert [shard_indices(17, 4, k).tolist() for k in range(4)] == [
        [0, 4, 8, 12, 16], [1, 5, 9, 13, 0], [2, 6, 10, 14, 1], [3, 7, 11, 15, 2]]


def test_each_step_consumes_consecutive_blended_samples():
    """GBS 4 = dp 2 × lbs 1 × accum 2: step j reads samples 4j..4j+3, rank k those ≡ k mod 2."""
    sec = section(["0.3", "corpA", "0.7", "corpB"], [17, 0, 0])
    loaders = [build(sec, gbs=4, lbs=1, dp=2, rank=r).loader for r in range(2)]
    assert [len(lo) for lo in loaders] == [8, 8]  # 16 used samples / 2 ranks / lbs 1
    for step in range(4):
        seen = sorted(int(i) for lo in loaders for b in (2 * step, 2 * step + 1) for i in lo.batch_ids(b))
        assert seen == list(range(4 * step, 4 * step + 4))
    assert loaders[1].sample_ids.tolist() == [1, 3, 5, 7, 9, 11, 13, 15]


def test_batches_and_resume_position():
    data = build(section(["1", "corpA"], [20, 0, 0], create_attention_mask=False), gbs=4, lbs=2, dp=2, rank=1)
    lo = data.loader
    assert lo.sample_ids.tolist() == [1, 3, 5, 7, 9, 11, 13, 15, 17, 19] and len(lo) == 5
    b = lo.batch(1)
    assert set(b) == {"input_ids", "labels", "loss_mask", "position_ids"}
    assert b["input_ids"].shape == (2, 8) and b["input_ids"].dtype == np.int32
    assert b["input_ids"].tolist() == [data.dataset[5]["input_ids"].tolist(), data.dataset[7]["input_ids"].tolist()]
    # consumed_samples=8 → 8 // (2·2) = 2 micro-batches already read on each rank.
    assert skip_micro_batches(8, 2, 2) == 2 and lo.start_batch(8) == 2
    it = lo.iter_batches(lo.start_batch(8))
    assert next(it)["input_ids"].tolist() == lo.batch(2)["input_ids"].tolist()
    assert lo.start_batch(20) == 0  # past one epoch: wraps
    assert len(list(iter(lo))) == 5


def test_compressed_mask_accumulates_over_batch():
    sec = section(["corpA"], [20, 0, 0], reset_position_ids=True, create_compressed_eod_mask=True,
                  eod_pad_length=4)
    data = build(sec, gbs=2, lbs=2)
    # §4.6: each sample is offset by the previous sample's last value. Samples 0 and 1 are
    # [5,8,8,8] and [6,8,8,8] (A9), so the rule gives [14,16,16,16]; §7 A9 prints [13,16,16,16],
    # which no offset of [6,8,8,8] can give (16−13 ≠ 8−6) — reported as a reference inconsistency.
    assert data.loader.batch(0)["actual_seq_len"].tolist() == [[5, 8, 8, 8], [14, 16, 16, 16]]
    single = collate([{"x": np.zeros(2)}])
    assert single["x"].shape == (1, 2)


def test_show_samples_records():
    data = build(section(["0.3", "corpA", "0.7", "corpB"], [30, 0, 0]), gbs=2, lbs=1, dp=2, rank=1)
    recs = show_samples(data, 2, start=1)
    assert [(r.blended_index, r.dataset, r.dataset_sample) for r in recs] == [(3, 1, 2), (5, 1, 3)]
    assert recs[0].input_ids == list(range(5002, 5010)) and recs[0].prefix == "corpB"
    assert set(recs[0].to_json()) == {"dataset", "dataset_sample", "input_ids", "labels", "loss_mask",
                                      "position_ids"}
    with pytest.raises(InputError, match="outside"):
        show_samples(data, 1, start=100)


def test_shuffle_true_is_seeded_and_warned():
    sec = section(["corpA"], [16, 0, 0], shuffle=True)
    a, b = build(sec), build(sec)
    assert a.loader.sample_ids.tolist() == b.loader.sample_ids.tolist() != list(range(16))
    assert any("shuffle" in w for w in a.warnings)


def test_mock_trains_on_random_tokens():
    sec = section(None, [8, 0, 0], mock=True)
    data = build_train_dataset(sec, global_batch_size=2, local_batch_size=2)
    assert data.loader.batch(0)["input_ids"].shape == (2, 8)


def test_settings_wrong_for_the_files_are_config_errors():
    """What only the files can tell (the config rules check the rest: tests/config/test_rules.py)."""
    with pytest.raises(ConfigError, match="seq_length=100 needs 101 tokens") as e:
        build(section(["corpA"], [20, 0, 0], seq_length=100), gbs=2)
    assert e.value.problems[0].path == "train_dataset.dataloader.config.seq_length"


def test_max_epochs_turns_repetition_into_error():
    with pytest.raises(ConfigError, match="3 epochs will be used"):
        build(section(["corpA"], [20, 0, 0]), max_epochs=1)


def test_zero_token_dataset():
    with pytest.raises(DataFormatError, match="holds 0 tokens"):
        build_train_dataset(section(["empty"], [4, 0, 0]), global_batch_size=1, local_batch_size=1,
                            open_dataset=lambda p: InMemoryDataset([[], []]))


def test_missing_and_truncated_files(tmp_path):
    sec = section([str(tmp_path / "nothing")], [4, 0, 0])
    with pytest.raises(InputError, match="no such file"):
        build_train_dataset(sec, global_batch_size=1, local_batch_size=1)
    _write(tmp_path / "corpA")
    bin_path = tmp_path / "corpA.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-4])
    with pytest.raises(DataFormatError, match="truncated"):
        build_train_dataset(section([str(tmp_path / "corpA")], [4, 0, 0]), global_batch_size=1,
                            local_batch_size=1)


def _write(prefix):
    from mftk.data.indexed import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(str(prefix), np.int32)
    for k in range(len(LEN_A)):
        builder.add_document([np.asarray(CORPORA["corpA"].get(k))])
    builder.finalize()


def test_real_files_and_default_cache(tmp_path):
    """The loader on a real .bin/.idx pair; the index cache lands next to the data."""
    prefix = str(tmp_path / "corpA")
    _write(prefix)
    sec = section(["1", prefix], [20, 0, 0])
    first = build_train_dataset(sec, global_batch_size=1, local_batch_size=1)
    assert any(n.startswith("saved indices") for n in first.notes)
    assert len(list((tmp_path / "corpA" / "cache" / "GPTDataset_indices").iterdir())) == 4
    again = build_train_dataset(sec, global_batch_size=1, local_batch_size=1)
    assert any(n.startswith("loaded indices") for n in again.notes)
    assert again.loader.batch(1)["input_ids"].tolist() == [[501, 502, 503, 504, 505, 1, 100, 101]]
