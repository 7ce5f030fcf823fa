"""GPTDataset indices and samples against the reference's test vectors (megatron-data.md §7)
and against a literal port of the reference's sample walk."""
from __future__ import annotations

import numpy as np
import pytest

from mftk.data.gpt_dataset import (GPTDataset, InMemoryDataset, SampleOptions, build_gpt_dataset,
                                   build_indices, build_sample_index, make_sample, num_epochs)
from mftk.errors import ConfigError, DataFormatError

LEN_A = [5, 9, 3, 12, 7, 1, 4, 8, 6, 10]


def corpus(lengths, base=100, eod=1):
    """Sequence k: tokens base·(k+1)+j for j < len−1, then EOD (the reference's readable scheme)."""
    return InMemoryDataset([[base * (k + 1) + j for j in range(n - 1)] + [eod] if n else []
                            for k, n in enumerate(lengths)])


def indices(lengths, num_samples, seq=8, seed=1234, extra=1, drop_last=True, docs=None):
    docs = np.arange(len(lengths), dtype=np.int32) if docs is None else docs
    return build_indices(np.array(lengths, np.int32), docs, num_samples, seq, seed, extra=extra,
                         drop_last_partial=drop_last)


def dataset(lengths, num_samples, base=100, seq=8, extra=1, drop_last=True, docs=None, **flags):
    ix = indices(lengths, num_samples, seq=seq, extra=extra, drop_last=drop_last, docs=docs)
    opts = SampleOptions(seq_length=seq, eod=1, add_extra_token=bool(extra), **flags)
    return GPTDataset(corpus(lengths, base), ix, opts)


def check(ix, epochs, sep, doc, sample, shuffle):
    assert (ix.epochs, ix.separate_final_epoch) == (epochs, sep)
    assert ix.document_index.dtype == np.int32 and ix.document_index.tolist() == doc
    assert ix.sample_index.dtype == np.int64 and ix.sample_index.tolist() == sample
    assert ix.shuffle_index.tolist() == shuffle
    assert len(ix) == len(shuffle)


def test_a2_one_epoch():
    ix = indices(LEN_A, 5)
    check(ix, 1, False, [7, 2, 9, 1, 0, 8, 4, 5, 6, 3],
          [[0, 0], [1, 0], [2, 5], [3, 3], [4, 2], [5, 5], [7, 0], [9, 3], [9, 11]],
          [7, 5, 6, 0, 4, 3, 2, 1])
    # Direct RNG check: the document index is RandomState(1234).shuffle(arange(10)).
    ref = np.arange(10)
    np.random.RandomState(1234).shuffle(ref)
    assert ix.document_index.tolist() == ref.tolist()
    assert indices(LEN_A, None).document_index.tolist() == ref.tolist()
    ds = dataset(LEN_A, 5)
    assert ds.text(0).tolist() == [403, 404, 405, 406, 407, 408, 409, 410, 1]
    assert ds.text(1).tolist() == [1, 500, 501, 502, 503, 504, 505, 1, 1]
    assert ds.text(2).tolist() == [1, 700, 701, 702, 1, 400, 401, 402, 403]


A1_DOC = [3, 3, 2, 6, 4, 5, 4, 0, 8, 8, 7, 1, 0, 9, 7, 1, 9, 2, 6, 5, 8, 1, 7, 6, 9, 5, 4, 3, 0, 2]
A1_SAMPLE = [[0, 0], [0, 8], [1, 4], [2, 0], [4, 1], [6, 1], [7, 2], [8, 5], [10, 1], [11, 1], [12, 0], [13, 3],
             [14, 1], [15, 1], [16, 0], [16, 8], [18, 3], [21, 0], [21, 8], [22, 7], [24, 3], [26, 0], [27, 1],
             [27, 9], [29, 0]]
A1_SHUFFLE = [10, 5, 8, 6, 15, 1, 4, 12, 2, 3, 13, 14, 9, 0, 11, 7, 17, 16, 21, 23, 18, 20, 19, 22]


