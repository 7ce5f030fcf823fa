"""Both tokenizers of an `mftk preprocess` run, loaded on threads from the moment the command starts.

Loading them is 0.2-0.25 CPU-seconds of Rust that releases the GIL (HF ``tokenizers`` and
gigatoken each parse the ``tokenizer.json``); started here, before the data layer is imported
(numpy, msgspec: 0.15 CPU-seconds of Python that holds it), the loads run beside those imports and
the argument checks instead of after them. This module imports only the standard library and
`mftk.files` so that the command can start it first.

Nothing is decided here. `mftk.data.tokenize.load_tokenizer` takes the HF tokenizer from `hf`
only when it loaded; any problem (no such file, too large, not a tokenizer.json) is found and
reported by `load_tokenizer` itself, with its usual message. gigatoken's load, or its failure,
is what `gigatoken` returns or raises, and `choose_backend` decides on it as before.
"""
from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor
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
    """The HF tokenizer and (unless ``backend`` is ``hf``) gigatoken's, each loading on its own thread."""

    def __init__(self, path: str | os.PathLike, backend: str = "auto") -> None:
        self.file = tokenizer_file(path)
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mftk-tokenizer-load")
        self._hf = pool.submit(_load_hf, self.file)
        self._gigatoken = pool.submit(_load_gigatoken, self.file) if backend in ("auto", "gigatoken") else None
        pool.shutdown(wait=False)

    def hf(self, file: Path) -> object | None:
        """The loaded ``tokenizers.Tokenizer`` of ``file``, or None (not this file, or it did not load)."""
        if Path(file) != self.file:
            return None
        return self._hf.result()

    def gigatoken(self, file: Path) -> tuple[bytes, object] | None:
        """(tokenizer.json bytes, gigatoken.Tokenizer) of ``file``, None if not preloaded (or another
        file); raises what the load raised."""
        if self._gigatoken is None or Path(file) != self.file:
            return None
        return self._gigatoken.result()


def _load_hf(file: Path) -> object | None:
    try:
        if not file.is_file() or file.stat().st_size > LARGE_JSON_LIMIT:
            return None  # load_tokenizer says what is wrong
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(file))
    except Exception:  # noqa: BLE001 - load_tokenizer loads it again and reports the problem
        return None


def _load_gigatoken(file: Path) -> tuple[bytes, object]:
    import gigatoken

    data = read_bytes(file, limit=LARGE_JSON_LIMIT, what="tokenizer file")
    return data, gigatoken.Tokenizer.from_json(data)
