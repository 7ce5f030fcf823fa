"""Index cache: the three GPTDataset arrays saved next to the data, keyed by what built them.

File names follow MindSpore Transformers (reference megatron-data.md §3.9):
``<md5>-GPTDataset-<split>-{description.txt, document_index.npy, sample_index.npy, shuffle_index.npy}``
where md5 is taken over the same description JSON, so a default-config cache is shared with
the reference. The reference leaves ``add_extra_token_to_sequence`` and
``drop_last_partial_validation_sequence`` out of that JSON although they change the arrays;
we add them whenever they differ from the default, so changing them never reuses stale
indices. Every array is written under a temporary name and renamed into place, the
description last (it marks the entry complete); a loaded entry is checked against the
corpus before it is trusted, and anything that fails the check is rebuilt.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from mftk.data.gpt_dataset import (GPTIndices, build_sample_index, num_epochs, num_samples_in,
                                   separate_final_epoch)
from mftk.errors import InputError
from mftk.files import SMALL_JSON_LIMIT, read_text, regular_file_or_error

ARRAYS = ("document_index", "sample_index", "shuffle_index")
DEFAULT_SUBDIR = Path("cache") / "GPTDataset_indices"


def gpt_description(dataset_path: str, num_samples: int | None, index_split: str, seed: int,
                    seq_length: int, split: str, split_matrix: Sequence[Any], *, extra: int = 1,
                    drop_last_partial: bool = True) -> dict[str, Any]:
    """The reference's ``unique_identifiers`` dict, plus the options it forgets when not default."""
    desc: dict[str, Any] = {
        "class": "GPTDataset",
        "dataset_path": dataset_path,
        "num_samples": num_samples,
        "index_split": index_split,
        "random_seed": seed,
        "sequence_length": seq_length,
        "split": split,
        "split_matrix": [list(b) if b is not None else None for b in split_matrix],
        "tokenizer": None,
    }
    if not extra:
        desc["add_extra_token_to_sequence"] = False
    if not drop_last_partial:
        desc["drop_last_partial_validation_sequence"] = False
    return desc


def description_text(desc: dict[str, Any]) -> str:
    """The JSON exactly as the reference writes it (4-space indent), whose md5 names the files."""
    return json.dumps(desc, indent=4)


def description_md5(desc: dict[str, Any]) -> str:
    return hashlib.md5(description_text(desc).encode("utf-8")).hexdigest()


def blended_description(children: Sequence[dict[str, Any]], split: str, weights: Sequence[float],
                        size: int | None) -> dict[str, Any]:
    """The reference's BlendedDataset identifiers (used for its md5; blends are not cached here)."""
    return {"class": "BlendedDataset", "datasets": list(children), "split": split,
            "weights": list(weights), "size": size}


def default_cache_dir(prefix: str) -> Path:
    """``<prefix>/cache/GPTDataset_indices`` (a directory named like the prefix, as the reference)."""
    return Path(prefix) / DEFAULT_SUBDIR


