"""`mftk/data/example_corpus.py`: deterministic corpus files and the tokenizer `examples/make_data.py` made."""
import gzip
import hashlib
import json
import sys
from pathlib import Path

import pytest

from mftk.data import example_corpus as ec
from mftk.errors import InputError

SOURCE = Path(__file__).resolve().parents[2] / "mftk/templates/data/SOURCE.json"


def test_documents_start_with_pydoc_topics_and_stop_at_max_chars():
    import pydoc_data.topics

    topics = pydoc_data.topics.topics
    budget = sum(map(len, topics.values())) + 5000
    docs = ec.corpus_documents(budget)
    assert [d["source"] for d in docs[: len(topics)]] == [f"pydoc_data.topics:{k}" for k in sorted(topics)]
    assert sum(len(d["text"]) for d in docs) == budget  # the last source is cut to fit exactly
    assert all(d["source"].startswith("stdlib:") and "/test/" not in d["source"] for d in docs[len(topics):])


def test_write_corpus_plain_and_gzip_are_deterministic(tmp_path):
    docs = [{"source": "a", "text": "héllo\n"}, {"source": "b", "text": "x"}]
    plain = ec.write_corpus(docs, tmp_path / "c.jsonl")
    assert [json.loads(line) for line in plain.read_text(encoding="utf-8").splitlines()] == docs
    first = ec.write_corpus(docs, tmp_path / "c.jsonl.gz").read_bytes()
    assert first == ec.write_corpus(docs, tmp_path / "d.jsonl.gz").read_bytes()  # no name, mtime 0
    assert gzip.decompress(first) == plain.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "c.jsonl.gz", "d.jsonl.gz"]  # no temp left


def test_tokenizer_too_small_vocab(tmp_path):
    with pytest.raises(InputError) as exc:
        ec.train_tokenizer([{"text": "abc"}], tmp_path / "tokenizer.json", vocab_size=100)
    assert "at least 257" in exc.value.hint and not (tmp_path / "tokenizer.json").exists()


@pytest.mark.skipif(not SOURCE.is_file() or json.loads(SOURCE.read_text())["python"] != sys.version.split()[0],
                    reason="mftk/templates/data was made with another Python version")
def test_same_bytes_as_the_committed_example_data(tmp_path):
    """The committed example data (examples/make_data.py) is the reference: same corpus, same tokenizer."""
    source = json.loads(SOURCE.read_text())
    docs = ec.corpus_documents(source["max_chars"])
    ec.write_corpus(docs, tmp_path / "corpus.jsonl.gz")
    ec.train_tokenizer(docs, tmp_path / "tokenizer.json", source["vocab_size"])
    for name in ("corpus.jsonl.gz", "tokenizer.json", "tokenizer_config.json"):
        assert hashlib.sha256((tmp_path / name).read_bytes()).hexdigest() == source["sha256"][name], name
