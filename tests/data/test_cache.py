"""Index cache: the reference's md5 names (§7 "Cache hash"), reuse, rebuild on change or corruption."""
from __future__ import annotations

import os

import numpy as np
import pytest

from mftk.data import blend
from mftk.derive import parse_split
from mftk.data.cache import (IndexCache, blended_description, check_indices, description_md5,
                             gpt_description)
from mftk.data.gpt_dataset import build_indices

LEN_A = np.array([5, 9, 3, 12, 7, 1, 4, 8, 6, 10], dtype=np.int32)
B1 = dict(dataset_path="corpA", num_samples=21, index_split="train", seed=1234, seq_length=8, split="1, 0, 0")


def desc(**kw):
    args = {**B1, **kw}
    extra = args.pop("extra", 1)
    return gpt_description(**args, split_matrix=blend.split_matrix(parse_split(args["split"])),
                           extra=extra)


def test_reference_md5s():
    d = desc()
    assert description_md5(d) == "729dd559166442465fe9e1dcf6b95b9e"
    assert description_md5(blended_description([d], "train", [1.0], 21)) == "72e14a2151539f69cd0eb7c32bf5bc17"
    names = sorted(p.name for p in [IndexCache("c", d).path(s) for s in ("description.txt", "document_index.npy")])
    assert names == ["729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-description.txt",
                     "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-document_index.npy"]


def test_options_the_reference_forgets_change_the_key():
    assert description_md5(desc(extra=0)) != description_md5(desc())


EXPECT = dict(lengths=LEN_A, split_range=(0, 10), num_samples=21, seq_length=8, seed=1234, extra=1,
              drop_last_partial=True)


def build():
    return build_indices(LEN_A, np.arange(10, dtype=np.int32), 21, 8, 1234)


def test_hit_after_miss_and_atomic_files(tmp_path):
    calls = []
    first = IndexCache(tmp_path, desc()).load_or_build(lambda: calls.append(1) or build(), **EXPECT)
    again_cache = IndexCache(tmp_path, desc())
    again = again_cache.load_or_build(lambda: calls.append(1) or build(), **EXPECT)
    assert calls == [1] and again_cache.hit
    assert again.sample_index.tolist() == first.sample_index.tolist()
    assert (again.epochs, again.separate_final_epoch) == (first.epochs, first.separate_final_epoch)
    assert sorted(os.listdir(tmp_path)) == sorted(f"729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-{s}" for s in
                                                  ("description.txt", "document_index.npy", "sample_index.npy",
                                                   "shuffle_index.npy"))


def _corrupt_truncate(p):
    f = p / "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-sample_index.npy"
    f.write_bytes(f.read_bytes()[:100])


def _corrupt_values(p):
    f = p / "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-sample_index.npy"
    a = np.load(f)
    a[3, 1] += 1
    np.save(f, a)


def _corrupt_shuffle(p):
    f = p / "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-shuffle_index.npy"
    a = np.load(f)
    a[0] = a[1]
    np.save(f, a)


def _other_config(p):
    f = p / "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-description.txt"
    f.write_text(f.read_text().replace("1234", "4321"))


def _pickle_instead(p):
    f = p / "729dd559166442465fe9e1dcf6b95b9e-GPTDataset-train-document_index.npy"
    np.save(f, np.array([{"a": 1}], dtype=object), allow_pickle=True)


@pytest.mark.parametrize("damage, why", [
    (_corrupt_truncate, "corrupt"), (_corrupt_values, "does not match"), (_corrupt_shuffle, "permutation"),
    (_other_config, "different config"), (_pickle_instead, "corrupt"),
])
def test_damaged_cache_is_rebuilt_not_trusted(tmp_path, damage, why):
    IndexCache(tmp_path, desc()).load_or_build(build, **EXPECT)
    damage(tmp_path)
    cache = IndexCache(tmp_path, desc())
    got = cache.load_or_build(build, **EXPECT)
    assert not cache.hit and any(why in n and n.endswith("rebuilt") for n in cache.notes)
    assert got.sample_index.tolist() == build().sample_index.tolist()
    assert IndexCache(tmp_path, desc()).load_or_build(lambda: pytest.fail("rebuilt twice"), **EXPECT) is not None


def test_check_indices_accepts_fresh_build():
    ix = build()
    assert check_indices(ix.document_index, ix.sample_index, ix.shuffle_index, **EXPECT) == ""
    assert "exactly 3 times" in check_indices(ix.document_index[::-1].copy() * 0 + 1, ix.sample_index,
                                              ix.shuffle_index, **EXPECT)


def test_unwritable_directory_builds_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cache = IndexCache(blocker / "sub", desc())
    got = cache.load_or_build(build, **EXPECT)
    assert len(got) == 24 and any("cannot write" in n for n in cache.notes)
