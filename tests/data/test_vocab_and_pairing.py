"""Bad input, round three (issue 35, "Data"): a foreign vocabulary, a .bin from another corpus of the same size,
compressed inputs other than gzip, and an output prefix that is (or collides with) a directory."""
from __future__ import annotations

import bz2
import json
import lzma
import shutil

import numpy as np
import pytest
import yaml

from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder
from mftk.data.preprocess import preprocess
from mftk.data.sidecar import sidecar_path
from mftk.errors import ConfigError, DataFormatError, InputError
from tests.helpers.config import dataloader, template_dict
from tests.helpers.data import read_pair
from tests.helpers.hostile import assert_clean_failure, flat, mftk

GOOD = b'{"text": "The quick brown fox jumps over the lazy dog."}\n{"text": "Pack my box with five dozen jugs."}\n'


def _pair(prefix, docs, vocab_size, dtype=np.uint16):
    with IndexedDatasetBuilder(prefix, dtype, vocab_size=vocab_size) as b:
        for d in docs:
            b.add_document([np.asarray(d, dtype=dtype)])
        b.finalize()
    return str(prefix)


def _foreign(tmp_path):
    """The issue's case: data from an 8,192-token vocabulary (ids up to 8191) for a 4,096-token model."""
    rng = np.random.default_rng(0)
    docs = [rng.integers(0, 4000, size=150).tolist() for _ in range(40)]
    docs[7][42] = 8191
    return _pair(tmp_path / "foreign_text_document", docs, 8192)


def _yaml(tmp_path, prefix, vocab_size=4096):
    data = template_dict()
    data["model"]["vocab_size"] = vocab_size
    data["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", prefix]
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


# ---------------------------------------------------------------- vocabulary


def test_preprocess_records_the_vocabulary_and_the_largest_id(tmp_path, tokenizer_file):
    from tokenizers import Tokenizer

    (tmp_path / "in.jsonl").write_bytes(GOOD * 5)
    preprocess([str(tmp_path / "in.jsonl")], str(tmp_path / "o"), tokenizer_file, append_eod=True)
    prefix = tmp_path / "o_text_document"
    meta = json.loads(sidecar_path(prefix).read_text())
    _, sequences, _ = read_pair(prefix)  # the test helper's own reader
    assert meta["vocab_size"] == Tokenizer.from_file(str(tokenizer_file)).get_vocab_size(with_added_tokens=True)
    assert meta["max_id"] == max(max(s) for s in sequences)
    ds = IndexedDataset(prefix)
    assert (ds.vocab_size, ds.max_id) == (meta["vocab_size"], meta["max_id"])


def test_merge_records_the_largest_id_of_all_inputs(tmp_path):
    a = _pair(tmp_path / "a", [[1, 2, 3]], 500)
    b = _pair(tmp_path / "b", [[4, 499, 6]], 500)
    sidecar_path(b).unlink()  # a pair without a record: its largest id is read from the tokens
    preprocess([a, b], str(tmp_path / "m"), None, merge_only=True)
    assert json.loads(sidecar_path(tmp_path / "m").read_text())["max_id"] == 499


def test_validate_config_names_the_file_and_both_numbers(tmp_path):
    prefix = _foreign(tmp_path)
    path, _ = _yaml(tmp_path, prefix)
    r = mftk("validate-config", str(path))
    assert_clean_failure(r, 1, f"{prefix}.bin holds token ids up to 8191, but model.vocab_size is 4096",
                         "vocabulary of 8192")
    ok, _ = _yaml(tmp_path, prefix, vocab_size=8192)
    assert mftk("validate-config", str(ok)).returncode == 0


def test_the_loader_refuses_the_data_before_the_first_step(tmp_path):
    prefix = _foreign(tmp_path)
    _, data = _yaml(tmp_path, prefix)
    from mftk.data.loader import build_train_dataset

    with pytest.raises(ConfigError, match="holds token ids up to 8191, but model.vocab_size is 4096"):
        build_train_dataset(dataloader(data["train_dataset"]["dataloader"]), global_batch_size=8,
                            local_batch_size=8, use_cache=False, vocab_size=4096)


def test_a_sample_past_the_vocabulary_is_an_error_naming_file_and_sample(tmp_path):
    """Without a record (a pair from another tool), each sample read is checked: never a Gather error."""
    prefix = _foreign(tmp_path)
    sidecar_path(prefix).unlink()
    _, data = _yaml(tmp_path, prefix)
    from mftk.data.loader import build_train_dataset

    train = build_train_dataset(dataloader(data["train_dataset"]["dataloader"]), global_batch_size=8,
                                local_batch_size=8, use_cache=False, vocab_size=4096)
    with pytest.raises(DataFormatError) as e:
        for i in range(len(train.loader)):
            train.loader.batch(i)
    assert f"{prefix}.bin: sample " in e.value.message and "token id 8191, but model.vocab_size is 4096" in \
        e.value.message


