"""Tokenizer loading and batched encoding into flat numpy token arrays, with two backends.

- ``hf``: the Rust `tokenizers` library (no `transformers`, no download). Its ids are what
  ``transformers``' fast tokenizer returns for ``tokenizer(text).input_ids`` (what the reference
  preprocessing scripts call), because both run the same encoder with special tokens added.
- ``gigatoken``: the `gigatoken` package (what Megatron-LM's ``preprocess_data_fast.py`` uses),
  20-40x faster and returning one token array per batch instead of a Python object per token.
  It does not run the tokenizer's post-processor, so the special tokens that post-processor adds
  (a BOS, say) are derived from the HF tokenizer and added here.

gigatoken is only used when it reproduces the HF tokenizer exactly, and that is checked, not
assumed: `choose_backend` encodes a sample of the actual input plus `EDGE_CASES` with both and
compares every id; on any difference (or a tokenizer gigatoken cannot load) ``auto`` falls back
to ``hf`` and records why, so the run's summary can say so. The slow half of the check (HF's
encoding of the same texts) finishes on a thread while the run starts (`BackendCheck`); its
verdict is confirmed before anything gigatoken encoded is kept.
"""
from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Protocol

import numpy as np

from mftk.data import gigatoken_ids, hf_reference
from mftk.data.gigatoken_ids import encode_batch_arrays
from mftk.data.hf_reference import EDGE_CASES, EOD_CANDIDATES, NoSuchToken, check_cases, resolve_eod
from mftk.data.preload import TokenizerPreload, tokenizer_file
from mftk.errors import DataFormatError, InputError
from mftk.files import LARGE_JSON_LIMIT, read_bytes, regular_file_or_error

__all__ = ["EDGE_CASES", "EOD_CANDIDATES", "BackendCheck", "BackendMismatch", "HFEncoder", "GigatokenEncoder",
           "LoadedTokenizer", "choose_backend", "load_tokenizer"]
BACKENDS = ("auto", "gigatoken", "hf")

class Encoder(Protocol):
    """Turns texts into (flat uint32 ids of every text in order, int64 length of each)."""

    name: str

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]: ...


class HFEncoder:
    """`tokenizers` ``encode_batch_fast`` on its own thread pool (GIL released), special tokens added.

    ``tokenizer``: a ``tokenizers.Tokenizer``, or the `LoadedTokenizer` whose HF tokenizer (loaded
    on first use) it is."""

    name = "hf"

    def __init__(self, tokenizer) -> None:
        self._source = tokenizer

    @property
    def tokenizer(self):
        source = self._source
        return source.tokenizer if isinstance(source, LoadedTokenizer) else source

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        ids = self.encode_lists(texts)
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.uint32, count=int(lengths.sum()))
        return flat, lengths

    def encode_lists(self, texts: list[str]) -> list[list[int]]:
        return hf_reference.encode_lists(self.tokenizer, texts)


class GigatokenEncoder:
    """`gigatoken` ``encode_batch``: the batch's ids stay one array (offsets + content), never lists.

    gigatoken memoizes the ids of every distinct piece of text it has seen, per tokenizer object,
    without a bound: text with many unique words (code, URLs, hashes) grows it by several times
    the text's size. The tokenizer is therefore loaded afresh (which drops the memo and changes
    no id) whenever the process has grown ``memo_budget`` bytes since the last load, as seen each
    ``check_every`` ids encoded (2 M ids, ~8 MB of text: reading the RSS lets the GIL go, and taking it
    back from the thread parsing the next chunk costs up to a switch interval, at every check).
    """

    name = "gigatoken"

    def __init__(self, tokenizer_json: bytes, prefix: list[int], suffix: list[int], *,
                 memo_budget: int = 256 << 20, check_every: int = 1 << 21, loaded=None) -> None:
        self._json = tokenizer_json
        self.prefix = np.asarray(prefix, dtype=np.uint32)
        self.suffix = np.asarray(suffix, dtype=np.uint32)
        self.memo_budget = memo_budget
        self.check_every = check_every
        self._unchecked = 0  # ids encoded since the last look at the RSS (concurrent updates may miss a few)
        self.reloads = 0
        self._tok = None
        self._lock = threading.Lock()  # one reload at a time
        if loaded is None:
            self._load()
        else:  # built from these bytes by `TokenizerPreload`
            self._tok = loaded
            self._rss_at_load = _rss()

    def _load(self) -> None:
        if self._tok is not None:
            self._tok = None  # the old memo goes before the new tokenizer is built
            _return_freed_memory()
        self._tok = gigatoken_ids.from_json(self._json)
        self._rss_at_load = _rss()

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.uint32), np.zeros(0, np.int64)
        tok = self._tok  # batches of several threads run at once; a reload waits for none of them
        flat, lengths = encode_batch_arrays(tok.encode_batch, texts)  # parallel unless in a forked worker
        self._unchecked += len(flat)
        if self._unchecked >= self.check_every:
            self._unchecked = 0
            if _rss() - self._rss_at_load > self.memo_budget:
                with self._lock:
                    if self._tok is tok:  # not reloaded by another thread meanwhile
                        self.reloads += 1
                        self._load()
        if len(self.prefix) or len(self.suffix):
            flat, lengths = wrap_sequences(flat, lengths, self.prefix, self.suffix)
        return flat.astype(np.uint32, copy=False), lengths

    def encode_lists(self, texts: list[str]) -> list[list[int]]:
        flat, lengths = self.encode(texts)
        return [a.tolist() for a in np.split(flat, np.cumsum(lengths)[:-1])] if len(texts) else []