def test_a1_three_epochs_separate_final():
    check(indices(LEN_A, 20), 3, True, A1_DOC, A1_SAMPLE, A1_SHUFFLE)
    ds = dataset(LEN_A, 20)
    assert ds.text(0).tolist() == [100, 101, 102, 103, 1, 1000, 1001, 1002, 1003]
    assert ds.text(1).tolist() == [501, 502, 503, 504, 505, 1, 100, 101, 102]
    assert ds.text(2).tolist() == [801, 802, 803, 804, 805, 806, 1, 200, 201]


def test_a4_two_epochs_shuffled_together():
    ix = indices(LEN_A, 14)
    assert (ix.epochs, ix.separate_final_epoch) == (2, False)
    assert ix.document_index.tolist() == A1_DOC[:20]
    assert ix.shuffle_index.tolist() == [10, 4, 12, 9, 1, 13, 8, 7, 3, 6, 14, 5, 11, 0, 2, 15]


def test_a5_without_extra_token():
    check(indices(LEN_A, 20, extra=0), 3, True, A1_DOC,
          [[0, 0], [0, 8], [1, 4], [1, 12], [4, 1], [6, 1], [7, 2], [8, 5], [10, 1], [11, 1], [11, 9], [13, 3],
           [14, 1], [15, 1], [15, 9], [16, 8], [18, 3], [20, 6], [21, 8], [22, 7], [24, 3], [25, 1], [27, 1],
           [27, 9], [28, 5]], A1_SHUFFLE)
    ds = dataset(LEN_A, 20, extra=0)
    assert ds.text(0).tolist() == [100, 101, 102, 103, 1, 1000, 1001, 1002]
    s = ds[0]
    assert s["input_ids"].tolist() == [100, 101, 102, 103, 1, 1000, 1001, 1002]
    assert s["labels"].tolist() == [101, 102, 103, 1, 1000, 1001, 1002, 0]
    assert s["loss_mask"][-1] == 0 and s["loss_mask"][:-1].tolist() == [1] * 7


def test_a7_other_seed_and_length():
    ix = build_indices(np.array(LEN_A), np.arange(10, dtype=np.int32), 3, 16, 42)
    assert ix.document_index.tolist() == [8, 1, 5, 0, 7, 2, 9, 4, 3, 6]
    assert ix.sample_index.tolist() == [[0, 0], [3, 0], [6, 0], [7, 6], [9, 3]]
    assert ix.shuffle_index.tolist() == [1, 0, 3, 2]


def test_a10_subset_of_documents():
    ix = indices(LEN_A, 6, docs=np.arange(2, 8, dtype=np.int32))
    assert ix.tokens_per_epoch == 35
    check(ix, 2, True, [4, 3, 7, 2, 6, 5, 2, 6, 5, 4, 7, 3],
          [[0, 0], [1, 1], [1, 9], [2, 5], [4, 2], [7, 2], [9, 5], [10, 6], [11, 6]], [1, 3, 0, 2, 5, 4, 7, 6])


def test_a8_getitem_with_every_flag():
    ds = dataset(LEN_A, 20, reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True,
                 create_attention_mask=True)
    s0 = ds[0]
    assert list(s0) == ["input_ids", "labels", "loss_mask", "position_ids", "attention_mask"]
    assert all(v.dtype == np.int32 for v in s0.values())
    assert s0["input_ids"].tolist() == [100, 101, 102, 103, 1, 1000, 1001, 1002]
    assert s0["labels"].tolist() == [101, 102, 103, 1, 1000, 1001, 1002, 1003]
    assert s0["loss_mask"].tolist() == [1, 1, 1, 1, 0, 1, 1, 1]
    assert s0["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    rows = ["01111111", "00111111", "00011111", "00001111", "00000111", "11111011", "11111001", "11111000"]
    assert s0["attention_mask"].shape == (1, 8, 8)
    assert ["".join(map(str, r)) for r in s0["attention_mask"][0]] == rows
    s1 = ds[1]
    assert s1["input_ids"].tolist() == [501, 502, 503, 504, 505, 1, 100, 101]
    assert s1["loss_mask"].tolist() == [1, 1, 1, 1, 1, 0, 1, 1]
    assert s1["position_ids"].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]


