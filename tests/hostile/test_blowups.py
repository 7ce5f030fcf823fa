"""Blow-ups (issue 21, item 5): inputs a few bytes long that cost minutes of CPU, gigabytes of memory or
the interpreter's recursion limit. Each is refused quickly, by name, without a traceback."""
from __future__ import annotations

import json
import math
import signal
import struct
from contextlib import contextmanager

import pytest

from mftk.config.load import load_config
from mftk.errors import ConfigError
from mftk.plan.search import count_layouts, divisors, prime_factors
from tests.helpers.hostile import ROOT, assert_clean_failure, mftk

TEMPLATES = ROOT / "templates"
QUICK = 60


@contextmanager
def _hang_guard(seconds: int):
    """Turns a computation that would never end into a failure; a generous bound, not a speed check."""
    def fail(*_):
        pytest.fail(f"still computing after {seconds} s: the algorithm no longer factorises")
    old = signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _laughs(levels: int, width: int = 9) -> str:
    """The classic: each level an alias list of the one before, so the data expands to width**levels."""
    lines = ['a0: &a0 ["lol"' + ', "lol"' * (width - 1) + "]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def test_billion_laughs_yaml_is_refused_at_once(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_laughs(10))  # 9**10 = 3.5 billion strings from a 400-byte file
    r = mftk("validate-config", str(bomb), timeout=QUICK)  # expanding it would never answer
    assert_clean_failure(r, 1, "aliases expand the YAML past 10,000 extra nodes")


def test_billion_laughs_inside_a_real_config(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text((TEMPLATES / "qwen3_tiny.yaml").read_text() + "extra_blob:\n" +
                   "".join("  " + line + "\n" for line in _laughs(8).splitlines()))
    with pytest.raises(ConfigError) as e:
        load_config(cfg, check_files=False)
    assert "billion laughs" in e.value.problems[0].message


def test_a_few_aliases_are_fine(tmp_path):
    """Shared blocks are normal in MindSpore Transformers YAMLs: expansion within the budget is kept."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(_laughs(3) + (TEMPLATES / "qwen3_tiny.yaml").read_text())  # 9**3 = 729 nodes
    loaded = load_config(cfg, check_files=False)
    assert loaded.raw["a2"] == [[["lol"] * 9] * 9] * 9


def test_recursive_alias(tmp_path):
    cfg = tmp_path / "r.yaml"
    cfg.write_text("training: &t\n  steps: 3\n  loop: *t\n")
    r = mftk("validate-config", str(cfg), timeout=QUICK)
    assert_clean_failure(r, 1, "an alias refers to the node that contains it")


@pytest.mark.parametrize("depth", [100, 100_000])
def test_deeply_nested_yaml(tmp_path, depth):
    cfg = tmp_path / "d.yaml"
    cfg.write_text("a: " + "[" * depth + "]" * depth + "\n")
    r = mftk("validate-config", str(cfg), timeout=QUICK)
    assert_clean_failure(r, 1, "64 levels")


def test_alias_bomb_in_a_set_override():
    """An override value is YAML too, with the file's limits: a bomb fits in one --set."""
    levels = [f"k0: &l0 [{', '.join(['x'] * 9)}]"]
    levels += [f"k{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]" for i in range(1, 9)]
    r = mftk("validate-config", str(TEMPLATES / "qwen3_tiny.yaml"), "--no-check-files",
             "--set", "model.rope_scaling={" + ", ".join(levels) + "}", timeout=QUICK)
    assert_clean_failure(r, 1, "model.rope_scaling", "the value of --set model.rope_scaling: aliases expand the YAML "
                         "past 10,000 extra nodes")


def test_huge_integer_literal_in_yaml(tmp_path):
    cfg = tmp_path / "big.yaml"
    cfg.write_text("training:\n  steps: " + "9" * 5000 + "\n")
    r = mftk("validate-config", str(cfg), timeout=QUICK)
    assert_clean_failure(r, 1, "(line 2): a value YAML cannot read", "4300 digits")


# -- plan-parallel on absurd world sizes -------------------------------------------------------------

def test_divisors_by_factorisation_match_counting():
    for n in range(1, 2000):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0], n
    with _hang_guard(QUICK):  # counting to 2**61 would never end: a hang, not a slow answer
        assert divisors(10**9) == sorted(2**a * 5**b for a in range(10) for b in range(10))
        p = 2**61 - 1  # a Mersenne prime
        assert prime_factors(p) == {p: 1} and divisors(p) == [1, p]
        n = 1_000_000_007 * 998_244_353
        assert prime_factors(n) == {998_244_353: 1, 1_000_000_007: 1}


def test_layout_count_matches_the_enumeration():
    from mftk.plan.search import candidate_layouts

    for world in (1, 2, 6, 8, 12, 30, 64):
        for moe in (False, True):
            for v in (1, 2, 3):
                assert count_layouts(world, moe=moe, max_interleave=v) == \
                    sum(1 for _ in candidate_layouts(world, moe=moe, max_interleave=v))


def test_plan_for_a_billion_devices_answers_quickly():
    r = mftk("plan-parallel", str(TEMPLATES / "deepseek_v3_tiny.yaml"), "--world-size", "1000000000", timeout=QUICK)
    assert_clean_failure(r, 1, "world size 1000000000 has 38,972,527 candidate layouts, more than the 1,000,000")


def test_plan_for_a_huge_prime_world_size():
    r = mftk("plan-parallel", str(TEMPLATES / "qwen3_tiny.yaml"), "--world-size", str(2**61 - 1), timeout=QUICK)
    assert_clean_failure(r, 1, "no valid layout for world size 2305843009213693951")


def test_check_and_explain_on_a_billion_devices():
    """One layout, not a search: answered at once whatever the world size."""
    r = mftk("plan-parallel", str(TEMPLATES / "qwen3_tiny.yaml"), "--world-size", "1000000000", "--check",
             "--explain", "dps1000000000", timeout=QUICK)
    assert_clean_failure(r, 1, "training.global_batch_size (line 14): num_accumulation_steps = global_batch_size / "
                         "(dp·local_batch_size) = 8 / (1000000000·1)")


# -- deeply nested JSON ---------------------------------------------------------------------------

def _safetensors_with_header(path, header: bytes) -> None:
    path.write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.mark.parametrize("depth", [100, 200_000])
def test_deeply_nested_safetensors_header(tmp_path, depth):
    f = tmp_path / "model.safetensors"
    _safetensors_with_header(f, b'{"w": ' + b"[" * depth + b"]" * depth + b"}")
    r = mftk("inspect-ckpt", str(f), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, f"{f}: not a valid safetensors file", "JSON nested more than 64 levels deep")


@pytest.mark.parametrize("depth", [100, 200_000])
def test_deeply_nested_hf_config(tmp_path, depth):
    cfg = tmp_path / "config.json"
    cfg.write_text('{"model_type": "qwen3", "rope_scaling": ' + "[" * depth + "]" * depth + "}")
    r = mftk("validate-config", "--model-from-hf", str(cfg), timeout=QUICK)
    assert_clean_failure(r, 1, f"{cfg}: JSON nested more than 64 levels deep")


@pytest.mark.parametrize("name", ["common.json", "metadata.json"])
def test_deeply_nested_checkpoint_json(tmp_path, name):
    from tests.helpers.handmade import mf_step_dir

    d = mf_step_dir(tmp_path / "ckpt")
    (d / name).write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    r = mftk("inspect-ckpt", str(d), "--verify", timeout=QUICK)
    assert_clean_failure(r, 1, f"{name}: JSON nested more than 64 levels deep")


def test_json_depth_is_not_fooled_by_brackets_in_strings():
    from mftk.files import parse_json

    text = json.dumps({"name": "[" * 10_000, "v": [[1]]})
    assert parse_json(text, where="x")["v"] == [[1]]
    assert math.isfinite(parse_json("[1.5]", where="x")[0])
