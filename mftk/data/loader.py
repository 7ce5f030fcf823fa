"""The training dataloader: config → blended GPT samples → this rank's batches.

``build_train_dataset`` reads the ``train_dataset.dataloader`` section (BlendedMegatronDatasetDataLoader,
or MindDataset for MindRecord files) and returns a ``TrainData`` whose ``loader`` yields numpy batches. Sharding reproduces
MindSpore's ``DistributedSampler`` as MindSpore Transformers uses it (reference
megatron-data.md §4.6): only the first ⌊sizes[0]/gbs⌋·gbs blended samples are used, and
data-parallel rank k reads samples k, k+dp, k+2dp, …, so global step j consumes exactly
samples [j·gbs, (j+1)·gbs) across the ranks. Resume maps ``consumed_samples`` to
``consumed_samples // (dp·local_batch_size)`` micro-batches already read by each rank.
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Sequence

import attrs
import numpy as np

from mftk.data import blend
from mftk.data.cache import IndexCache, default_cache_dir, gpt_description
from mftk.data.gpt_dataset import SampleOptions, build_gpt_dataset, mock_dataset
from mftk.derive import parse_data_path, parse_split, skip_micro_batches
from mftk.errors import ConfigError, InputError, Problem
from mftk.progress import NULL_PROGRESS, Progress

_LOADER = "train_dataset.dataloader"
_CFG = f"{_LOADER}.config"
MINDRECORD_TYPE = "MindDataset"


def _error(path: str, message: str, value: Any = None, hint: str = "") -> ConfigError:
    """A setting that turns out wrong once the files are read (the config rules checked everything else)."""
    return ConfigError(message=f"{path}: {message}",
                       problems=[Problem(path=path, message=message, value=value, hint=hint)])


# ---------------------------------------------------------------------------------------------
# Sharding and resume (pure functions)
# ---------------------------------------------------------------------------------------------
def shard_indices(num_samples: int, dp_size: int, dp_rank: int) -> np.ndarray:
    """Blended indices read by shard ``dp_rank``: rank, rank+dp, …, ceil(N/dp) of them, wrapping mod N."""
    total = -(-num_samples // dp_size) * dp_size
    return (np.arange(dp_rank, total, dp_size, dtype=np.int64) % num_samples) if num_samples else \
        np.zeros(0, np.int64)


# ---------------------------------------------------------------------------------------------
# The loader
# ---------------------------------------------------------------------------------------------
@attrs.define
class DataLoader:
    """This rank's micro-batches of ``local_batch_size`` samples, as numpy dicts.

    ``sample_ids`` are the blended indices this rank reads in order, already truncated to
    the samples the run uses. ``len(loader)`` is micro-batches per epoch (the reference's
    ``epoch_step``); iteration past the end starts the next epoch from batch 0.
    """

    dataset: Any  # BlendedDataset or SingleDataset
    sample_ids: np.ndarray
    local_batch_size: int
    dp_size: int
    dp_rank: int
    drop_remainder: bool = True
    compressed_eod_mask: bool = False
    balance_accum: int = 0  # > 0: ``balance_enabled``, steps of balance_accum micro-batches per rank
    peers: tuple[np.ndarray, ...] = ()  # with balance_accum: every data rank's sample ids (the plan needs all)

    def __len__(self) -> int:
        n = len(self.sample_ids)
        return n // self.local_batch_size if self.drop_remainder else -(-n // self.local_batch_size)

    def batch_ids(self, batch: int) -> np.ndarray:
        """Blended sample indices of micro-batch ``batch`` of this rank (within one epoch)."""
        if not 0 <= batch < len(self):
            raise IndexError(f"batch {batch} out of range for {len(self)} batches per epoch")
        b = self.local_batch_size
        return self.sample_ids[batch * b:(batch + 1) * b]

    def batch(self, batch: int) -> dict[str, np.ndarray]:
        self.check_files()  # a data file truncated under the run: an error naming it, not a SIGBUS
        return collate([self.dataset[int(i)] for i in self.batch_ids(batch)], self.compressed_eod_mask)

    def check_files(self) -> None:
        """DataFormatError naming a `.bin`/`.idx` this loader reads that changed since it was opened
        (`mftk.data.indexed.IndexedDataset.check_unchanged`); other sources have nothing to check. Called
        before every micro-batch is read, and by the trainer at every step's end."""
        for source in getattr(self.dataset, "datasets", ()):
            check = getattr(getattr(source, "dataset", None), "check_unchanged", None)
            if check is not None:
                check()

    def start_batch(self, consumed_samples: int) -> int:
        """Position (micro-batch within the epoch) to resume from after ``consumed_samples``."""
        skip = skip_micro_batches(consumed_samples, self.dp_size, self.local_batch_size)
        return skip % len(self) if len(self) else 0

    def iter_batches(self, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches from micro-batch ``start`` on, forever (each epoch restarts at batch 0)."""
        if not len(self):
            return
        if self.balance_accum and self.dp_size > 1:
            yield from self._balanced(start)
            return
        b = start
        while True:
            yield self.batch(b)
            b = (b + 1) % len(self)

    def _balanced(self, start: int) -> Iterator[dict[str, np.ndarray]]:
        """Step by step, this rank's share of the step's dp·accum baseline micro-batches (`data.balance`)."""
        from mftk.data.balance import assign, sample_load

        accum, b, n = self.balance_accum, start, len(self)
        while True:
            self.check_files()
            items = [(r, (b + a) % n) for r in range(self.dp_size) for a in range(accum)]
            loads = [sum(sample_load(self.dataset[int(i)]["actual_seq_len"]) for i in self._ids_of(r, batch))
                     for r, batch in items]
            for k in assign(loads, self.dp_size, accum)[self.dp_rank]:
                r, batch = items[k]
                yield collate([self.dataset[int(i)] for i in self._ids_of(r, batch)], self.compressed_eod_mask)
            b = (b + accum) % n

    def _ids_of(self, rank: int, batch: int) -> np.ndarray:
        size = self.local_batch_size
        return self.peers[rank][batch * size:(batch + 1) * size]

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        for b in range(len(self)):
            yield self.batch(b)


def collate(samples: Sequence[dict[str, np.ndarray]], compressed_eod_mask: bool = False) -> dict[str, np.ndarray]:
    """Stack samples along a new axis 0; ``actual_seq_len`` becomes cumulative over the batch (TND packing)."""
    out = {k: np.stack([s[k] for s in samples]) for k in samples[0]}
    if compressed_eod_mask and "actual_seq_len" in out:
        lens = out["actual_seq_len"].astype(np.int64)
        offsets = np.concatenate(([0], np.cumsum(lens[:-1, -1])))
        out["actual_seq_len"] = (lens + offsets[:, None]).astype(np.int32)
    return out


@attrs.frozen
class SourceInfo:
    """One prefix of the blend, as built."""

    prefix: str
    weight: float
    num_samples: int | None
    split_range: tuple[int, int]
    length: int
    epochs: int
    cache: str


@attrs.frozen
class TrainData:
    """What ``build_train_dataset`` built: the loader plus a report for humans."""

    loader: DataLoader
    dataset: Any
    sources: list[SourceInfo]
    train_samples: int
    warnings: list[str]
    notes: list[str]


def _sample_options(cfg: Any) -> SampleOptions:
    return SampleOptions(
        seq_length=cfg.seq_length, eod=cfg.eod, pad=cfg.pad, eod_mask_loss=cfg.eod_mask_loss,
        reset_position_ids=cfg.reset_position_ids, reset_attention_mask=cfg.reset_attention_mask,
        create_attention_mask=cfg.create_attention_mask, create_compressed_eod_mask=bool(cfg.create_compressed_eod_mask),
        eod_pad_length=cfg.eod_pad_length, add_extra_token=cfg.add_extra_token_to_sequence)


def build_train_dataset(dataloader: Any, *, global_batch_size: int, local_batch_size: int, dp_size: int = 1,
                        dp_rank: int = 0, drop_remainder: bool = True, cache_dir: str | None = None,
                        max_epochs: int | None = None, use_cache: bool = True, open_dataset: Any = None,
                        seq_length: int | None = None, balance_accum: int = 0, vocab_size: int | None = None,
                        progress: Progress = NULL_PROGRESS) -> TrainData:
    """Build the training samples MindSpore Transformers would build, and this rank's loader.

    ``dataloader`` is the typed ``train_dataset.dataloader`` section (`config.sections.DataloaderConfig`)
    of a config the rules accepted: type, sizes, data_path and split are not checked again here; what
    can only be known from the files (too few tokens for seq_length, a prefix whose split is empty, a
    blend asking a source for more samples than it has) is a ConfigError at the YAML path.

    ``cache_dir`` overrides where indices are cached when ``path_to_cache`` is unset (default
    ``<prefix>/cache/GPTDataset_indices``). ``max_epochs`` turns "sizes needs more passes over a
    dataset than this" into a ConfigError (it is otherwise a warning). ``open_dataset(prefix)``
    replaces ``IndexedDataset`` (tests); with it, indices are cached only under an explicit
    directory. ``use_cache=False`` never reads or writes a cache.

    ``type: MindDataset`` reads MindRecord files instead (``dataset_files`` or ``dataset_dir``;
    see ``mftk.data.mindrecord``); its sample length is ``config.seq_length`` when given, else
    ``seq_length`` (pass the model's), else the files' own.

    ``balance_accum`` (``train_dataset.balance_enabled``, the step's accumulation count): each step's
    micro-batches of all data ranks are redistributed to balance attention work (`mftk.data.balance`).

    ``vocab_size`` (the model's): a prefix whose recorded largest token id does not fit is a ConfigError
    (`vocabulary_problems`), and every sample read is checked too (`GPTDataset.vocab_size`), so an id past
    the embedding table is an error naming the file and the sample, never a kernel error in the first step.
    """
    for name, value in (("global_batch_size", global_batch_size), ("local_batch_size", local_batch_size),
                        ("dp_size", dp_size)):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank {dp_rank} out of range for dp_size {dp_size}")
    if dataloader.type == MINDRECORD_TYPE:
        return _build_mindrecord(dataloader, local_batch_size=local_batch_size, dp_size=dp_size, dp_rank=dp_rank,
                                 drop_remainder=drop_remainder, seq_length=seq_length, progress=progress)
    cfg = dataloader.config
    options = _sample_options(cfg)
    train = dataloader.sizes[0]
    warnings: list[str] = []
    notes: list[str] = []

    dataset, sources = _build_blend(cfg, train, options, cfg.seed, warnings, notes, cache_dir=cache_dir,
                                    max_epochs=max_epochs, use_cache=use_cache, open_dataset=open_dataset,
                                    progress=progress, vocab_size=vocab_size)
    used = min(train // global_batch_size * global_batch_size, len(dataset))
    if used < train // global_batch_size * global_batch_size:
        warnings.append(f"only {len(dataset)} samples available, fewer than sizes[0]={train}; "
                        f"the run uses {used // global_batch_size} steps of data per epoch")
    sample_ids = _rank_order(dataloader, used, cfg.seed, dp_size, dp_rank, warnings)
    peers: tuple[np.ndarray, ...] = ()
    if balance_accum and dp_size > 1:
        peers = tuple(sample_ids if r == dp_rank else _rank_order(dataloader, used, cfg.seed, dp_size, r, [])
                      for r in range(dp_size))
    loader = DataLoader(dataset=dataset, sample_ids=sample_ids, local_batch_size=local_batch_size,
                        dp_size=dp_size, dp_rank=dp_rank, drop_remainder=drop_remainder,
                        compressed_eod_mask=options.create_compressed_eod_mask, balance_accum=balance_accum,
                        peers=peers)
    return TrainData(loader=loader, dataset=dataset, sources=sources, train_samples=train,
                     warnings=warnings, notes=notes)


def _rank_order(dataloader: Any, used: int, seed: int, dp_size: int, dp_rank: int,
                warnings: list[str]) -> np.ndarray:
    """The first ``used`` samples, optionally shuffled, then this rank's shard of them."""
    order = np.arange(used, dtype=np.int64)
    if dataloader.shuffle:
        # MindSpore shuffles with its own RNG, which numpy cannot reproduce; ours is seeded but different.
        order = np.random.RandomState(seed).permutation(used).astype(np.int64)
        warnings.append(f"{_LOADER}.shuffle: true reorders samples with mftk's own seeded shuffle, which "
                        "differs from MindSpore's; keep it false to match MindSpore Transformers")
    return order[shard_indices(used, dp_size, dp_rank)] if used else order


def _build_mindrecord(dataloader: Any, *, local_batch_size: int, dp_size: int, dp_rank: int,
                      drop_remainder: bool, seq_length: int | None, progress: Progress) -> TrainData:
    """``type: MindDataset``: every record of the files, in order, sharded like MindSpore's MindDataset.

    MindDataset has no ``sizes``: an epoch is every sample (rank k reads k, k+dp, …, wrapping to
    pad the last round, as ``MindDataset(num_shards=dp, shard_id=k, shuffle=False)`` does).
    """
    from mftk.data.mindrecord import build_mindrecord_dataset

    dataset, warnings = build_mindrecord_dataset(dataloader, seq_length=seq_length, progress=progress)
    notes: list[str] = []
    if dataloader.sizes:
        notes.append(f"{_LOADER}.sizes is not used by MindDataset: an epoch is every sample of the files")
    seed = dataloader.config.seed if dataloader.config is not None else 1234
    sample_ids = _rank_order(dataloader, len(dataset), seed, dp_size, dp_rank, warnings)
    loader = DataLoader(dataset=dataset, sample_ids=sample_ids, local_batch_size=local_batch_size,
                        dp_size=dp_size, dp_rank=dp_rank, drop_remainder=drop_remainder,
                        compressed_eod_mask=dataset.options.create_compressed_eod_mask)
    sources = [SourceInfo(f, len(s) / len(dataset), len(s), (0, len(s)), len(s), 1, "")
               for f, s in zip(dataset.files, dataset.samples)]
    return TrainData(loader=loader, dataset=dataset, sources=sources, train_samples=len(dataset),
                     warnings=warnings, notes=notes)


def _build_blend(cfg: Any, train: int, options: SampleOptions, seed: int, warnings: list[str],
                 notes: list[str], *, cache_dir: str | None, max_epochs: int | None, use_cache: bool,
                 open_dataset: Any, progress: Progress, vocab_size: int | None = None) -> tuple[Any, list[SourceInfo]]:
    """The blended train dataset (reference §4.4 cases A, B, C, D)."""
    if cfg.mock:
        low = mock_dataset(options.seq_length, seed, eod=options.eod)
        gpt = build_gpt_dataset(low, (0, len(low)), train, options, seed, name="mock", progress=progress)
        return blend.SingleDataset(gpt), [SourceInfo("mock", 1.0, train, (0, len(low)), len(gpt),
                                                     gpt.indices.epochs, "")]
    data_path = cfg.data_path
    parsed = parse_data_path(data_path if data_path is not None else cfg.train_data_path)
    prefixes, weights = list(parsed.prefixes), (list(parsed.weights) if parsed.weights is not None else None)
    if data_path is not None:
        split_str = str(cfg.split)
        shares = parse_split(split_str)
    else:
        split_str, shares = None, [1.0, 0.0, 0.0]
    matrix = blend.split_matrix(shares)

    files = open_dataset is None  # default cache next to the data only for real files
    if open_dataset is None:
        from mftk.data.indexed import IndexedDataset as open_dataset  # noqa: N813
    path_to_cache = cfg.path_to_cache if cfg.path_to_cache is not None else cache_dir

    single = len(prefixes) == 1 and (weights is None or data_path is None)
    if single:
        counts: list[int | None] = [train]
        norm_weights = [1.0]
    elif weights is not None:
        norm_weights = blend.normalize(weights)
        counts = [s[0] for s in blend.sizes_per_dataset(norm_weights, [train])]
    else:
        counts, norm_weights = [None] * len(prefixes), []

    datasets, sources = [], []
    for prefix, count in zip(prefixes, counts):
        low = open_dataset(prefix)
        errors = [p for p in _vocabulary_problems(low, prefix, vocab_size, _blend_key(cfg)) if p.severity == "error"]
        if errors:
            raise ConfigError(message=errors[0].message, problems=errors)
        rng = blend.split_ranges(shares, len(low.sequence_lengths))[0]
        if rng is None or rng[1] <= rng[0]:
            raise _error(f"{_CFG}.split", f"gives {prefix} an empty training range ({len(low)} sequences)",
                         split_str)
        cache = None
        if use_cache and (path_to_cache is not None or files):
            directory = path_to_cache if path_to_cache is not None else default_cache_dir(prefix)
            cache = IndexCache(directory, gpt_description(
                prefix, count, "train", seed, options.seq_length, split_str if split_str is not None else "1,0,0",
                matrix, extra=options.extra))
        gpt = build_gpt_dataset(low, rng, count, options, seed, name=prefix, cache=cache, progress=progress)
        gpt.vocab_size = vocab_size
        if cache is not None:
            notes.extend(cache.notes)
            warnings.extend(n for n in cache.notes if n.endswith("rebuilt") or "cannot write" in n)
        _check_epochs(gpt, prefix, count, options, max_epochs, warnings)
        datasets.append(gpt)
        sources.append(SourceInfo(prefix, 0.0, count, rng, len(gpt), gpt.indices.epochs,
                                  str(cache.path("*")) if cache is not None else ""))

    if single:
        dataset: Any = blend.SingleDataset(datasets[0])
    elif weights is not None:
        dataset = blend.BlendedDataset(datasets, norm_weights, sum(c for c in counts if c is not None))
    else:
        lengths = [len(d) for d in datasets]
        empty = [p for p, n in zip(prefixes, lengths) if n == 0]
        if empty:
            raise _error(f"{_CFG}.data_path", f"{', '.join(empty)} yields no sample of seq_length="
                         f"{options.seq_length}, so its blend weight would be 0", prefixes)
        dataset = blend.BlendedDataset(datasets, None, min(train, sum(lengths)))
    sources = [attrs.evolve(s, weight=w) for s, w in zip(sources, dataset.weights)]
    for d, (src, gpt) in enumerate(zip(sources, datasets)):
        used = int(np.count_nonzero(np.asarray(getattr(dataset, "dataset_index", np.zeros(len(dataset)))) == d))
        if used > len(gpt):
            raise _error(f"{_LOADER}.sizes", f"the blend needs {used} samples of {src.prefix}, which has "
                         f"only {len(gpt)}", train)
    return dataset, sources


def vocabulary_problems(config: Any) -> list[Problem]:
    """Each training prefix's recorded vocabulary (`mftk.data.sidecar`) against ``model.vocab_size``: an error
    when its token ids reach past the model's embedding table, a warning when only the tokenizer's vocabulary
    is larger. Opening each pair also checks that its `.bin` belongs with its `.idx`."""
    dataloader = config.train_dataset.dataloader
    if config.model is None or dataloader.type == MINDRECORD_TYPE or dataloader.config.mock:
        return []
    cfg = dataloader.config
    blend_list = cfg.data_path if cfg.data_path is not None else cfg.train_data_path
    if not blend_list:
        return []
    from mftk.data.indexed import IndexedDataset
    from mftk.errors import DataFormatError

    problems: list[Problem] = []
    for prefix in parse_data_path(blend_list).prefixes:
        try:
            low = IndexedDataset(prefix)
        except (DataFormatError, InputError) as exc:
            problems.append(Problem(path=_blend_key(cfg), message=exc.message, hint=exc.hint))
            continue
        problems += _vocabulary_problems(low, prefix, config.model.vocab_size, _blend_key(cfg))
    return problems


def _blend_key(cfg: Any) -> str:
    return f"{_CFG}.{'data_path' if cfg.data_path is not None else 'train_data_path'}"


def _vocabulary_problems(low: Any, prefix: str, vocab_size: int | None, where: str) -> list[Problem]:
    max_id, tokenizer = getattr(low, "max_id", None), getattr(low, "vocab_size", None)
    if vocab_size is None:
        return []
    if max_id is not None and max_id >= vocab_size:
        return [Problem(path=where, value=vocab_size,
                        message=f"{prefix}.bin holds token ids up to {max_id}, but model.vocab_size is {vocab_size}"
                                + (f" (the data was tokenized with a vocabulary of {tokenizer})" if tokenizer else ""),
                        hint=f"set model.vocab_size to at least {max_id + 1} (the tokenizer's vocabulary size), or "
                             "preprocess the data with the model's tokenizer")]
    if tokenizer is not None and tokenizer > vocab_size:
        return [Problem(path=where, severity="warning", value=vocab_size,
                        message=f"{prefix} was tokenized with a vocabulary of {tokenizer}, larger than "
                                f"model.vocab_size {vocab_size} (its ids reach {max_id}, which fits)",
                        hint="use the model's tokenizer, or set model.vocab_size to the tokenizer's")]
    return []


def _check_epochs(gpt: Any, prefix: str, count: int | None, options: SampleOptions, max_epochs: int | None,
                  warnings: list[str]) -> None:
    """Say when sizes asks for more samples than one pass over a prefix gives (documents repeat)."""
    epochs = gpt.indices.epochs
    if epochs <= 1:
        return
    per_epoch = (gpt.indices.tokens_per_epoch - options.extra) // options.seq_length
    message = (f"{prefix}: {count} samples requested but one pass gives {per_epoch}; "
               f"{epochs} epochs will be used, so every document repeats up to {epochs} times")
    if max_epochs is not None and epochs > max_epochs:
        raise _error(f"{_LOADER}.sizes", message, count,
                     "lower sizes[0] (steps * global_batch_size) or add data")
    warnings.append(message)


# ---------------------------------------------------------------------------------------------
# What the model will see
# ---------------------------------------------------------------------------------------------
@attrs.frozen
class SampleRecord:
    """One sample as a rank's loader yields it, with where it came from in the blend."""

    position: int
    blended_index: int
    dataset: int
    dataset_sample: int
    prefix: str
    input_ids: list[int]
    labels: list[int]
    loss_mask: list[int]
    position_ids: list[int]

    def to_json(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "dataset_sample": self.dataset_sample, "input_ids": self.input_ids,
                "labels": self.labels, "loss_mask": self.loss_mask, "position_ids": self.position_ids}


def show_samples(data: TrainData, n: int, *, start: int = 0) -> list[SampleRecord]:
    """The first ``n`` samples the loader of ``data`` yields from sample position ``start`` of its epoch.

    Build ``data`` with ``build_train_dataset(..., dp_rank=R)`` to see rank R's samples.
    """
    loader = data.loader
    ids = loader.sample_ids[: len(loader) * loader.local_batch_size] if loader.drop_remainder else loader.sample_ids
    if start < 0 or (len(ids) and start >= len(ids)):
        raise InputError(message=f"start position {start} is outside the {len(ids)} samples rank "
                         f"{loader.dp_rank} reads per epoch", hint=f"use a start in 0..{max(len(ids) - 1, 0)}")
    out = []
    for pos in range(start, min(start + n, len(ids))):
        k = int(ids[pos])
        d, j = data.dataset.source(k)
        s = data.dataset[k]
        out.append(SampleRecord(position=pos, blended_index=k, dataset=d, dataset_sample=j,
                                prefix=data.sources[d].prefix, input_ids=s["input_ids"].tolist(),
                                labels=s["labels"].tolist(), loss_mask=s["loss_mask"].tolist(),
                                position_ids=s["position_ids"].tolist()))
    return out


def steps_per_epoch(data: TrainData, global_batch_size: int) -> int:
    """Optimizer steps one pass of the loader covers (micro-batches · dp · lbs / gbs)."""
    loader = data.loader
    return math.floor(len(loader) * loader.dp_size * loader.local_batch_size / global_batch_size)
