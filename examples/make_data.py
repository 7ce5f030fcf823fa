"""Regenerate the example data in mftk/templates/data/, bit for bit, from text that ships with Python.

    python examples/make_data.py                 # writes mftk/templates/data/
    python examples/make_data.py --out /tmp/x --max-chars 200000 --vocab-size 512   # a small run

Corpus: every `pydoc_data.topics` entry (the language reference pages `help()` shows), then the
source of standard-library modules in sorted path order until ``--max-chars`` characters.
Tokenizer: a byte-level BPE trained on that corpus with `tokenizers`, ``<|endoftext|>`` as
special token (id 0, the EOD). Then ``mftk preprocess --append-eod`` (compat megatron: uint16).

The standard-library text depends on the Python version; the committed files were made with
the version recorded in ``mftk/templates/data/SOURCE.json`` (a different version gives other bytes).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without install

from mftk.data.example_corpus import (DEFAULT_MAX_CHARS, DEFAULT_VOCAB, corpus_documents,  # noqa: E402
                                      train_tokenizer, write_corpus)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "mftk" / "templates" / "data")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB)
    args = parser.parse_args(argv)
    from mftk.data.preprocess import preprocess

    args.out.mkdir(parents=True, exist_ok=True)
    docs = corpus_documents(args.max_chars)
    corpus = args.out / "corpus.jsonl.gz"
    write_corpus(docs, corpus)
    train_tokenizer(docs, args.out / "tokenizer.json", args.vocab_size)
    summary = preprocess([str(corpus)], str(args.out / "example"), args.out / "tokenizer.json", append_eod=True,
                         compat="megatron")
    files = sorted(p.name for p in args.out.iterdir() if p.name != "SOURCE.json")
    source = {
        "python": sys.version.split()[0],
        "max_chars": args.max_chars, "vocab_size": args.vocab_size,
        "documents": summary.sources[0].documents, "tokens": summary.tokens, "eod_id": summary.eod_id,
        "sha256": {name: hashlib.sha256((args.out / name).read_bytes()).hexdigest() for name in files},
    }
    (args.out / "SOURCE.json").write_text(json.dumps(source, indent=1) + "\n")
    print(f"{args.out}: {source['documents']} documents, {source['tokens']:,} tokens, EOD id {summary.eod_id}")


if __name__ == "__main__":
    main()