def test_a8_defaults_and_four_columns():
    s = dataset(LEN_A, 20)[0]
    assert s["position_ids"].tolist() == list(range(8))
    assert s["loss_mask"].tolist() == [1] * 8
    assert s["attention_mask"][0].tolist() == np.triu(np.ones((8, 8), int), 1).tolist()
    s4 = dataset(LEN_A, 20, create_attention_mask=False)[0]
    assert list(s4) == ["input_ids", "labels", "loss_mask", "position_ids"]


def test_a9_compressed_eod_mask_every_sample():
    ds = dataset(LEN_A, 20, reset_position_ids=True, create_compressed_eod_mask=True, eod_pad_length=4)
    assert [ds[i]["actual_seq_len"].tolist() for i in range(3)] == [[5, 8, 8, 8], [6, 8, 8, 8], [7, 8, 8, 8]]
    assert "attention_mask" not in ds[0]
    # The reference crashed on the second call without a reset flag (bug ii); 2.1.0 and we do not.
    plain = dataset(LEN_A, 20, create_compressed_eod_mask=True, eod_pad_length=4)
    assert [plain[i]["actual_seq_len"].tolist() for i in range(3)] == [[5, 8, 8, 8], [6, 8, 8, 8], [7, 8, 8, 8]]


def test_compressed_eod_mask_overflow_is_a_data_error():
    ds = dataset(LEN_A, 20, create_compressed_eod_mask=True, eod_pad_length=0)
    with pytest.raises(DataFormatError, match="eod_pad_length=0"):
        ds[0]


def test_e1_zero_length_and_long_sequences():
    lengths = [0, 5, 0, 30, 1, 0, 2]
    check(indices(lengths, 10), 3, True, [5, 3, 0, 4, 6, 2, 2, 0, 1, 1, 4, 5, 6, 3, 5, 1, 3, 4, 0, 6, 2],
          [[0, 0], [1, 8], [1, 16], [1, 24], [4, 1], [9, 2], [13, 2], [13, 10], [13, 18], [13, 26], [15, 4],
           [16, 7], [16, 15], [16, 23], [19, 0]], [5, 7, 4, 3, 8, 2, 6, 1, 0, 9, 10, 12, 13, 11])
    assert dataset(lengths, 10, base=10)[0]["input_ids"].tolist() == [22, 23, 1, 1, 70, 1, 40, 41]


def test_e2_e3_tiny_corpus():
    check(indices([3, 2], 3), 5, False, [1, 0, 1, 1, 0, 0, 0, 1, 0, 1], [[0, 0], [3, 1], [6, 1], [9, 1]], [2, 0, 1])
    e3 = indices([3, 2], None)
    assert e3.sample_index.tolist() == [[0, 0]] and len(e3) == 0


def test_e4_valid_split_padding():
    ds = dataset(LEN_A, None, base=10, seq=7, drop_last=False)
    assert len(ds) == 10 and len(indices(LEN_A, None, seq=7)) == 9
    assert ds.indices.sample_index[-3:].tolist() == [[9, 3], [9, 10], [9, 11]]
    j = int(np.flatnonzero(ds.indices.shuffle_index == 9)[0])  # read the padded sample by index order
    s = ds[j]
    assert s["input_ids"].tolist() == [50, 1, 0, 0, 0, 0, 0]
    assert s["labels"].tolist() == [1, 0, 0, 0, 0, 0, 0]
    assert s["loss_mask"].tolist() == [1, 0, 0, 0, 0, 0, 0]


def test_e5_no_sticky_loss_mask_and_offset_minus_one():
    ds = dataset([5, 9, 0], None, base=10, seq=4, drop_last=False)
    assert ds.indices.sample_index.tolist() == [[0, 0], [0, 4], [1, 3], [1, 7], [2, -1]]
    assert ds.indices.shuffle_index.tolist() == [1, 2, 3, 0]
    assert ds[2]["loss_mask"].tolist() == [1, 0, 0, 0]  # the padded sample, read first
    s3 = ds[3]
    assert s3["input_ids"].tolist() == [10, 11, 12, 13] and s3["labels"].tolist() == [11, 12, 13, 1]
    assert s3["loss_mask"].tolist() == [1, 1, 1, 1]  # MF 2.1.0; the older commit gave [1,0,0,0]


