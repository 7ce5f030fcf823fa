"""The loader: every bad-input case of the foundation issue gets a clear, located error."""
from __future__ import annotations

from pathlib import Path

import pytest
from mftk.config.load import load_config
from mftk.errors import ConfigError, InputError
from tests.helpers.config import load_dict, template_dict as base

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "templates" / "qwen3_tiny.yaml"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def problems_of(exc: ConfigError, severity: str = "error") -> dict[str, str]:
    return {p.path: p.message for p in exc.problems if p.severity == severity}


def fails(data: dict, **kw) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_dict(data, **kw)
    return problems_of(info.value)


def test_template_loads_and_defaults_fill_in():
    loaded = load_config(TINY, check_files=False)
    c = loaded.config
    assert c.training.global_batch_size == 8
    assert c.checkpoint.no_save_optim is False          # default from the attrs field
    assert c.model.num_key_value_heads == 2
    assert c.dataset.seq_length == 128


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="directory"):
        load_config(tmp_path)


def test_empty_file(tmp_path):
    with pytest.raises(ConfigError, match="empty"):
        load_config(write(tmp_path, "# only a comment\n"))


def test_non_mapping_top_level(tmp_path):
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(write(tmp_path, "- a\n- b\n"))


def test_syntax_error_has_line_and_column(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "training:\n  steps: [1, 2\nmodel: {}\n"))
    p = info.value.problems[0]
    assert p.line is not None and p.line >= 2
    assert "column" in p.message


def test_tabs_are_named(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "training:\n\tsteps: 3\n"))
    assert "tab" in info.value.message.lower()


def test_duplicate_keys(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, "training:\n  steps: 3\n  steps: 4\n"))
    p = info.value.problems[0]
    assert p.path == "training.steps" and p.line == 3 and "duplicate" in p.message and "line 2" in p.message


def test_nesting_deeper_than_ten(tmp_path):
    text = "".join("  " * i + f"k{i}:\n" for i in range(11)) + "  " * 11 + "x: 1\n"
    with pytest.raises(ConfigError, match="problem") as info:
        load_config(write(tmp_path, text))
    assert any("nesting depth" in p.message for p in info.value.problems)


def test_wrong_types_are_reported_together():
    data = base()
    data["training"]["steps"] = True                  # bool for int
    data["optimizer"]["betas"] = "0.9, 0.95"          # string for list
    data["checkpoint"]["save_max"] = "3"              # string for int
    found = fails(data)
    assert "expected int, got boolean" in found["training.steps"]
    assert "expected list" in found["optimizer.betas"]
    assert "expected int, got string" in found["checkpoint.save_max"]


def test_unknown_section_and_key_with_did_you_mean():
    data = base()
    data["trainingg"] = {"steps": 1}
    data["training"]["global_batch"] = 4
    data["checkpoint"]["save_pth"] = "x"
    with pytest.raises(ConfigError) as info:
        load_dict(data)
    by_path = {p.path: p for p in info.value.problems if p.severity == "error"}
    assert by_path["trainingg"].message == "unknown section" and "did you mean 'training'" in by_path["trainingg"].hint
    assert by_path["training.global_batch"].message == "unknown key"
    assert "global_batch_size" in by_path["training.global_batch"].hint
    assert "save_path" in by_path["checkpoint.save_pth"].hint


def test_unknown_key_in_extra_tolerant_section_is_a_warning():
    data = base()
    data["optimizer"]["my_custom_knob"] = 1
    loaded = load_dict(data)
    warnings = {p.path for p in loaded.notes if p.severity == "warning"}
    assert "optimizer.my_custom_knob" in warnings


def test_yaml11_float_string_is_accepted_with_a_note():
    data = base()
    data["lr_scheduler"]["learning_rate"] = "1e-5"
    loaded = load_dict(data)
    assert loaded.config.lr_scheduler.learning_rate == pytest.approx(1e-5)
    assert any(p.path == "lr_scheduler.learning_rate" and p.severity == "note" for p in loaded.notes)


def test_line_numbers_come_from_the_file(tmp_path):
    text = TINY.read_text().replace("local_batch_size: 1", "local_batch_size: 0")
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text), check_files=False)
    p = next(p for p in info.value.problems if p.path == "training.local_batch_size")
    expected = next(i for i, l in enumerate(text.splitlines(), 1) if "local_batch_size: 0" in l)
    assert p.line == expected


def test_overrides_are_typed():
    loaded = load_dict(base(), overrides=["training.steps=7", "checkpoint.save_path=123"])
    assert loaded.config.training.steps == 7
    assert loaded.config.checkpoint.save_path == "123"     # a str field keeps the text
    found = fails(base(), overrides=["training.steps=abc"])
    assert "training.steps" in found


def test_empty_section_uses_defaults_with_a_note():
    data = base()
    data["monitor"] = None
    loaded = load_dict(data)
    assert loaded.config.monitor.tensorboard.log_interval == 1
    assert any(p.path == "monitor" and p.severity == "note" for p in loaded.notes)


def test_missing_model_and_unknown_model_type():
    data = base()
    del data["model"]
    assert "model" in fails(data)
    data = base()
    data["model"]["model_type"] = "qwen4"
    assert "'qwen4' is not a model family mftk trains (deepseek_mtp, deepseek_v3, deepseek_v4, qwen3, qwen3_moe)" in \
        fails(data)["model.model_type"]


def test_relative_data_paths_fall_back_to_the_config_files_directory(tmp_path, monkeypatch):
    """A template's data (next to it) is found from any working directory; a path that exists in the working
    directory keeps the reference's meaning; each rewrite is a note naming both."""
    import os

    import yaml as _yaml

    from mftk.config.load import load_config

    conf_dir = tmp_path / "conf"
    (conf_dir / "data").mkdir(parents=True)
    for ext in (".bin", ".idx"):
        (conf_dir / "data" / f"corpus{ext}").write_bytes(b"")
    data = _yaml.safe_load((ROOT / "templates" / "qwen3_tiny.yaml").read_text())
    data["train_dataset"]["dataloader"]["config"]["data_path"] = ["1", "data/corpus"]
    (conf_dir / "c.yaml").write_text(_yaml.safe_dump(data))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_config(conf_dir / "c.yaml", check_files=True)
    assert loaded.config.dataset.data_path == ["1", str(conf_dir / "data" / "corpus")]
    note = next(p for p in loaded.notes if p.path == "train_dataset.dataloader.config.data_path[1]")
    assert note.severity == "note" and "'data/corpus' is not in the working directory" in note.message
    (elsewhere / "data").mkdir()  # the same relative path in the working directory wins (the reference's reading)
    for ext in (".bin", ".idx"):
        (elsewhere / "data" / f"corpus{ext}").write_bytes(b"")
    assert load_config(conf_dir / "c.yaml").config.dataset.data_path == ["1", "data/corpus"]
    assert os.getcwd() == str(elsewhere)
