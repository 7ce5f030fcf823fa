"""One problem per YAML path (issue 38): every rule has one owner, so no shipped, converted or hostile YAML gets two
problems — of any severity — at the same path. Two would mean two modules check one fact (the case of issue 36:
``normalization`` refused by both the status table and the model grammar).

The YAMLs: every shipped template; every static config converted by `convert-config` (the mindformers 2.1.0
wheel's own, when installed, and the ones written from its schema in `static_yamls.py`); and hostile ones: every
number-typed field at NaN, an absurd magnitude and -1 (the enumeration of tests/hostile/test_numbers.py),
a misspelt key in every section, keys with markup, refused and unsupported model settings, a layout per parallel
dimension that the world size cannot hold.
"""
from __future__ import annotations

import collections
import copy
import functools
import math
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from mftk.config.convert import convert_file, convert_static
from mftk.config.load import load_data
from mftk.errors import ConfigError
from tests.config.static_yamls import STATIC
from tests.helpers.hostile_numbers import FAMILY_OF_TEMPLATE, number_cases, set_path, yaml_path
from tests.helpers.mf21 import wheel_train_configs

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((ROOT / "mftk" / "templates").glob("*.yaml"))


def problems_of(data: dict, world_size: int = 1) -> list:
    """Every problem validate-config gives ``data`` (files not checked), whatever its severity."""
    try:
        return load_data(copy.deepcopy(data), source="t.yaml", world_size=world_size, check_files=False).notes
    except ConfigError as exc:
        return exc.problems


def doubled(problems: list) -> dict[str, list[str]]:
    """Path → the rendered problems, for every path with more than one."""
    count = collections.Counter(p.path for p in problems)
    return {path: [p.render() for p in problems if p.path == path] for path, n in count.items() if n > 1}


@functools.cache
def _template_once(name: str) -> dict:
    return yaml.safe_load((ROOT / "mftk" / "templates" / f"{name}.yaml").read_text())


def _template(name: str) -> dict:
    return copy.deepcopy(_template_once(name))


def _converted() -> list[tuple[str, dict, int]]:
    out = []
    for name, text in STATIC.items():
        conv = convert_static(yaml.safe_load(text))
        out.append((f"converted {name}", conv.config, conv.world_size))
    for path in wheel_train_configs():
        conv = convert_file(path)
        out.append((f"converted wheel {path.name}", conv.config, conv.world_size))
    return out


def _model_cases() -> Iterator[tuple[str, dict, int]]:
    """Model settings the grammar, the status table and the support rows could each claim."""
    base = _template("qwen3_tiny")
    for key, value in (("normalization", "LayerNorm"), ("fused_norm", False), ("hidden_act", "swiglu"),
                       ("hidden_act", "relu"), ("hidden_act", 3), ("normalization", None), ("fused_norm", "yes"),
                       ("rotary_percent", 0.5), ("add_bias_linear", True), ("ignore_token_id", 0),
                       ("rope_scaling", {"type": "yarn", "factor": 4.0}), ("compute_dtype", "bfloat16"),
                       ("use_eod_attn_mask_compression", True), ("multi_latent_attention", True),
                       ("calculate_per_token_loss", True), ("gated_linear_unit", False)):
        data = copy.deepcopy(base)
        data["model"][key] = value
        yield f"qwen3_tiny model.{key}={value!r}", data, 1
    both = copy.deepcopy(base)
    both["model"].update(normalization="LayerNorm", fused_norm=False, hidden_act="swiglu", rotary_percent=0.5)
    yield "qwen3_tiny several model settings", both, 1
    for name, key, value in (("deepseek_v3_tiny", "multi_latent_attention", False),
                             ("deepseek_v3_tiny", "gated_linear_unit", False),
                             ("deepseek_v3_tiny", "hidden_act", "gelu"),
                             ("deepseek_v4_tiny", "hidden_act", "gelu"),
                             ("deepseek_v4_tiny", "experimental_attention_variant", "mla"),
                             ("deepseek_v4_tiny", "activation_func_clamp_value", None),
                             ("qwen3_moe_tiny", "use_sliding_window", True)):
        data = _template(name)
        data["model"][key] = value
        yield f"{name} model.{key}={value!r}", data, 1
    data = base["train_dataset"]["dataloader"]["config"]
    for key, value in (("seq_length", -1), ("train_data_path", "corpus")):  # form error + a cross-field rule
        case = copy.deepcopy(base)
        case["train_dataset"]["dataloader"]["config"] = {**data, key: value}
        yield f"dataloader.config.{key}={value!r}", case, 1


def _number_cases() -> Iterator[tuple[str, dict, int]]:
    for template, path, kind in number_cases():
        values: tuple[Any, ...] = (-1, 10**30) if kind is int else (math.nan, 1e39, -1.0)
        for value in values:
            raw = _template(template)
            ypath = yaml_path(raw, path, FAMILY_OF_TEMPLATE[template])
            set_path(raw, ypath, value)
            yield f"{template} {'.'.join(map(str, ypath))}={value!r}", raw, 1


def _key_cases() -> Iterator[tuple[str, dict, int]]:
    base = _template("qwen3_tiny")
    for section, body in base.items():
        if isinstance(body, dict) and body:
            data = copy.deepcopy(base)
            data[section][next(iter(body)) + "x"] = 1
            yield f"misspelt key in {section}", data, 1
    data = copy.deepcopy(base)
    data["[/]top"] = 1
    data["training"]["[bold]steps[/bold]"] = 3
    yield "keys with markup", data, 1


def _layout_cases() -> Iterator[tuple[str, dict, int]]:
    """Degrees the world (or the model) cannot hold: the mesh rules and the family rules both look at them."""
    for name in ("qwen3_tiny", "deepseek_v3_tiny", "deepseek_v4_tiny", "qwen3_moe_tiny"):
        for key, value in (("tensor_parallel", 3), ("tensor_parallel", 2), ("context_parallel", 2),
                           ("expert_parallel", 3), ("pipeline_parallel", 8), ("sequence_parallel", False)):
            data = _template(name)
            data.setdefault("parallelism", {})[key] = value
            yield f"{name} parallelism.{key}={value!r} on 4", data, 4
        data = _template(name)
        data.setdefault("optimizer", {}).update(type="Muon", qk_clip_enabled=True)
        data["parallelism"] = {**(data.get("parallelism") or {}), "tensor_parallel": 2}
        yield f"{name} Muon with tensor parallel on 2", data, 2


def _hostile() -> list[tuple[str, dict, int]]:
    return [*_model_cases(), *_number_cases(), *_key_cases(), *_layout_cases()]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.name)
def test_a_shipped_template_has_one_problem_per_path(path):
    assert doubled(problems_of(yaml.safe_load(path.read_text()))) == {}


@pytest.mark.parametrize("name, data, world", _converted(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_converted_config_has_one_problem_per_path(name, data, world):
    assert doubled(problems_of(data, world)) == {}, name


def test_no_hostile_yaml_gets_two_problems_at_one_path():
    cases = _hostile()
    assert len(cases) > 350  # every number field of every section (the enumeration reached them all)
    found = {name: d for name, data, world in cases if (d := doubled(problems_of(data, world)))}
    assert found == {}


def test_the_check_sees_two_problems_at_one_path():
    """The detector itself: two modules reporting one path is what it must catch."""
    from mftk.errors import Problem

    ps = [Problem(path="model.normalization", message="a"), Problem(path="model.normalization", message="b"),
          Problem(path="model.fused_norm", message="c")]
    assert list(doubled(ps)) == ["model.normalization"]
