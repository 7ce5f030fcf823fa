"""Engine test fixtures: a tiny token corpus shared by the session."""
from pathlib import Path

import pytest

from tests.engine.tiny import write_corpus


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny_text_document")
