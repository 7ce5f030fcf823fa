"""No traceback anywhere (issue 21, item 8): values of the wrong shape where a section, a string or a
layout belongs, and files that are not what they claim. Besides the named cases, every key path of the
config model (enumerated from the attrs classes) gets values of every wrong shape: the loader must
answer each with a `ConfigError` naming the key, never with another exception.
"""
from __future__ import annotations

import math
import typing

import attrs
import pytest

from mftk.config import sections as S
from mftk.config.load import load_data
from mftk.config.model import Qwen3ModelConfig
from mftk.errors import ConfigError
from tests.helpers.config import template_dict
from tests.helpers.hostile import ROOT, assert_clean_failure, mftk

TEMPLATE = str(ROOT / "templates" / "qwen3_tiny.yaml")


@pytest.mark.parametrize("command", ["validate-config", "train", "resume"])
def test_a_section_set_to_a_number(command, tmp_path):
    r = mftk(command, TEMPLATE, "--set", "training=5", "--output-dir", str(tmp_path / "o")) if command != \
        "validate-config" else mftk(command, TEMPLATE, "--set", "training=5")
    assert_clean_failure(r, 1, "training: expected mapping, got integer 5 (from --set training=5)")
    assert not (tmp_path / "o").exists()


def test_a_key_set_inside_a_value_that_is_not_a_section():
    r = mftk("validate-config", TEMPLATE, "--set", "training=5", "--set", "training.steps=3")
    assert_clean_failure(r, 1, "training: is an integer (5), not a section, so --set training.steps cannot "
                         "set a key inside it")


@pytest.mark.parametrize("value,found", [("[1]", "list [1]"), ("{a: 1}", "dict {'a': 1}")])
def test_model_type_of_the_wrong_shape(value, found):
    r = mftk("validate-config", TEMPLATE, "--set", f"model.model_type={value}")
    assert_clean_failure(r, 1, f"model.model_type: expected a string, got {found} (from --set model.model_type={value})")


def test_a_key_that_is_a_list(tmp_path):
    cfg = tmp_path / "k.yaml"
    cfg.write_text("training:\n  ? [a, b]\n  : 1\n")
    assert_clean_failure(mftk("validate-config", str(cfg)), 1, "training (line 2): a key that is a list or a mapping")


@pytest.mark.parametrize("text", ["tp0", "dps0.tp2", "pp=0"])
def test_explain_a_zero_degree(text):
    r = mftk("plan-parallel", TEMPLATE, "--world-size", "8", "--explain", text)
    assert_clean_failure(r, 2, f"cannot read layout '{text}'", "every degree is at least 1")


@pytest.mark.parametrize("content,code,message", [
    (b"\x89PNG\r\n\x1a\n\x00\x00binary", 2, "not UTF-8 text"),
    (b"", 1, "not valid JSON"),
    (b"[1, 2, 3]", 1, "expected a JSON object"),
    (b'{"model_type": "qwen3"', 1, "not valid JSON"),
    (b'{"model_type": "llama"}', 1, "'llama' is not a model_type mftk trains"),
    (b'{"model_type": ["qwen3"]}', 1, "model_type"),
    (b'{"model_type": "qwen3", "hidden_size": "big"}', 1, "model.hidden_size: expected int, got string 'big'"),
    (b'{"model_type": "qwen3", "hidden_size": 1e999}', 1, "model.hidden_size: expected int, got number inf"),
    (b'{"model_type": "qwen3", "rms_norm_eps": NaN}', 1, "model.rms_norm_eps: NaN is not a number"),
])
def test_model_from_hf_on_garbage(tmp_path, content, code, message):
    cfg = tmp_path / "config.json"
    cfg.write_bytes(content)
    assert_clean_failure(mftk("validate-config", "--model-from-hf", str(cfg)), code, message)


def test_model_from_hf_on_a_dir_without_config(tmp_path):
    assert_clean_failure(mftk("validate-config", "--model-from-hf", str(tmp_path)), 2,
                         f"{tmp_path / 'config.json'}: no such file")


# -- every key path, every wrong shape ------------------------------------------------------------------

def _paths(cls: type, prefix: str = "") -> list[str]:
    out = []
    hints = typing.get_type_hints(cls)
    for f in attrs.fields(cls):
        path = f"{prefix}{f.name}"
        out.append(path)
        inner = [a for a in (typing.get_args(hints[f.name]) or (hints[f.name],)) if attrs.has(a)]
        if attrs.has(hints[f.name]) or inner:
            out += _paths((inner or [hints[f.name]])[0], path + ".")
    return out


PATHS = [p for p in _paths(S.Config) if not p.startswith("model")] + \
    ["model." + p for p in _paths(Qwen3ModelConfig)]
WRONG = [-1, 2.5, math.nan, "x[/]", None, True, [[1]], {"a": [1]}]  # a number, a string, null, a bool, a list, a map


def _set(raw: dict, dotted: str, value) -> None:
    node = raw
    *parents, last = dotted.split(".")
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[last] = value


@pytest.mark.slow  # ~2,000 loads of the template: ~20 s here
def test_every_key_path_with_every_wrong_shape_is_a_config_error():
    crashes = []
    for path in PATHS:
        for value in WRONG:
            raw = template_dict("qwen3_tiny")
            _set(raw, path, value)
            try:
                load_data(raw, source="<t>", check_files=False)
            except ConfigError:
                continue
            except Exception as exc:  # noqa: BLE001 - the point: any other exception is a traceback for a user
                crashes.append(f"{path}={value!r}: {type(exc).__name__}: {exc}")
    assert crashes == []
    assert len(PATHS) > 200


@pytest.mark.slow
@pytest.mark.engine
def test_a_users_error_on_an_msrun_worker_is_the_same_error(tmp_path, corpus):
    """A checkpoint that does not fit the model is found on the workers (they plan the resume): the command
    exits 1 with that error, as one process does, not 4 with a worker's traceback."""
    import yaml

    from tests.helpers.handmade import mf_step_dir
    from tests.helpers.tiny import tiny_raw

    hand = mf_step_dir(tmp_path / "hand")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_raw("qwen3_tiny.yaml", corpus, tmp_path / "ckpt", steps=6, gbs=2)))  # past step 4
    r = mftk("resume", str(cfg), "--from", str(hand.parent), "--nproc", "2", "--output-dir", str(tmp_path / "out"))
    assert_clean_failure(r, 1, f"{hand} does not fit the model", "missing in checkpoint: output_layer.weight",
                         "unexpected in checkpoint: w")
    assert "worker 0 failed" not in r.stderr