class IndexCache:
    """One dataset's cache entry: ``load_or_build`` returns trusted indices, building when needed.

    ``notes`` collects what happened (hit, miss, rebuilt because …) for the caller's report.
    """

    def __init__(self, directory: str | os.PathLike, description: dict[str, Any]) -> None:
        self.directory = Path(directory)
        self.description = description
        self.text = description_text(description)
        self.md5 = hashlib.md5(self.text.encode("utf-8")).hexdigest()
        self.stem = f"{self.md5}-GPTDataset-{description['index_split']}-"
        self.notes: list[str] = []
        self.hit = False

    def path(self, suffix: str) -> Path:
        return self.directory / f"{self.stem}{suffix}"

    def load_or_build(self, build: Callable[[], GPTIndices], **expect: Any) -> GPTIndices:
        found = self._load(**expect)
        if found is not None:
            self.hit = True
            return found
        indices = build()
        self._save(indices)
        return indices

    # -- load ---------------------------------------------------------------------------------
    def _load(self, **expect: Any) -> GPTIndices | None:
        desc_path = self.path("description.txt")
        if not desc_path.is_file():
            return None
        try:
            text = read_text(desc_path, limit=SMALL_JSON_LIMIT, what="cache description")
        except (OSError, InputError) as exc:
            self.notes.append(f"{desc_path}: unreadable ({exc}); rebuilt")
            return None
        if text != self.text:
            self.notes.append(f"{desc_path}: written by a different config; rebuilt")
            return None
        try:
            for name in ARRAYS:
                regular_file_or_error(self.path(f"{name}.npy"), what="cache file")
            arrays = {name: np.load(self.path(f"{name}.npy"), allow_pickle=False, mmap_mode="r")
                      for name in ARRAYS}
        except (OSError, ValueError, EOFError, InputError) as exc:
            self.notes.append(f"{self.directory}: cache entry {self.md5} is corrupt ({exc}); rebuilt")
            return None
        problem = check_indices(arrays["document_index"], arrays["sample_index"], arrays["shuffle_index"],
                                **expect)
        if problem:
            self.notes.append(f"{self.directory}: cache entry {self.md5} is corrupt ({problem}); rebuilt")
            return None
        e = expect
        lengths = np.asarray(e["lengths"], dtype=np.int64)
        beg, end = e["split_range"]
        tokens = int(lengths[beg:end].sum())
        epochs = num_epochs(tokens, e["num_samples"], e["seq_length"], e["extra"])
        sep = separate_final_epoch(epochs, tokens, e["num_samples"], e["seq_length"], e["extra"])
        self.notes.append(f"loaded indices from {self.path('*')}")
        return GPTIndices(arrays["document_index"], arrays["sample_index"], arrays["shuffle_index"],
                          epochs, sep, tokens)

    # -- save ---------------------------------------------------------------------------------
    def _save(self, indices: GPTIndices) -> None:
        """Write arrays then description, each atomically; an unwritable directory only skips caching."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            for name in ARRAYS:
                _atomic_save(self.path(f"{name}.npy"), getattr(indices, name))
            _atomic_write(self.path("description.txt"), self.text)
        except OSError as exc:
            self.notes.append(f"{self.directory}: cannot write the index cache ({exc.strerror or exc}); "
                              "indices were built in memory only")
            return
        self.notes.append(f"saved indices to {self.path('*')}")


def check_indices(document_index: np.ndarray, sample_index: np.ndarray, shuffle_index: np.ndarray, *,
                  lengths: np.ndarray, split_range: tuple[int, int], num_samples: int | None,
                  seq_length: int, seed: int, extra: int, drop_last_partial: bool) -> str:
    """Why these arrays cannot be the indices of this corpus and config ("" when they can).

    Checks shapes and dtypes, that every document appears exactly E times, that the sample
    index is the one this document order gives, and that the shuffle is a permutation of the
    expected blocks. It cannot re-derive the random order without rebuilding, which the
    md5-named description covers.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    beg, end = split_range
    tokens = int(lengths[beg:end].sum())
    epochs = num_epochs(tokens, num_samples, seq_length, extra)
    sep = separate_final_epoch(epochs, tokens, num_samples, seq_length, extra)
    ndocs = end - beg
    if document_index.dtype != np.int32 or document_index.shape != (epochs * ndocs,):
        return f"document_index is {document_index.dtype}{document_index.shape}, expected int32({epochs * ndocs},)"
    if ndocs and (document_index.min() < beg or document_index.max() >= end):
        return "document_index names documents outside the split"
    if ndocs and not np.all(np.bincount(np.asarray(document_index) - beg, minlength=ndocs) == epochs):
        return f"document_index does not hold every document exactly {epochs} times"
    count = num_samples_in(epochs, tokens, seq_length, extra, drop_last_partial)
    if sample_index.shape != (count + 1, 2):
        return f"sample_index has shape {sample_index.shape}, expected ({count + 1}, 2)"
    expected = build_sample_index(lengths, np.asarray(document_index), seq_length, epochs, tokens,
                                  drop_last_partial, extra)
    if not np.array_equal(sample_index, expected):
        return "sample_index does not match the document order"
    if shuffle_index.shape != (count,):
        return f"shuffle_index has shape {shuffle_index.shape}, expected ({count},)"
    first = ((epochs - 1) * tokens - extra) // seq_length if sep else count
    shuffled = np.asarray(shuffle_index, dtype=np.int64)
    if not (np.array_equal(np.sort(shuffled[:first]), np.arange(first))
            and np.array_equal(np.sort(shuffled[first:]), np.arange(first, count))):
        return "shuffle_index is not a permutation of the samples"
    return ""


def _atomic_save(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(array), allow_pickle=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
