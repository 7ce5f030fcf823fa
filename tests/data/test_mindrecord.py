"""MindRecord path: `preprocess(format="mindrecord")` → `type: MindDataset` loader.

Independent references: the token stream is rebuilt from the `tokenizers` library directly
(encode each text, append EOD, concatenate, cut into seq_length + 1 pieces); the files are read
back with MindSpore's own `FileReader`; sharding is compared with MindSpore's own
`MindDataset(num_shards, shard_id, shuffle=False)`.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from mftk.data.loader import build_train_dataset, show_samples
from mftk.data.preprocess import preprocess
from mftk.errors import ConfigError, DataFormatError, InputError
from tests.helpers.config import dataloader
from tests.helpers.data import CORPUS

pytestmark = pytest.mark.engine  # imports mindspore

SEQ = 16
TEXTS = CORPUS[:12]


def _corpus(path, texts=TEXTS):
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts), encoding="utf-8")
    return path


def _expected_stream(tokenizer_file, texts=TEXTS, eod=0):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    stream = []
    for t in texts:
        stream += tok.encode(t).ids + [eod]
    return np.array(stream, dtype=np.int64)


def _read_with_mindspore(path):
    from mindspore.mindrecord import FileReader

    reader = FileReader(str(path))
    rows = [np.asarray(item["input_ids"]) for item in reader.get_next()]
    reader.close()
    return rows


@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer_file):
    d = tmp_path_factory.mktemp("mr")
    summary = preprocess([str(_corpus(d / "c.jsonl"))], str(d / "out" / "wiki"), tokenizer_file, append_eod=True,
                         format="mindrecord", seq_length=SEQ)
    return d, summary


def _section(files, **config):
    return dataloader({"type": "MindDataset", "dataset_files": [str(f) for f in files],
                       "config": {"seq_length": SEQ, **config}})


def test_round_trip_token_stream(written, tokenizer_file):
    d, summary = written
    path = d / "out" / "wiki_text.mindrecord"
    stream = _expected_stream(tokenizer_file)
    n = len(stream) // (SEQ + 1)
    rows = _read_with_mindspore(path)
    assert len(rows) == n and all(r.dtype == np.int32 and len(r) == SEQ + 1 for r in rows)
    np.testing.assert_array_equal(np.concatenate(rows), stream[: n * (SEQ + 1)])
    out = summary.sources[0].outputs[0]
    assert (out.prefix, out.sequences, out.documents) == (str(path), n, len(TEXTS))
    assert out.tokens == n * (SEQ + 1) and out.dropped_tokens == len(stream) - n * (SEQ + 1)
    assert summary.format == "mindrecord" and summary.dtype == "int32"
    assert summary.data_path_block() == f"type: MindDataset\ndataset_files:\n  - '{path}'"
    assert sorted(p.name for p in (d / "out").iterdir()) == ["wiki_text.mindrecord", "wiki_text.mindrecord.db"]


def test_loader_samples(written, tokenizer_file):
    d, _ = written
    stream = _expected_stream(tokenizer_file)
    data = build_train_dataset(_section([d / "out"]), global_batch_size=2, local_batch_size=2)
    n = len(stream) // (SEQ + 1)
    assert len(data.dataset) == n and len(data.loader) == n // 2 and data.warnings == []
    batch = data.loader.batch(1)
    assert sorted(batch) == ["input_ids", "labels", "loss_mask", "position_ids"]
    for row, k in enumerate((2, 3)):
        piece = stream[k * (SEQ + 1):(k + 1) * (SEQ + 1)]
        np.testing.assert_array_equal(batch["input_ids"][row], piece[:-1])
        np.testing.assert_array_equal(batch["labels"][row], piece[1:])
        np.testing.assert_array_equal(batch["loss_mask"][row], np.ones(SEQ))
        np.testing.assert_array_equal(batch["position_ids"][row], np.arange(SEQ))
    rec = show_samples(data, 1, start=3)[0]
    assert (rec.dataset, rec.dataset_sample, rec.prefix) == (0, 3, str(d / "out" / "wiki_text.mindrecord"))


def test_eod_mask_loss_and_pad(written, tokenizer_file):
    d, _ = written
    stream = _expected_stream(tokenizer_file)
    n = len(stream) // (SEQ + 1)
    pieces = stream[: n * (SEQ + 1)].reshape(n, SEQ + 1)
    k = int(np.flatnonzero((pieces[:, :-1] == 0).any(axis=1))[0])  # the first sample holding an EOD
    piece = pieces[k]
    pad = int(piece[3])  # pretend a real token is the pad id, to see both masks at work
    data = build_train_dataset(_section([d / "out"], eod=0, eod_mask_loss=True, pad=pad),
                               global_batch_size=1, local_batch_size=1)
    want = np.ones(SEQ, np.int32)
    want[piece[:-1] == 0] = 0
    want[piece[1:] == pad] = 0
    assert (want == 0).sum() >= 2
    np.testing.assert_array_equal(data.dataset[k]["loss_mask"], want)


@pytest.mark.parametrize("dp", [2, 3])
def test_sharding_matches_mindspore(written, dp):
    import mindspore.dataset as msds

    d, _ = written
    path = d / "out" / "wiki_text.mindrecord"
    for rank in range(dp):
        data = build_train_dataset(_section([path]), global_batch_size=dp, local_batch_size=1, dp_size=dp,
                                   dp_rank=rank)
        ours = [data.dataset[int(i)]["labels"][-1] for i in data.loader.sample_ids]
        ms = msds.MindDataset([str(path)], columns_list=["input_ids"], shuffle=False, num_shards=dp, shard_id=rank)
        theirs = [int(x["input_ids"][-1]) for x in ms.create_dict_iterator(output_numpy=True)]
        assert ours == theirs
    assert data.loader.start_batch(consumed_samples=2 * dp) == 2


def test_several_files_in_given_order(tmp_path, tokenizer_file):
    _corpus(tmp_path / "a.jsonl", TEXTS[:6])
    _corpus(tmp_path / "b.jsonl", TEXTS[6:])
    summary = preprocess([f"a={tmp_path / 'a.jsonl'}", f"b={tmp_path / 'b.jsonl'}"], str(tmp_path / "m.mindrecord"),
                         tokenizer_file, append_eod=True, format="mindrecord", seq_length=SEQ)
    a, b = (tmp_path / "m_a_text.mindrecord", tmp_path / "m_b_text.mindrecord")
    assert [s.outputs[0].prefix for s in summary.sources] == [str(a), str(b)]
    data = build_train_dataset(_section([b, a]), global_batch_size=1, local_batch_size=1)
    rows = _read_with_mindspore(b) + _read_with_mindspore(a)
    assert len(data.dataset) == len(rows)
    for k in (0, len(rows) - 1):
        np.testing.assert_array_equal(data.dataset.text(k), rows[k])
    assert data.dataset.source(len(_read_with_mindspore(b))) == (1, 0)
    assert [s.prefix for s in data.sources] == [str(b), str(a)]


def test_seq_length_from_model_or_data(written):
    d, _ = written
    sec = dataloader({"type": "MindDataset", "dataset_files": [str(d / "out")]})
    data = build_train_dataset(sec, global_batch_size=1, local_batch_size=1, seq_length=SEQ)
    assert data.dataset.options.seq_length == SEQ and data.warnings == []
    data = build_train_dataset(sec, global_batch_size=1, local_batch_size=1)
    assert data.dataset.options.seq_length == SEQ and "taken from the data" in data.warnings[0]
    with pytest.raises(ConfigError, match=r"model.seq_length: .*\(seq_length 16\), but seq_length 8 needs 9"):
        build_train_dataset(sec, global_batch_size=1, local_batch_size=1, seq_length=8)


# -- bad inputs: loader ------------------------------------------------------------------------
def test_missing_file_names_yaml_path(tmp_path):
    with pytest.raises(ConfigError) as e:
        build_train_dataset(_section([tmp_path / "nope.mindrecord"]), global_batch_size=1, local_batch_size=1)
    assert e.value.problems[0].path == "train_dataset.dataloader.dataset_files[0]"
    assert "file not found" in e.value.message
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"dataset_files\[0\]: no .mindrecord file under"):
        build_train_dataset(_section([tmp_path / "empty"]), global_batch_size=1, local_batch_size=1)


def test_not_a_mindrecord_file(tmp_path, written):
    bad = tmp_path / "x.mindrecord"
    bad.write_text('{"text": "a jsonl file with the wrong name"}\n' * 4)
    with pytest.raises(DataFormatError, match="not a MindRecord file"):
        build_train_dataset(_section([bad]), global_batch_size=1, local_batch_size=1)
    d, _ = written
    lone = tmp_path / "lone.mindrecord"
    lone.write_bytes((d / "out" / "wiki_text.mindrecord").read_bytes()[:4096])  # no .db next to it
    with pytest.raises(DataFormatError, match="lone.mindrecord.db is missing"):
        build_train_dataset(_section([lone]), global_batch_size=1, local_batch_size=1)
    (tmp_path / "lone.mindrecord.db").write_bytes((d / "out" / "wiki_text.mindrecord.db").read_bytes())
    with pytest.raises(DataFormatError, match="lone.mindrecord: MindSpore cannot (open|read) it"):
        build_train_dataset(_section([lone]), global_batch_size=1, local_batch_size=1)  # truncated


def test_seq_length_mismatch(written):
    d, _ = written
    with pytest.raises(ConfigError) as e:
        build_train_dataset(_section([d / "out"], seq_length=32), global_batch_size=1, local_batch_size=1)
    p = e.value.problems[0]
    assert p.path == "train_dataset.dataloader.config.seq_length"
    assert "samples of 17 tokens (seq_length 16), but seq_length 32 needs 33" in p.message
    assert "set seq_length: 16" in p.hint and "--seq-length 32" in p.hint


def test_file_without_input_ids(tmp_path):
    from mindspore.mindrecord import FileWriter

    w = FileWriter(str(tmp_path / "img.mindrecord"), shard_num=1)
    w.add_schema({"label": {"type": "int32"}}, "other")
    w.write_raw_data([{"label": 1}])
    w.commit()
    with pytest.raises(DataFormatError, match="no input_ids column"):
        build_train_dataset(_section([tmp_path / "img.mindrecord"]), global_batch_size=1, local_batch_size=1)


# -- bad inputs: preprocess --------------------------------------------------------------------
def test_preprocess_argument_errors(tmp_path, tokenizer_file):
    src = [str(_corpus(tmp_path / "c.jsonl"))]
    out = str(tmp_path / "o")
    with pytest.raises(InputError, match="needs --seq-length"):
        preprocess(src, out, tokenizer_file, format="mindrecord")
    with pytest.raises(InputError, match="only to --format mindrecord"):
        preprocess(src, out, tokenizer_file, seq_length=8)
    with pytest.raises(InputError, match="--format must be"):
        preprocess(src, out, tokenizer_file, format="tfrecord")
    with pytest.raises(InputError, match="--resume is not available"):
        preprocess(src, out, tokenizer_file, format="mindrecord", seq_length=8, resume=True)
    assert list(tmp_path.iterdir()) == [tmp_path / "c.jsonl"]


def test_too_few_tokens_leaves_nothing(tmp_path, tokenizer_file):
    src = [str(_corpus(tmp_path / "c.jsonl", ["hi"]))]
    with pytest.raises(DataFormatError, match="fewer than one sample of seq_length \\+ 1 = 1001"):
        preprocess(src, str(tmp_path / "o"), tokenizer_file, format="mindrecord", seq_length=1000)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_failed_run_leaves_no_output(tmp_path, tokenizer_file):
    good = _corpus(tmp_path / "a.jsonl")
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"text": "fine"}\nnot json\n')
    with pytest.raises(DataFormatError, match="b.jsonl:2"):
        preprocess([str(good), str(bad)], str(tmp_path / "o"), tokenizer_file, format="mindrecord", seq_length=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


@pytest.mark.parametrize("where", ["dataset_files", "dataset_dir"])
def test_the_config_selects_mindrecord_and_keeps_a_partial_last_batch(written, tokenizer_file, where):
    """From the YAML: `type: MindDataset` with its files (or their directory) is what the run's loader reads, and
    `drop_remainder: false` keeps the last partial micro-batch (n samples, 3 per micro-batch)."""
    from pathlib import Path

    import yaml

    from mftk.config.load import load_data
    from mftk.engine.builders import build_data

    d, _ = written
    stream = _expected_stream(tokenizer_file)
    n = len(stream) // (SEQ + 1)
    lbs = next(b for b in (3, 4, 5, 7) if n % b)  # a partial last micro-batch
    raw = yaml.safe_load((Path(__file__).resolve().parents[2] / "templates" / "qwen3_tiny.yaml").read_text())
    raw["model"]["seq_length"] = SEQ
    raw["training"].update(local_batch_size=lbs, global_batch_size=lbs)
    raw["train_dataset"]["drop_remainder"] = False
    files = {"dataset_files": [str(d / "out" / "wiki_text.mindrecord")], "dataset_dir": str(d / "out")}
    raw["train_dataset"]["dataloader"] = {"type": "MindDataset", where: files[where], "config": {"seq_length": SEQ}}
    data = build_data(load_data(raw).config, dp=1)
    assert len(data.loader) == -(-n // lbs)  # ceil: the partial micro-batch is kept
    first = next(data.loader.iter_batches(0))["input_ids"]
    np.testing.assert_array_equal(first[0], stream[:SEQ])
