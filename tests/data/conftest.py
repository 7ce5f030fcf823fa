"""Data test fixtures (the helpers behind them are in tests/helpers/data.py)."""
from __future__ import annotations

import pytest

from tests.helpers.data import make_tokenizer


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    make_tokenizer(path)
    return path
