"""Hugging Face `tokenizers` loading and batched encoding into flat numpy token arrays.

Only the Rust `tokenizers` library is used (no `transformers`, no download): its
``encode_batch_fast`` runs the batch on its own thread pool with the GIL released, so the
Python side can parse the next batch meanwhile. Ids are identical to what
``transformers``' fast tokenizer returns for ``tokenizer(text).input_ids`` (the reference
preprocessing scripts), because both call the same Rust encoder with special tokens added.
"""
from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import attrs
import numpy as np

from mftk.errors import DataFormatError, InputError

# Tried in order when neither --eod-token nor tokenizer_config.json names the end-of-document token.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>")


@attrs.define
class LoadedTokenizer:
    """A tokenizer ready to encode, with the facts the output depends on."""

    tokenizer: object  # tokenizers.Tokenizer
    path: str
    vocab_size: int  # including added tokens, as Megatron's len(hf_tokenizer)
    eod_id: int | None
    eod_token: str | None

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(flat int64 ids of every text, int32 length of each), special tokens added."""
        tok = self.tokenizer
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)
        ids = [e.ids for e in encode(texts, add_special_tokens=True)]
        lengths = np.fromiter(map(len, ids), dtype=np.int32, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lengths.sum()))
        return flat, lengths


def load_tokenizer(path: str | os.PathLike, eod_token: str | None = None) -> LoadedTokenizer:
    """Load ``tokenizer.json`` (or a directory holding one) and resolve the EOD id.

    The EOD token is, in order: ``eod_token``; the ``eos_token`` of a ``tokenizer_config.json``
    next to it (what Megatron's HF tokenizer uses as ``eod``); the first of
    `EOD_CANDIDATES` the vocabulary holds; else None (then --append-eod is refused).
    """
    from tokenizers import Tokenizer

    p = Path(path)
    file = p / "tokenizer.json" if p.is_dir() else p
    if not file.is_file():
        raise InputError(message=f"{file}: no such tokenizer file", path=str(file),
                         hint="pass a Hugging Face tokenizer.json or the directory that holds it "
                         "(nothing is downloaded)")
    try:
        tok = Tokenizer.from_file(str(file))
    except Exception as exc:  # the Rust side raises a plain Exception for any parse error
        raise DataFormatError(message=f"{file}: not a Hugging Face tokenizer.json ({str(exc)[:200]})",
                              path=str(file), hint="pass the tokenizer.json written by the `tokenizers` "
                              "library or transformers' save_pretrained") from None
    if eod_token is None:
        eod_token = _config_eos(file.parent / "tokenizer_config.json")
        if eod_token is not None and tok.token_to_id(eod_token) is None:
            eod_token = None
    if eod_token is None:
        eod_token = next((t for t in EOD_CANDIDATES if tok.token_to_id(t) is not None), None)
        eod_id = tok.token_to_id(eod_token) if eod_token else None
    else:
        eod_id = tok.token_to_id(eod_token)
        if eod_id is None:
            raise InputError(message=f"{file}: the tokenizer has no token {eod_token!r}", path=str(file),
                             hint="pass --eod-token with a token from its vocabulary, e.g. <|endoftext|>")
    return LoadedTokenizer(tok, str(file), tok.get_vocab_size(with_added_tokens=True), eod_id, eod_token)


def _config_eos(config: Path) -> str | None:
    if not config.is_file():
        return None
    try:
        value = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None
