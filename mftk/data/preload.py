"""The tokenizers of an `mftk preprocess` run, loading from the moment the command starts.

Loading a tokenizer is Rust that holds the GIL (gigatoken 0.07-0.1 s, HF ``tokenizers`` 0.06-0.16 s
on the 2-core machine: each parses the ``tokenizer.json``), so a load on a thread here delays the
data layer's imports (numpy, msgspec) by as much. gigatoken's, which the run encodes with, loads on
a thread from the first line of the command, and encodes a word there (`gigatoken_ids.warm_up`) so
that its set-up for encoding, which releases the GIL, runs beside the imports. The HF tokenizer, which
the run needs only for a few facts and the reference ids of the backend check, is loaded by a helper process
(`mftk.data.hf_reference`) on the other core when gigatoken is wanted; with
``--tokenizer-backend hf`` (or no helper) it loads on a thread here as before. This module imports
only the standard library and `mftk.files` so that the command can start it first, and it starts the
helper before anything else.

Nothing is decided here. `mftk.data.tokenize.load_tokenizer` takes the helper's facts, or the HF
tokenizer from `hf`, only when they are there; any problem (no such file, too large, not a
tokenizer.json, an EOD token it lacks) makes the helper answer nothing, and is found and reported by
`load_tokenizer` itself, with its usual message. gigatoken's load, or its failure, is what
`gigatoken` returns or raises, and `choose_backend` decides on it as before.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from mftk.files import LARGE_JSON_LIMIT, read_bytes


def no_blas_threads() -> None:
    """One OpenBLAS thread in a preprocess process, set before numpy is first imported.

    Preprocessing does no linear algebra, but numpy's import starts OpenBLAS with a thread per core, and
    those threads spin for a while on the cores the tokenizer loads (running beside the imports) need:
    0.1 CPU-s of the whole run's ~1.0 on 2 cores (bench/preprocess.py). Once numpy is loaded the variable
    is never read again, so a process that already has it (a test session) is left alone, and a value
    the user set is kept.
    """
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def use_threads(workers: int | None) -> None:
    """``--workers``: the threads of both tokenizers' pools (read once, at each pool's first use)."""
    if workers:
        os.environ["RAYON_NUM_THREADS"] = str(workers)


def tokenizer_file(path: str | os.PathLike) -> Path:
    """The ``tokenizer.json`` that ``path`` names: the file itself, or the one in the directory."""
    p = Path(path)
    return p / "tokenizer.json" if p.is_dir() else p


class TokenizerPreload:
    """gigatoken's tokenizer loading on a thread (unless ``backend`` is ``hf``) and the HF side: with gigatoken
    wanted, a helper process (`mftk.data.hf_reference`) that loads the HF tokenizer off this process's GIL
    and computes HF's half of the backend check on a sample of ``inputs`` (patterns as the command takes
    them; ``keys`` the JSON keys); else (or with ``helper`` False) the HF tokenizer loading on a thread here."""

    def __init__(self, path: str | os.PathLike, backend: str = "auto", eod_token: str | None = None, *,
                 inputs: list[str] | None = None, keys: list[str] | None = None, helper: bool = True) -> None:
        self.file = tokenizer_file(path)
        self.eod_token = eod_token
        wants_gigatoken = backend in ("auto", "gigatoken")
        self.reference = None
        if wants_gigatoken and helper:
            from mftk.data.hf_reference import start_reference
            from mftk.data.inputs import sample_request

            self.reference = start_reference(self.file, eod_token, sample_request(inputs, keys))
        from concurrent.futures import ThreadPoolExecutor  # after the helper is started: it runs meanwhile

        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mftk-tokenizer-load")
        self._hf = pool.submit(_load_hf, self.file) if self.reference is None else None
        self._gigatoken = pool.submit(_load_gigatoken, self.file) if wants_gigatoken else None
        pool.shutdown(wait=False)

    def hf(self, file: Path) -> object | None:
        """The loaded ``tokenizers.Tokenizer`` of ``file``, or None (not this file, not preloaded, or it
        did not load)."""
        if self._hf is None or Path(file) != self.file:
            return None
        return self._hf.result()

    def facts(self, file: Path, eod_token: str | None) -> dict | None:
        """The helper's facts about ``file`` (`mftk.data.hf_reference.Reference.facts`), or None."""
        if self.reference is None or Path(file) != self.file or eod_token != self.eod_token:
            return None
        return self.reference.facts()

    def gigatoken(self, file: Path) -> tuple[bytes, object] | None:
        """(tokenizer.json bytes, gigatoken.Tokenizer) of ``file``, None if not preloaded (or another
        file); raises what the load raised."""
        if self._gigatoken is None or Path(file) != self.file:
            return None
        return self._gigatoken.result()

    def close(self) -> None:
        """End the helper process, if any."""
        if self.reference is not None:
            self.reference.close()


def _load_hf(file: Path) -> object | None:
    try:
        if not file.is_file() or file.stat().st_size > LARGE_JSON_LIMIT:
            return None  # load_tokenizer says what is wrong
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - load_tokenizer loads it again and reports the problem
        return None


def _load_gigatoken(file: Path) -> tuple[bytes, object]:
    from mftk.data.gigatoken_ids import from_json, warm_up

    data = read_bytes(file, limit=LARGE_JSON_LIMIT, what="tokenizer file")
    tokenizer = from_json(data)
    warm_up(tokenizer)
    return data, tokenizer
