"""GPTDataset: the document, sample and shuffle indices, and the samples read through them.

Everything here reproduces MindSpore Transformers' ``GPTDataset`` (reference megatron-data.md
§3) so that the same files, config and seed give the same samples, in the same order.
The index builders are pure numpy functions over ``sequence_lengths`` so they can be tested
without files; the C++ sample walk of the reference is replaced by one ``searchsorted`` over
the cumulative token counts, which is what lets a billion-token corpus index in seconds.

Two deliberate differences from the reference commit (both match the released 2.1.0, §10):
the loss mask is never shared between samples (the reference zeroed a cached mask in place,
so one padded label masked that position in every later sample), and ``actual_seq_len`` is
computed for every sample (the reference crashed on the second sample when no reset flag
was set).
"""
from __future__ import annotations

import math
from typing import Any, Protocol

import attrs
import numpy as np

from mftk.errors import ConfigError, DataFormatError, Problem
from mftk.progress import NULL_PROGRESS, Progress

SEPARATE_FINAL_EPOCH_THRESHOLD = 0.80


class LowLevelDataset(Protocol):
    """What GPTDataset needs from a token store (``mftk.data.indexed.IndexedDataset`` has it)."""

    sequence_lengths: np.ndarray

    def __len__(self) -> int: ...
    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray: ...


