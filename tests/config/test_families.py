"""The family table's facts against transformers, an independent source: each family's HF model type is the one
whose causal-LM class is the family's architecture, and its attention modules have the parts the facts claim."""
from __future__ import annotations

import importlib
import inspect

import pytest

from mftk.config.families import FAMILIES, MODEL_TYPES

transformers = pytest.importorskip("transformers")


def _modeling_source(hf_model_type: str) -> str:
    return inspect.getsource(importlib.import_module(f"transformers.models.{hf_model_type}.modeling_{hf_model_type}"))


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_the_hf_model_type_names_the_family_architecture(family):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    assert MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family.hf_model_type] == family.architectures[0]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_attention_facts_match_the_hf_modules(family):
    source = _modeling_source(family.hf_model_type)
    assert family.mla == ("kv_a_proj_with_mqa" in source)  # MLA's joint KV down-projection
    assert family.qk_norm == ("self.q_norm" in source and "self.k_norm" in source)  # per-head q/k RMSNorm


def test_every_model_type_reads_its_family_row():
    assert MODEL_TYPES["deepseek_mtp"].hf_model_type == "deepseek_v3"  # the MTP type exports as DeepSeek-V3
    assert {f.attention for f in FAMILIES} == {"gqa", "mla", "csa"}
