"""Regenerate the example data in examples/data/, bit for bit, from text that ships with Python.

    python examples/make_data.py                 # writes examples/data/
    python examples/make_data.py --out /tmp/x --max-chars 200000 --vocab-size 512   # a small run

Corpus: every `pydoc_data.topics` entry (the language reference pages `help()` shows), then the
source of standard-library modules in sorted path order until ``--max-chars`` characters.
Tokenizer: a byte-level BPE trained on that corpus with `tokenizers`, ``<|endoftext|>`` as
special token (id 0, the EOD). Then ``mftk preprocess --append-eod`` (compat megatron: uint16).

The standard-library text depends on the Python version; the committed files were made with
the version recorded in ``examples/data/SOURCE.json`` (a different version gives other bytes).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
import sysconfig
from pathlib import Path

DEFAULT_MAX_CHARS = 2_600_000
DEFAULT_VOCAB = 4096
EOD = "<|endoftext|>"
SKIP_DIRS = {"test", "tests", "idlelib", "lib2to3", "site-packages", "dist-packages", "__pycache__", "ensurepip"}


def corpus_documents(max_chars: int) -> list[dict]:
    """The documents, in a fixed order: pydoc topics, then stdlib sources by sorted path."""
    import pydoc_data.topics

    docs = [{"source": f"pydoc_data.topics:{k}", "text": pydoc_data.topics.topics[k]}
            for k in sorted(pydoc_data.topics.topics)]
    total = sum(len(d["text"]) for d in docs)
    lib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(lib.rglob("*.py"), key=lambda p: p.relative_to(lib).as_posix()):
        rel = path.relative_to(lib)
        if total >= max_chars:
            break
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


def write_corpus(docs: list[dict], path: Path) -> None:
    """gzip with no name and mtime 0, so the bytes depend only on the text."""
    data = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in docs).encode("utf-8")
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
        f.write(data)


def train_tokenizer(docs: list[dict], vocab_size: int, path: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=[EOD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((d["text"] for d in docs), trainer, length=len(docs))
    tok.save(str(path), pretty=False)
    (path.parent / "tokenizer_config.json").write_text(json.dumps({"eos_token": EOD, "model_max_length": 4096},
                                                                  indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data")
    parser.add_argument("--max-chars", type=int, default=DEFAULT_MAX_CHARS)
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without install
    from mftk.data.preprocess import preprocess

    args.out.mkdir(parents=True, exist_ok=True)
    docs = corpus_documents(args.max_chars)
    corpus = args.out / "corpus.jsonl.gz"
    write_corpus(docs, corpus)
    train_tokenizer(docs, args.vocab_size, args.out / "tokenizer.json")
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