def _rss() -> int:
    """Resident set size of this process in bytes (0 where /proc is missing: then never reloads)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _return_freed_memory() -> None:
    """Ask glibc to give freed heap back to the system (``malloc_trim``; a no-op elsewhere).

    Without it the memory of a dropped memo stays in the allocator's per-thread arenas and the
    process keeps growing by part of it at every reload.
    """
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def wrap_sequences(flat: np.ndarray, lengths: np.ndarray, prefix: np.ndarray,
                   suffix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Put ``prefix`` before and ``suffix`` after every sequence of a flat batch, vectorised."""
    p, s = len(prefix), len(suffix)
    n = len(lengths)
    new_lengths = lengths + p + s
    out = np.empty(int(new_lengths.sum()), dtype=flat.dtype)
    starts = np.zeros(n, dtype=np.int64)
    if n > 1:
        np.cumsum(new_lengths[:-1], out=starts[1:])
    body = np.ones(len(out), dtype=bool)
    for j in range(p):
        out[starts + j] = prefix[j]
        body[starts + j] = False
    for j in range(s):
        pos = starts + new_lengths - s + j
        out[pos] = suffix[j]
        body[pos] = False
    out[body] = flat
    return out, new_lengths


class LoadedTokenizer:
    """A tokenizer ready to encode, with the facts the output depends on and the backend in use."""

    def __init__(self, hf_tokenizer: object | None, path: str, vocab_size: int, eod_id: int | None,
                 eod_token: str | None, *, facts: dict | None = None, reference: object = None) -> None:
        # tokenizers.Tokenizer; None until first needed where `facts` came from the helper
        self.hf_tokenizer = hf_tokenizer
        self.path = path
        self.vocab_size = vocab_size  # including added tokens, as Megatron's len(hf_tokenizer)
        self.eod_id = eod_id
        self.eod_token = eod_token
        self.encoder: Encoder = HFEncoder(self)
        self.backend_note = ""  # why auto did not take gigatoken, or the check that it passed
        # From the helper process (`mftk.data.hf_reference`): what `hf_reference.facts_of` says of the HF tokenizer.
        self.facts = facts
        self.reference = reference  # that helper (`hf_reference.Reference`), which also gives the check's HF ids
        self._hf_lock = threading.Lock()

    @property
    def tokenizer(self):
        """The ``tokenizers.Tokenizer`` (vocabulary facts, the reference), loaded here on first use if the
        helper process gave the facts."""
        with self._hf_lock:
            if self.hf_tokenizer is None:
                from tokenizers import Tokenizer

                self.hf_tokenizer = Tokenizer.from_file(self.path)
            return self.hf_tokenizer

    def hf_facts(self) -> dict:
        """`hf_reference.facts_of` the HF tokenizer: from the helper, else computed here."""
        if self.facts is None:
            self.facts = hf_reference.facts_of(self.tokenizer)
        return self.facts

    @property
    def backend(self) -> str:
        return self.encoder.name

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat uint32 ids of every text, int64 length of each), special tokens added."""
        return self.encoder.encode(texts)


def load_tokenizer(path: str | os.PathLike, eod_token: str | None = None,
                   preload: TokenizerPreload | None = None) -> LoadedTokenizer:
    """Load ``tokenizer.json`` (or a directory holding one) and resolve the EOD id; backend ``hf``.

    ``preload``: the tokenizers already loading (`TokenizerPreload`); its helper process's facts are
    used when it gave them (the HF tokenizer is then loaded in this process only if needed), else its
    HF tokenizer when it loaded.

    The EOD token is, in order: ``eod_token``; the ``eos_token`` of a ``tokenizer_config.json``
    next to it (what Megatron's HF tokenizer uses as ``eod``); the first of
    `EOD_CANDIDATES` the vocabulary holds; else None (then --append-eod is refused).
    """
    file = tokenizer_file(path)
    hint = "pass a Hugging Face tokenizer.json or the directory that holds it (nothing is downloaded)"
    try:
        size = regular_file_or_error(file, what="tokenizer file", hint=hint).st_size
    except FileNotFoundError:
        raise InputError(message=f"{file}: no such tokenizer file", path=str(file), hint=hint) from None
    if size > LARGE_JSON_LIMIT:
        raise InputError(message=f"{file}: {size:,} bytes is not a tokenizer.json (limit {LARGE_JSON_LIMIT:,})",
                         path=str(file), hint=hint)
    facts = preload.facts(file, eod_token) if preload is not None else None
    if facts is not None:
        return LoadedTokenizer(None, str(file), facts["vocab_size"], facts["eod_id"], facts["eod_token"],
                               facts=facts, reference=preload.reference)
    try:
        tok = preload.hf(file) if preload is not None else None
        if tok is None:
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a plain Exception for any parse error
        raise DataFormatError(message=f"{file}: not a Hugging Face tokenizer.json ({str(exc)[:200]})",
                              path=str(file), hint="pass the tokenizer.json written by the `tokenizers` "
                              "library or transformers' save_pretrained") from None
    try:
        eod_token, eod_id = resolve_eod(tok, file, eod_token)
    except NoSuchToken:
        raise InputError(message=f"{file}: the tokenizer has no token {eod_token!r}", path=str(file),
                         hint="pass --eod-token with a token from its vocabulary, e.g. <|endoftext|>") from None
    return LoadedTokenizer(tok, str(file), tok.get_vocab_size(with_added_tokens=True), eod_id, eod_token)


class BackendMismatch(Exception):
    """gigatoken's ids differed from HF's on the check: the run must start over with HF tokenizers.

    Raised by `BackendCheck.confirm` in ``auto`` mode (``tok.encoder`` is HF by then); never leaves
    `mftk.data.preprocess`, which discards what was written and runs again.
    """


class BackendCheck:
    """The verdict on gigatoken, reached on a thread while the run starts.

    The check texts (`mftk.data.hf_reference.check_cases`: edge cases, the added tokens, a sample of the
    input) and HF's ids for them come from the helper process, which computed them while this process
    was starting (else they are made here: the input sampled with ``sample``, the ids from the HF
    tokenizer); the check thread encodes the same texts with gigatoken and compares. None of it holds
    up the run. `confirm` takes the verdict and must be called before anything gigatoken produced is
    kept: before the first progress record is saved, before any output is finalized, and before a text
    the tokenizer failed on is rejected. On a difference (or gigatoken failing on a check text) it
    switches ``tok`` to HF and raises `BackendMismatch` (auto) or `InputError` (an explicit
    ``--tokenizer-backend gigatoken``). Once confirmed, it returns at once.
    """

    def __init__(self, tok: LoadedTokenizer | None = None, choice: str = "auto",
                 encoder: GigatokenEncoder | None = None, sample: Callable[[], list[str]] | None = None) -> None:
        self.tok, self.choice = tok, choice
        self._verdict: Future | None = None
        if tok is not None:
            pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mftk-check")
            self._verdict = pool.submit(self._compare, encoder, sample)
            pool.shutdown(wait=False)

    def _compare(self, encoder: GigatokenEncoder, sample: Callable[[], list[str]] | None) -> tuple[str | None, str]:
        """(what rules gigatoken out, or None; the note): both encodings of the check texts, compared."""
        checked = self.tok.reference.check() if self.tok.reference is not None else None
        cases, want = checked if checked is not None else (
            check_cases(self.tok.hf_facts()["added_cases"], sample() if sample else []), None)
        texts = [text for _, text in cases]
        try:
            got = encoder.encode_lists(texts)
        except Exception as exc:  # noqa: BLE001 - any failure on the check texts rules it out
            return f"gigatoken fails on the check texts ({_first_line(exc)})", ""
        if want is None:  # no helper, or it failed: HF here
            want = HFEncoder(self.tok).encode_lists(texts)
        for (name, text), a, b in zip(cases, want, got):
            if a != b:
                return f"its ids differ from HF tokenizers on {name} {_preview(text)}", ""
        inputs = hf_reference.sampled(cases)
        return None, (f"ids checked equal to HF tokenizers on {inputs} input texts and {len(cases) - inputs} "
                      "edge cases")

    def confirm(self) -> None:
        if self._verdict is None:
            return
        (problem, note), self._verdict = self._verdict.result(), None
        tok = self.tok
        if problem is not None:
            tok.encoder = HFEncoder(tok)
            _refuse(tok, self.choice, problem)
            raise BackendMismatch(tok.backend_note)
        tok.backend_note = note


NO_CHECK = BackendCheck()  # a verdict that is already final


def choose_backend(tok: LoadedTokenizer, choice: str, sample: Callable[[], list[str]] | None = None,
                   preload: TokenizerPreload | None = None) -> BackendCheck:
    """Set ``tok.encoder`` for ``choice`` (auto, gigatoken or hf); return the check still to confirm.

    ``sample`` gives text from the actual input, for a check made here (without the HF helper, which
    samples the input itself). ``auto`` falls back to HF with the reason in ``tok.backend_note``; an
    explicit ``gigatoken`` that cannot reproduce HF is an error. ``preload``: the tokenizers already
    loading (`TokenizerPreload`); gigatoken's is built here if not. What is known at once (truncation
    or padding, a post-processor that does more than add fixed tokens, gigatoken missing or unable to
    load the tokenizer) is decided here; the encoding and comparison of the check texts is the
    returned `BackendCheck`, which the caller confirms before keeping anything
    (`BackendCheck.confirm`; ``choose_backend(...).confirm()`` waits for it).
    """
    if choice not in BACKENDS:
        raise InputError(message=f"--tokenizer-backend must be one of {', '.join(BACKENDS)}, not {choice!r}")
    tok.encoder = HFEncoder(tok)
    if choice == "hf":
        tok.backend_note = "chosen with --tokenizer-backend hf"
        return NO_CHECK
    encoder, problem = _gigatoken_candidate(tok, preload)
    if encoder is None:
        _refuse(tok, choice, problem)
        return NO_CHECK
    tok.encoder = encoder
    tok.backend_note = "check pending"
    return BackendCheck(tok, choice, encoder, sample)


def _refuse(tok: LoadedTokenizer, choice: str, problem: str) -> None:
    """gigatoken cannot be used: an error if it was asked for, else the reason in the summary."""
    if choice == "gigatoken":
        raise InputError(message=f"{tok.path}: --tokenizer-backend gigatoken cannot be used: {problem}",
                         path=tok.path, hint="use --tokenizer-backend auto (falls back to HF tokenizers) or hf")
    tok.backend_note = f"gigatoken not used: {problem}"


def _gigatoken_candidate(tok: LoadedTokenizer, preload: TokenizerPreload | None
                         ) -> tuple[GigatokenEncoder | None, str]:
    """(gigatoken encoder, ""), or (None, why it cannot be used)."""
    facts = tok.hf_facts()
    if facts["truncation_or_padding"]:
        return None, "the tokenizer.json enables truncation or padding"
    if not gigatoken_ids.installed():
        return None, "the gigatoken package is not installed"
    wrap = facts["wrap"]
    if wrap is None:
        return None, "its post-processor does more than add fixed special tokens around the text"
    try:
        loaded = preload.gigatoken(Path(tok.path)) if preload is not None else None
        if loaded is None:
            encoder = GigatokenEncoder(read_bytes(tok.path, limit=LARGE_JSON_LIMIT, what="tokenizer file"), *wrap)
        else:
            encoder = GigatokenEncoder(loaded[0], *wrap, loaded=loaded[1])
    except ImportError:
        return None, "the gigatoken package is not installed"
    except Exception as exc:  # noqa: BLE001 - gigatoken raises plain RuntimeErrors for unsupported parts
        return None, f"gigatoken cannot load it ({_first_line(exc)})"
    return encoder, ""


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _preview(text: str) -> str:
    shown = text if len(text) <= 40 else text[:40] + "…"
    return repr(shown) + (f" ({len(text)} characters)" if len(text) > 40 else "")