def test_train_stops_with_the_message_not_a_kernel_error(tmp_path):
    prefix = _foreign(tmp_path)
    path, _ = _yaml(tmp_path, prefix)
    r = mftk("train", str(path), "--set", f"checkpoint.save_path={tmp_path / 'ck'}", "--set", "training.steps=1",
             "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(r, 1, "holds token ids up to 8191, but model.vocab_size is 4096")
    assert "Gather" not in r.stdout + r.stderr


# ---------------------------------------------------------------- pairing


def test_a_bin_from_a_reordered_corpus_of_the_same_size_is_refused(tmp_path):
    docs = [[i % 250 + 1] * (5 + i) for i in range(30)]
    a = _pair(tmp_path / "a", docs, 300)
    b = _pair(tmp_path / "b", docs[::-1], 300)
    assert (tmp_path / "a.bin").stat().st_size == (tmp_path / "b.bin").stat().st_size
    IndexedDataset(a)  # the pair as written
    shutil.copy(tmp_path / "b.bin", tmp_path / "a.bin")
    with pytest.raises(DataFormatError) as e:
        IndexedDataset(a)
    assert f"{a}.bin does not belong with {a}.idx" in e.value.message


def test_validate_config_names_both_files_of_a_mismatched_pair(tmp_path):
    docs = [[i % 250 + 1] * (50 + i) for i in range(40)]
    a = _pair(tmp_path / "a_text_document", docs, 300)
    _pair(tmp_path / "b_text_document", docs[::-1], 300)
    shutil.copy(tmp_path / "b_text_document.bin", tmp_path / "a_text_document.bin")
    path, _ = _yaml(tmp_path, a, vocab_size=300)
    r = mftk("validate-config", str(path))
    assert_clean_failure(r, 1, f"{a}.bin does not belong with {a}.idx")


def test_a_sidecar_for_another_index_is_refused(tmp_path):
    a = _pair(tmp_path / "a", [[1, 2, 3], [4, 5]], 300)
    keep = sidecar_path(a).read_text()
    _pair(tmp_path / "a", [[1, 2], [3, 4, 5]], 300)  # rewritten: same sizes, other index
    sidecar_path(a).write_text(keep)
    with pytest.raises(DataFormatError, match="describes another a.idx"):
        IndexedDataset(a)


def test_a_pair_without_a_sidecar_still_opens(tmp_path):
    a = _pair(tmp_path / "a", [[1, 2, 3]], 300)
    sidecar_path(a).unlink()
    ds = IndexedDataset(a)
    assert ds.max_id is None and ds.vocab_size is None and ds.get(0).tolist() == [1, 2, 3]


# ---------------------------------------------------------------- compressed inputs


@pytest.mark.parametrize("suffix,compress", [(".xz", lzma.compress), (".bz2", bz2.compress)])
def test_xz_and_bzip2_inputs_are_read_as_gzip_is(tmp_path, tokenizer_file, suffix, compress):
    (tmp_path / "plain.jsonl").write_bytes(GOOD * 50)
    (tmp_path / f"packed.jsonl{suffix}").write_bytes(compress(GOOD * 50))
    preprocess([str(tmp_path / "plain.jsonl")], str(tmp_path / "p"), tokenizer_file, append_eod=True)
    preprocess([str(tmp_path / f"packed.jsonl{suffix}")], str(tmp_path / "c"), tokenizer_file, append_eod=True)
    assert read_pair(tmp_path / "c_text_document") == read_pair(tmp_path / "p_text_document")


def test_a_json_array_in_xz(tmp_path, tokenizer_file):
    (tmp_path / "a.json.xz").write_bytes(lzma.compress(b'[{"text": "abc"}, {"text": "de"}]'))
    s = preprocess([str(tmp_path / "a.json.xz")], str(tmp_path / "o"), tokenizer_file)
    assert s.sources[0].documents == 2


def test_a_truncated_xz_input_is_a_clean_error(tmp_path, tokenizer_file):
    data = lzma.compress(GOOD * 1000)
    (tmp_path / "t.jsonl.xz").write_bytes(data[: len(data) // 2])
    with pytest.raises(DataFormatError, match="truncated or corrupt|cannot read compressed"):
        preprocess([str(tmp_path / "t.jsonl.xz")], str(tmp_path / "o"), tokenizer_file)


def test_a_zstd_input_is_refused_with_the_fix(tmp_path, tokenizer_file):
    # a zstd frame: magic 28 B5 2F FD (RFC 8878 §3.1.1), then bytes that would be "invalid UTF-8" as text
    (tmp_path / "z.jsonl.zst").write_bytes(b"\x28\xb5\x2f\xfd\x04\x58\x81\x00\x00\xff\xfe")
    r = mftk("preprocess", "-i", str(tmp_path / "z.jsonl.zst"), "-o", str(tmp_path / "o"), "-t", str(tokenizer_file))
    assert_clean_failure(r, 1, "z.jsonl.zst: zstd-compressed, which mftk does not read", "zstd -d")
    assert "UTF-8" not in r.stderr and "--on-error skip" not in r.stderr
    assert not list(tmp_path.glob("o*"))


# ---------------------------------------------------------------- output names


def test_an_output_bin_that_is_a_directory_is_named(tmp_path, tokenizer_file):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    (tmp_path / "out_text_document.bin").mkdir()
    r = mftk("preprocess", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "out"), "-t", str(tokenizer_file))
    message = assert_clean_failure(r, 2, f"{tmp_path / 'out_text_document.bin'} is a directory")
    assert ".partial" not in message


@pytest.mark.parametrize("prefix", [".", "sub/", "existing"])
def test_an_output_prefix_that_is_a_directory_is_refused(tmp_path, tokenizer_file, prefix):
    (tmp_path / "in.jsonl").write_bytes(GOOD)
    (tmp_path / "existing").mkdir()
    r = mftk("preprocess", "-i", "in.jsonl", "-o", prefix, "-t", str(tokenizer_file), cwd=tmp_path)
    message = assert_clean_failure(r, 2, f"--output-prefix '{prefix}' is a directory")
    assert ".partial" not in message and "corpus" in flat(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing", "in.jsonl"]
    assert not list((tmp_path / "existing").iterdir())


def test_merge_into_a_directory_is_refused(tmp_path):
    a = _pair(tmp_path / "a", [[1, 2, 3]], 300)
    with pytest.raises(InputError, match="is a directory"):
        preprocess([a], str(tmp_path), None, merge_only=True)
