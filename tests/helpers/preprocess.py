"""Preprocess test helpers: sample documents, a literal port of the reference scripts' writer, file readers."""
from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path




DOCS = [
    {"text": "The quick brown fox jumps over the lazy dog."},
    {"text": ""},
    {"text": ["Pack my box", "", "with five dozen liquor jugs."]},
    {"text": "Ünïcödé café 東京 😀 <|endoftext|> literal special token"},
    {"text": []},
    {"text": ["", ""]},
    {"text": "How vexingly quick daft zebras jump!\n\twith\r\nwhitespace  "},
]


def reference_write(prefix, tokenizer_file, docs, compat, append_eod, eod=0):
    """A literal per-document port of Megatron/MindFormers preprocess_data.py + IndexedDatasetBuilder."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    lengths, tokens, doc_idx = [], [], [0]
    for d in docs:
        text = d["text"]
        sentences = text if isinstance(text, list) else [text]
        doc_ids, sentence_lens = [], []
        for s in sentences:
            ids = tok.encode(s).ids
            if compat == "mindformers" or len(ids) > 0:
                doc_ids.extend(ids)
                sentence_lens.append(len(ids))
        if len(doc_ids) > 0 and append_eod:
            doc_ids.append(eod)
            sentence_lens[-1] += 1
        tokens.extend(doc_ids)
        lengths.extend(sentence_lens)
        doc_idx.append(len(lengths))
    fmt, size, code = ("H", 2, 8) if compat == "megatron" else ("i", 4, 4)
    ptrs, p = [], 0
    for n in lengths:
        ptrs.append(p)
        p += n * size
    idx = (b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_idx))
           + struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(ptrs)}q", *ptrs)
           + struct.pack(f"<{len(doc_idx)}q", *doc_idx))
    return idx, struct.pack(f"<{len(tokens)}{fmt}", *tokens)


def write_jsonl(path, docs):
    path.write_text("".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs), encoding="utf-8")
    return path


def files(prefix):
    return open(f"{prefix}.idx", "rb").read(), open(f"{prefix}.bin", "rb").read()


class Boom:
    """A progress sink that raises KeyboardInterrupt after ``n`` advances (simulated Ctrl-C)."""

    def __init__(self, n):
        self.n = n

    def start(self, label, total=None):
        pass

    def advance(self, n=1, **info):
        self.n -= 1
        if self.n < 0:
            raise KeyboardInterrupt

    def done(self):
        pass


EXAMPLES = Path(__file__).resolve().parents[2] / "mftk" / "templates" / "data"


def example_corpus(tmp_path) -> tuple[Path, list[dict]]:
    raw = gzip.decompress((EXAMPLES / "corpus.jsonl.gz").read_bytes())
    docs = [json.loads(line) for line in raw.decode().splitlines()]
    return write_jsonl(tmp_path / "example.jsonl", docs), docs
