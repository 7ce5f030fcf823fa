"""Fixtures shared by the whole suite. Helpers that are not fixtures live in ``tests/helpers/``.

MindSpore is imported only inside the fixtures that need it, so config/data/plan tests collect fast.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A tiny learnable token corpus (.bin/.idx, vocab 256), written once per session."""
    from tests.helpers.tiny import write_corpus

    return write_corpus(tmp_path_factory.mktemp("corpus") / "tiny_text_document")


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture
def tiny_qwen3():
    """Factory: a tiny Qwen3 config; keyword overrides."""
    from tests.helpers.models import make_qwen3

    return make_qwen3


@pytest.fixture
def tiny_dsv3():
    """Factory: a tiny DeepSeek-V3 config with MoE (group-limited, biased), MLA, YaRN and MTP on."""
    from tests.helpers.models import make_dsv3

    return make_dsv3


@pytest.fixture
def gradcheck():
    """``gradcheck(fn, params, rng)``: autograd vs central finite differences along a random direction."""
    from tests.helpers.models import directional_check

    return directional_check


@pytest.fixture
def tiny_dsv4():
    """Factory: a tiny DeepSeek-V4 (sliding + hash-routed, CSA with indexer, HCA, MTP; 4 residual streams)."""
    from tests.helpers.models import make_dsv4

    return make_dsv4


@pytest.fixture
def tiny_qwen3_moe():
    """Factory: a tiny Qwen3-MoE (one dense layer, softmax-routed experts)."""
    from tests.helpers.models import make_qwen3_moe

    return make_qwen3_moe


@pytest.fixture
def node_port():
    """A port range claimed for the whole test, for the two "nodes" it starts on this host: node 0 takes the claim
    over (`ports.CLAIM_ENV`, with ``claim.env`` and ``claim.fds``), so no other job can take the port between the
    pick and node 0's start."""
    from mftk.engine.ports import claim_free_range

    with claim_free_range() as claim:
        yield claim
