"""examples/make_data.py regenerates the committed example data bit for bit."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from mftk.data.indexed import IndexedDataset
from tests.helpers.data import read_pair

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "mftk" / "templates" / "data"
sys.path.insert(0, str(ROOT / "examples"))
import make_data  # noqa: E402


def _hashes(d: Path) -> dict:
    # files only: a training run may leave an index cache directory next to the data
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


def test_small_run_is_deterministic_and_valid(tmp_path):
    args = ["--max-chars", "60000", "--vocab-size", "400"]
    make_data.main(["--out", str(tmp_path / "a"), *args])
    make_data.main(["--out", str(tmp_path / "b"), *args])
    assert _hashes(tmp_path / "a") == _hashes(tmp_path / "b")
    ds = IndexedDataset(tmp_path / "a" / "example_text_document")
    code, seqs, docs = read_pair(tmp_path / "a" / "example_text_document")
    assert code == 8 and all(s[-1] == 0 for s in seqs) and len(seqs) == len(ds)


def test_committed_data_is_consistent():
    source = json.loads((DATA / "SOURCE.json").read_text())
    for name, digest in source["sha256"].items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name
    ds = IndexedDataset(DATA / "example_text_document")
    assert ds.total_tokens == source["tokens"] and 500_000 <= ds.total_tokens <= 1_500_000
    assert sum(p.stat().st_size for p in DATA.iterdir() if p.is_file()) < 5 * 2**20


@pytest.mark.slow
def test_full_regeneration_bit_for_bit(tmp_path):
    source = json.loads((DATA / "SOURCE.json").read_text())
    if sys.version.split()[0] != source["python"]:
        pytest.skip(f"the committed data was made with Python {source['python']}")
    make_data.main(["--out", str(tmp_path)])
    assert _hashes(tmp_path) == _hashes(DATA)
