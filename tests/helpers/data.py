"""Data test helpers: a tiny byte-level BPE trained in milliseconds, and an independent .bin/.idx reader."""
from __future__ import annotations

import struct


CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Pack my box with five dozen liquor jugs.",
    "How vexingly quick daft zebras jump!",
    "Sphinx of black quartz, judge my vow. Ünïcödé façade naïve café — 東京 😀",
] * 20


def make_tokenizer(path, vocab_size=300):
    """A byte-level BPE with <|endoftext|> as id 0, saved to ``path`` (a tokenizer.json)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.save(str(path))
    return tok


def read_pair(prefix):
    """Independent `.idx/.bin` reader (struct + plain bytes, no mftk code): returns
    (dtype code, sequences as lists, document_indices)."""
    idx = open(f"{prefix}.idx", "rb").read()
    binary = open(f"{prefix}.bin", "rb").read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    version, code, n, d = struct.unpack_from("<QBQQ", idx, 9)
    assert version == 1
    lengths = struct.unpack_from(f"<{n}i", idx, 34)
    pointers = struct.unpack_from(f"<{n}q", idx, 34 + 4 * n)
    docs = list(struct.unpack_from(f"<{d}q", idx, 34 + 12 * n))
    fmt, size = {8: ("H", 2), 4: ("i", 4)}[code]
    seqs = [list(struct.unpack_from(f"<{ln}{fmt}", binary, p)) for ln, p in zip(lengths, pointers)]
    assert len(binary) == sum(lengths) * size
    assert len(idx) == 34 + 12 * n + 8 * d
    return code, seqs, docs