# ---------------------------------------------------------------------------------------------
# Pure index functions (reference §3.1–3.6)
# ---------------------------------------------------------------------------------------------
def num_epochs(tokens_per_epoch: int, num_samples: int | None, seq_length: int, extra: int) -> int:
    """Smallest E >= 1 with E·T >= num_samples·seq + extra (1 when num_samples is None).

    The reference loops and never ends when T == 0; we refuse that case (the caller gets the
    error with the dataset's name).
    """
    if num_samples is None:
        return 1
    if tokens_per_epoch <= 0:
        raise ValueError("cannot draw samples from a split with no tokens")
    requested = num_samples * seq_length + extra
    return max(1, -(-requested // tokens_per_epoch))


def separate_final_epoch(epochs: int, tokens_per_epoch: int, num_samples: int | None,
                         seq_length: int, extra: int) -> bool:
    """Whether the last epoch is shuffled on its own (when it is mostly unused, <80 % of an epoch).

    Keeping a short final epoch apart stops its few samples from being spread over the run.
    """
    if epochs == 1 or num_samples is None:
        return False
    sans_final = ((epochs - 1) * tokens_per_epoch - extra) // seq_length
    from_final = num_samples - sans_final
    per_epoch = (tokens_per_epoch - extra) // seq_length
    if not 0 <= from_final <= per_epoch + 1:  # holds by construction (reference asserts it)
        raise ValueError(f"inconsistent epoch arithmetic: {from_final} samples from the final epoch")
    return from_final < int(SEPARATE_FINAL_EPOCH_THRESHOLD * per_epoch)


def build_document_index(documents: np.ndarray, epochs: int, rng: np.random.RandomState,
                         separate_final: bool) -> np.ndarray:
    """``documents`` tiled ``epochs`` times and shuffled (int32); the final epoch apart if asked."""
    if not separate_final:
        index = np.tile(np.asarray(documents, dtype=np.int32), epochs)
        rng.shuffle(index)
        return index
    first = build_document_index(documents, epochs - 1, rng, False)
    last = build_document_index(documents, 1, rng, False)
    return np.concatenate((first, last))


def num_samples_in(epochs: int, tokens_per_epoch: int, seq_length: int, extra: int,
                   drop_last_partial: bool) -> int:
    """S: how many samples E epochs give (the partial count uses C float32 like the reference)."""
    usable = epochs * tokens_per_epoch - extra
    if drop_last_partial:
        return max(usable // seq_length, 0)
    return max(int(math.ceil(np.float32(usable) / np.float32(seq_length))), 0)


def build_sample_index(sizes: np.ndarray, document_index: np.ndarray, seq_length: int, epochs: int,
                       tokens_per_epoch: int, drop_last_partial: bool = True, extra: int = 1) -> np.ndarray:
    """Rows (position in document_index, token offset) where each sample starts: int64 [S+1, 2].

    Sample k starts at global token k·seq of the shuffled concatenation and needs
    seq + extra tokens; its start row is the first position whose cumulative end reaches
    k·seq + extra. The partial last sample (valid split only) ends at the last position with
    offset len − extra, which is −1 for an empty last sequence, as in the reference.
    """
    count = num_samples_in(epochs, tokens_per_epoch, seq_length, extra, drop_last_partial)
    lengths = np.asarray(sizes, dtype=np.int64)[document_index]
    ends = np.cumsum(lengths)  # ends[p] = tokens up to and including position p
    starts = np.arange(1, count + 1, dtype=np.int64) * seq_length
    rows = np.empty((count + 1, 2), dtype=np.int64)
    rows[0] = 0
    pos = np.searchsorted(ends, starts + extra, side="left")
    partial = pos >= len(ends)
    pos_c = np.minimum(pos, len(ends) - 1)
    rows[1:, 0] = pos_c
    rows[1:, 1] = starts - (ends[pos_c] - lengths[pos_c])
    if partial.any():
        rows[1:, 1][partial] = lengths[-1] - extra
    return rows


def build_shuffle_index(num_samples: int, total_size: int, rng: np.random.RandomState) -> np.ndarray:
    """Shuffled ``0..num_samples``, then (if total is larger) shuffled ``num_samples..total``.

    uint32 unless the count reaches 2³²−2, like the reference.
    """
    dtype = np.int64 if total_size >= np.iinfo(np.uint32).max - 1 else np.uint32
    first = np.arange(num_samples, dtype=dtype)
    rng.shuffle(first)
    if num_samples == total_size:
        return first
    last = np.arange(num_samples, total_size, dtype=dtype)
    rng.shuffle(last)
    return np.concatenate((first, last))


@attrs.frozen
class GPTIndices:
    """The three index arrays of one GPTDataset and the epoch arithmetic behind them."""

    document_index: np.ndarray
    sample_index: np.ndarray
    shuffle_index: np.ndarray
    epochs: int
    separate_final_epoch: bool
    tokens_per_epoch: int

    def __len__(self) -> int:
        return len(self.shuffle_index)


def build_indices(sequence_lengths: np.ndarray, documents: np.ndarray, num_samples: int | None,
                  seq_length: int, seed: int, *, extra: int = 1, drop_last_partial: bool = True,
                  progress: Progress = NULL_PROGRESS) -> GPTIndices:
    """All three indices from one ``RandomState(seed)``, in the reference's order.

    Document-index shuffles come first, then shuffle-index shuffles: changing this order
    changes every sample.
    """
    documents = np.asarray(documents)
    tokens = int(np.asarray(sequence_lengths, dtype=np.int64)[documents].sum())
    epochs = num_epochs(tokens, num_samples, seq_length, extra)
    separate = separate_final_epoch(epochs, tokens, num_samples, seq_length, extra)
    progress.start("Building GPT indices", total=3)
    rng = np.random.RandomState(seed)
    doc_index = build_document_index(documents, epochs, rng, separate)
    progress.advance(1)
    sample_index = build_sample_index(sequence_lengths, doc_index, seq_length, epochs, tokens,
                                      drop_last_partial, extra)
    progress.advance(1)
    total = len(sample_index) - 1
    first = ((epochs - 1) * tokens - extra) // seq_length if separate else total
    shuffle_index = build_shuffle_index(first, total, rng)
    progress.advance(1)
    progress.done()
    return GPTIndices(doc_index, sample_index, shuffle_index, epochs, separate, tokens)


# ---------------------------------------------------------------------------------------------
# Samples (reference §3.7–3.8)
# ---------------------------------------------------------------------------------------------
@attrs.frozen
class SampleOptions:
    """The YAML flags that shape each sample (``train_dataset.dataloader.config``)."""

    seq_length: int
    eod: int = -1
    pad: int = -1
    eod_mask_loss: bool = False
    reset_position_ids: bool = False
    reset_attention_mask: bool = False
    create_attention_mask: bool = True
    create_compressed_eod_mask: bool = False
    eod_pad_length: int = 128
    add_extra_token: bool = True

    @property
    def extra(self) -> int:
        return int(self.add_extra_token)


def read_text(dataset: LowLevelDataset, indices: GPTIndices, i: int, seq_length: int, extra: int,
              pad: int) -> np.ndarray:
    """The ``seq + extra`` tokens of sample ``i`` (int64), right-padded with ``pad`` if partial."""
    j = int(indices.shuffle_index[i])
    (b, b_off), (e, e_off) = indices.sample_index[j], indices.sample_index[j + 1]
    doc = indices.document_index
    if b == e:
        parts = [dataset.get(int(doc[b]), offset=int(b_off), length=int(e_off - b_off + extra))]
    else:
        parts = []
        for p in range(int(b), int(e) + 1):
            offset = int(b_off) if p == b else 0
            length = None if p < e else int(e_off + extra)
            if length is not None and length <= 0:  # offset −1 of an empty last sequence
                continue
            parts.append(dataset.get(int(doc[p]), offset=offset, length=length))
    text = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
    want = seq_length + extra
    if len(text) < want:
        text = np.concatenate((text, np.full(want - len(text), pad, dtype=np.int64)))
    return text


def make_sample(text: np.ndarray, opts: SampleOptions) -> dict[str, np.ndarray]:
    """The columns MindSpore Transformers feeds the model, from one sample's text (all int32).

    ``attention_mask`` uses the reference convention 1 = masked (future or other document).
    """
    if opts.add_extra_token:
        tokens, labels = text[:-1].copy(), text[1:].copy()
    else:
        tokens = text.copy()
        labels = np.roll(text, -1)
        labels[-1] = opts.pad
    length = len(tokens)
    is_eod = tokens == opts.eod
    positions = np.arange(length, dtype=np.int64)
    loss_mask = np.ones(length, dtype=np.int32)
    if opts.eod_mask_loss:
        loss_mask[is_eod] = 0
    # Document id of each position: how many EODs come strictly before it.
    segment = np.concatenate(([0], np.cumsum(is_eod[:-1])))
    position_ids = positions
    if opts.reset_position_ids:
        after_eod = np.where(np.concatenate(([False], is_eod[:-1])), positions, 0)
        position_ids = positions - np.maximum.accumulate(after_eod)
    out: dict[str, np.ndarray] = {}
    loss_mask[labels == opts.pad] = 0
    tokens[tokens == opts.pad] = 0
    labels[labels == opts.pad] = 0
    out["input_ids"] = tokens.astype(np.int32)
    out["labels"] = labels.astype(np.int32)
    out["loss_mask"] = loss_mask
    out["position_ids"] = position_ids.astype(np.int32)
    if opts.create_compressed_eod_mask:
        out["actual_seq_len"] = compressed_eod_mask(is_eod, opts.eod_pad_length)
    elif opts.create_attention_mask:
        future = positions[None, :] > positions[:, None]
        masked = future
        if opts.reset_attention_mask:
            masked = future | (segment[None, :] != segment[:, None])
        out["attention_mask"] = masked.astype(np.int32)[None]  # (1, L, L)
    return out


def compressed_eod_mask(is_eod: np.ndarray, pad_length: int) -> np.ndarray:
    """Ends of each document inside the sample (index after each EOD but the last position), padded with L."""
    length = len(is_eod)
    ends = np.flatnonzero(is_eod[:-1]) + 1
    if len(ends) > pad_length:
        raise DataFormatError(
            message=f"a sample holds {len(ends)} end-of-document tokens, more than eod_pad_length={pad_length}",
            expected=f"<= {pad_length} EODs per sample", found=str(len(ends)),
            hint="raise train_dataset.dataloader.config.eod_pad_length")
    out = np.full(pad_length, length, dtype=np.int32)
    out[: len(ends)] = ends
    return out


class GPTDataset:
    """Samples of one prefix's split, in MindSpore Transformers' order.

    ``dataset`` is any object with ``sequence_lengths`` and ``get(idx, offset, length)``.
    """

    def __init__(self, dataset: LowLevelDataset, indices: GPTIndices, options: SampleOptions,
                 *, name: str = "", split_range: tuple[int, int] | None = None) -> None:
        self.dataset = dataset
        self.indices = indices
        self.options = options
        self.name = name
        self.split_range = split_range
        self.vocab_size: int | None = None  # the model's: every sample read is checked against it

    def __len__(self) -> int:
        return len(self.indices)

    def text(self, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sample {i} out of range for {len(self)} samples of {self.name or 'dataset'}")
        o = self.options
        text = read_text(self.dataset, self.indices, i, o.seq_length, o.extra, o.pad)
        if self.vocab_size is not None and len(text) and int(text.max()) >= self.vocab_size:
            bad = int(text.max())
            raise DataFormatError(
                message=f"{self.name or 'dataset'}.bin: sample {i} holds token id {bad}, but model.vocab_size is "
                        f"{self.vocab_size} (the embedding table has no row {bad})",
                path=f"{self.name}.bin", expected=f"< {self.vocab_size}", found=str(bad),
                hint="set model.vocab_size to the tokenizer's vocabulary size, or preprocess the data with the "
                     "model's tokenizer")
        return text

    def __getitem__(self, i: int) -> dict[str, np.ndarray]:
        return make_sample(self.text(i), self.options)


def build_gpt_dataset(dataset: LowLevelDataset, split_range: tuple[int, int], num_samples: int | None,
                      options: SampleOptions, seed: int, *, name: str = "", drop_last_partial: bool = True,
                      cache: Any = None, progress: Progress = NULL_PROGRESS) -> GPTDataset:
    """Index one split ``[beg, end)`` of ``dataset`` and wrap it; ``cache`` is an ``IndexCache`` or None."""
    beg, end = split_range
    lengths = np.asarray(dataset.sequence_lengths)
    tokens = int(lengths[beg:end].sum(dtype=np.int64))
    seq, extra = options.seq_length, options.extra
    where = name or "dataset"
    if tokens <= extra:
        raise DataFormatError(
            message=f"{where}: its split [{beg}, {end}) holds {tokens} tokens ({end - beg} sequences); "
            "no sample can be drawn from it", path=name, expected="> 1 token", found=f"{tokens} tokens",
            hint="check the data_path prefix and the split string; an empty .bin or a split share that "
            "rounds to zero sequences gives this")
    if tokens < seq + extra:
        raise ConfigError(
            message=f"seq_length={seq} needs {seq + extra} tokens per sample, but {where} has only "
            f"{tokens} tokens in its split [{beg}, {end})",
            problems=[Problem(path="train_dataset.dataloader.config.seq_length", value=seq,
                              message=f"larger than the {tokens} tokens of {where}",
                              hint="use more data or a shorter seq_length")])
    if cache is not None:
        indices = cache.load_or_build(lambda: build_indices(
            lengths, np.arange(beg, end, dtype=np.int32), num_samples, seq, seed, extra=extra,
            drop_last_partial=drop_last_partial, progress=progress),
            lengths=lengths, split_range=split_range, num_samples=num_samples, seq_length=seq,
            seed=seed, extra=extra, drop_last_partial=drop_last_partial)
    else:
        indices = build_indices(lengths, np.arange(beg, end, dtype=np.int32), num_samples, seq, seed,
                                extra=extra, drop_last_partial=drop_last_partial, progress=progress)
    return GPTDataset(dataset, indices, options, name=name, split_range=split_range)


class InMemoryDataset:
    """A token store held in memory: tests, and the explicit ``mock: true`` data."""

    def __init__(self, sequences: list[np.ndarray] | list[list[int]], dtype: Any = np.int32) -> None:
        self.dtype = np.dtype(dtype)
        arrays = [np.asarray(s, dtype=self.dtype) for s in sequences]
        self.sequence_lengths = np.array([len(a) for a in arrays], dtype=np.int32)
        self._tokens = np.concatenate(arrays) if arrays else np.zeros(0, self.dtype)
        self._starts = np.concatenate(([0], np.cumsum(self.sequence_lengths, dtype=np.int64)))

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def get(self, idx: int, offset: int = 0, length: int | None = None) -> np.ndarray:
        size = int(self.sequence_lengths[idx])
        if length is None:
            length = size - offset
        if offset < 0 or length < 0 or offset + length > size:
            raise IndexError(f"tokens [{offset}, {offset + length}) out of range for sequence {idx}")
        start = int(self._starts[idx]) + offset
        return self._tokens[start:start + length]


def mock_dataset(seq_length: int, seed: int, *, sequences: int = 1000, vocab_size: int = 32000,
                 eod: int = -1) -> InMemoryDataset:
    """Random documents for ``mock: true``: lengths 1..2·seq, random token ids, EOD-terminated if eod >= 0."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(1, 2 * seq_length + 1, size=sequences)
    docs = []
    for n in lengths:
        doc = rng.randint(0, vocab_size, size=int(n)).astype(np.int32)
        if eod >= 0:
            doc[-1] = eod
        docs.append(doc)
    return InMemoryDataset(docs)
