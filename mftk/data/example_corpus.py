"""A real-text corpus and a byte-level BPE tokenizer built from what ships with Python itself.

Why: the quick-start (and `examples/make_data.py`) must run with no network and no user files,
yet train on real prose and code rather than random tokens, so the loss curve means something.
Every `pydoc_data.topics` entry (the language-reference pages `help()` shows) comes first, then
standard-library module sources in sorted path order until ``max_chars`` characters. The order
and the gzip header are fixed, so the bytes depend only on the Python version.
"""
from __future__ import annotations

import gzip
import json
import os
import sysconfig
from pathlib import Path
from typing import Iterable

from mftk.errors import InputError

DEFAULT_MAX_CHARS = 2_600_000
DEFAULT_VOCAB = 4096
EOD = "<|endoftext|>"
# Tests, vendored and tool trees are repetitive or not Python prose; leave them out.
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "ensurepip"}


def corpus_documents(max_chars: int = DEFAULT_MAX_CHARS) -> list[dict]:
    """The documents ``{"source", "text"}``, in a fixed order: pydoc topics, then stdlib sources."""
    import pydoc_data.topics

    docs = [{"source": f"pydoc_data.topics:{k}", "text": pydoc_data.topics.topics[k]}
            for k in sorted(pydoc_data.topics.topics)]
    total = sum(len(d["text"]) for d in docs)
    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(lib.rglob("*.py"), key=lambda p: p.relative_to(lib).as_posix()):
        if total >= max_chars:
            break
        rel = path.relative_to(lib)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        text = text[: max_chars - total]
        docs.append({"source": f"stdlib:{rel.as_posix()}", "text": text})
        total += len(text)
    return docs


def write_corpus(docs: Iterable[dict], path: str | os.PathLike) -> Path:
    """Write JSON lines (gzip when the name ends in .gz, with no name and mtime 0, so the bytes
    depend only on the text); written to a temporary name and renamed when complete."""
    path = Path(path)
    data = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs).encode("utf-8")
    tmp = _tmp_name(path)
    try:
        with open(tmp, "wb") as raw:
            if path.suffix == ".gz":
                with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
                    f.write(data)
            else:
                raw.write(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def train_tokenizer(docs: list[dict], path: str | os.PathLike, vocab_size: int = DEFAULT_VOCAB) -> Path:
    """Train a byte-level BPE with ``<|endoftext|>`` as special token id 0 (the EOD) and save
    ``tokenizer.json`` plus a ``tokenizer_config.json`` naming it as eos (what preprocess reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    if vocab_size < 257:
        raise InputError(message=f"vocab_size {vocab_size} is too small for a byte-level BPE",
                         hint="use at least 257 (256 bytes + the EOD token)")
    path = Path(path)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((d["text"] for d in docs), trainer, length=len(docs))
    tmp = _tmp_name(path)
    try:
        tok.save(str(tmp), pretty=False)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    (path.parent / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": EOD, "model_max_length": 4096}, indent=1) + "\n")
    return path


def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp{os.getpid()}")