def _walk(sizes, doc_index, seq, epochs, tokens, drop_last, extra):
    """Literal port of the reference's C++ build_sample_idx loop (the second implementation)."""
    if drop_last:
        count = (epochs * tokens - extra) // seq
    else:
        count = int(np.ceil(np.float32(epochs * tokens - extra) / np.float32(seq)))
    out = [[0, 0]]
    di, off = 0, 0
    for _ in range(count):
        rem = seq + extra
        while True:
            dl = sizes[doc_index[di]] - off
            rem -= dl
            if rem <= 0:
                off += rem + dl - extra
                break
            if di == len(doc_index) - 1:
                off = sizes[doc_index[di]] - extra
                break
            di += 1
            off = 0
        out.append([di, off])
    return out


@pytest.mark.parametrize("case", range(150))
def test_sample_index_matches_literal_walk(case):
    rng = np.random.RandomState(case)
    n = rng.randint(1, 12)
    sizes = rng.randint(0, 25, size=n)
    if sizes.sum() < 2:
        sizes[0] = 2
    seq = int(rng.randint(1, 12))
    extra = int(rng.randint(0, 2))
    drop = bool(rng.randint(0, 2))
    epochs = int(rng.randint(1, 4))
    doc_index = np.tile(np.arange(n, dtype=np.int32), epochs)
    rng.shuffle(doc_index)
    tokens = int(sizes.sum())
    got = build_sample_index(sizes, doc_index, seq, epochs, tokens, drop, extra)
    assert got.tolist() == _walk(sizes.tolist(), doc_index.tolist(), seq, epochs, tokens, drop, extra)


def test_num_epochs_closed_form_matches_loop():
    for tokens in (1, 7, 65, 1000):
        for ns in (0, 1, 5, 20, 333):
            for seq in (1, 8, 100):
                e, t = 1, tokens
                while t < ns * seq + 1:
                    e, t = e + 1, t + tokens
                assert num_epochs(tokens, ns, seq, 1) == e


def test_samples_without_extra_token_and_pad_equal_token():
    # pad equal to a real token: zeroed in tokens and labels, loss masked there only (no stickiness).
    text = np.array([5, 7, 5, 9, 1], dtype=np.int64)
    s = make_sample(text, SampleOptions(seq_length=4, eod=1, pad=7))
    assert s["input_ids"].tolist() == [5, 0, 5, 9] and s["labels"].tolist() == [0, 5, 9, 1]
    assert s["loss_mask"].tolist() == [0, 1, 1, 1]


def test_build_gpt_dataset_errors():
    opts = SampleOptions(seq_length=8)
    with pytest.raises(DataFormatError, match="holds 0 tokens"):
        build_gpt_dataset(InMemoryDataset([[], []]), (0, 2), 10, opts, 1234, name="empty")
    with pytest.raises(ConfigError, match="seq_length=8 needs 9 tokens"):
        build_gpt_dataset(corpus([3, 2]), (0, 2), 10, opts, 1234, name="tiny")
    with pytest.raises(IndexError):
        dataset(LEN_A, 5).text(8)


def test_indexed_file_round_trip(tmp_path):
    """The same vectors through a real .bin/.idx pair."""
    from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder

    mem = corpus(LEN_A)
    builder = IndexedDatasetBuilder(str(tmp_path / "corpA"), np.int32)
    for k in range(len(mem)):
        builder.add_document([np.asarray(mem.get(k))])
    builder.finalize()
    ds = build_gpt_dataset(IndexedDataset(str(tmp_path / "corpA")), (0, 10), 20,
                           SampleOptions(seq_length=8, eod=1), 1234)
    assert ds.indices.sample_index.tolist() == A1_SAMPLE
    assert ds[2]["input_ids"].tolist() == [801, 802, 803, 804, 805, 806, 1, 200]
