"""One rule for ``~`` and environment variables in every path (issue 35): the YAML's path settings and the command
line's path arguments expand them as a shell would, or are refused naming the setting."""
from __future__ import annotations

import os
import subprocess
import sys

import attrs
import pytest

from mftk.config import sections as S
from mftk.config.load import load_data
from mftk.errors import ConfigError
from tests.helpers.config import template_dict
from tests.helpers.hostile import ENV, ROOT, assert_clean_failure, flat

TEMPLATE = ROOT / "templates" / "qwen3_tiny.yaml"


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("USER", "alice")
    return tmp_path / "home"


@pytest.mark.parametrize("written,expected", [("~/ck", "{home}/ck"), ("${HOME}/ck", "{home}/ck"),
                                              ("$HOME/ck", "{home}/ck"), ("/scratch/$USER/ck", "/scratch/alice/ck"),
                                              ("ck/${USER}_run", "ck/alice_run")])
def test_the_save_path_expands_as_a_shell_would(home, written, expected):
    data = template_dict()
    data["checkpoint"]["save_path"] = written
    loaded = load_data(data, check_files=False)
    assert loaded.config.checkpoint.save_path == expected.format(home=home)
    assert any(p.path == "checkpoint.save_path" and p.severity == "note" and "expanded" in p.message
               for p in loaded.notes)


def test_every_path_setting_follows_the_rule(home):
    data = template_dict()
    data["checkpoint"]["load_path"] = "~/from"
    data["monitor"] = {"tensorboard": {"output_dir": "~/tb"}}
    data["profiler"] = {"output_path": "$HOME/prof"}
    cfg = data["train_dataset"]["dataloader"]["config"]
    cfg["data_path"] = ["0.5", "~/a_text_document", "0.5", "${HOME}/b_text_document"]
    cfg["path_to_cache"] = "~/cache"
    c = load_data(data, check_files=False).config
    assert c.checkpoint.load_path == f"{home}/from"
    assert c.monitor.tensorboard.output_dir == f"{home}/tb"
    assert c.profiler.output_path == f"{home}/prof"
    assert c.train_dataset.dataloader.config.data_path == ["0.5", f"{home}/a_text_document", "0.5",
                                                           f"{home}/b_text_document"]
    assert c.train_dataset.dataloader.config.path_to_cache == f"{home}/cache"


def test_the_path_settings_are_the_ones_declared():
    """Every str/list field whose name says it is a path is declared a path (a new one cannot miss the rule)."""
    missed = []

    def walk(cls, prefix):
        hints = __import__("typing").get_type_hints(cls)
        for f in attrs.fields(cls):
            inner = [a for a in __import__("typing").get_args(hints[f.name]) if a is not type(None)] or [hints[f.name]]
            if attrs.has(inner[0]):
                walk(inner[0], f"{prefix}{f.name}.")
            elif any(w in f.name for w in ("path", "_dir", "dataset_files")) and "s3" not in f.name \
                    and not f.metadata.get("path"):
                missed.append(prefix + f.name)
    walk(S.Config, "")
    assert not missed


@pytest.mark.parametrize("written,named", [("${MFTK_UNSET_VARIABLE}/ck", "${MFTK_UNSET_VARIABLE}"),
                                           ("/scratch/$MFTK_UNSET_VARIABLE", "$MFTK_UNSET_VARIABLE"),
                                           ("~no_such_user_mftk/ck", "'~no_such_user_mftk'")])
def test_a_path_that_cannot_be_expanded_is_refused_naming_the_setting(home, written, named):
    data = template_dict()
    data["checkpoint"]["save_path"] = written
    with pytest.raises(ConfigError) as info:
        load_data(data, check_files=False)
    (p,) = [p for p in info.value.problems if p.severity == "error"]
    assert p.path == "checkpoint.save_path" and named in p.message


def _mftk(*args, cwd, home):
    env = {**ENV, "HOME": str(home), "USER": "alice"}
    return subprocess.run([sys.executable, "-m", "mftk", *args], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=300)


def test_the_summary_names_the_home_folder_and_no_literal_tilde_folder_appears(tmp_path):
    home = tmp_path / "home"
    r = _mftk("validate-config", str(TEMPLATE), "--no-check-files", "--set", "checkpoint.save_path=~/ck",
              cwd=tmp_path, home=home)
    assert r.returncode == 0, r.stderr
    assert "save ~/ck " in flat(r.stdout)
    assert str(home) not in r.stdout + r.stderr  # never an absolute home path on screen
    assert not (tmp_path / "~").exists()


def test_a_path_argument_expands_too(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "my.yaml").write_text(TEMPLATE.read_text())
    r = _mftk("validate-config", "--no-check-files", "$HOME/my.yaml", cwd=ROOT, home=home)
    assert r.returncode == 0, r.stderr
    r = _mftk("validate-config", "--no-check-files", "~/my.yaml", cwd=ROOT, home=home)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("args,named", [
    (["inspect-ckpt", "$MFTK_UNSET_VARIABLE/ck"], "PATH: '$MFTK_UNSET_VARIABLE/ck' names the environment variable"),
    (["train", str(TEMPLATE), "--output-dir=~no_such_user_mftk/o"], "--output-dir: '~no_such_user_mftk/o' starts"),
    (["preprocess", "-i", "${MFTK_UNSET_VARIABLE}/a.jsonl", "-o", "out", "-t", "tok.json"],
     "--input: '${MFTK_UNSET_VARIABLE}/a.jsonl' names the environment variable"),
])
def test_a_path_argument_that_cannot_be_expanded_is_a_usage_error(tmp_path, args, named):
    r = _mftk(*args, cwd=tmp_path, home=tmp_path)
    assert_clean_failure(r, 2, named)
    assert not os.listdir(tmp_path)


def test_train_saves_under_the_home_folder_and_says_so_as_written(tmp_path):
    """The issue's instance: ``save_path: ~/ck`` made a literal ``./~/ck`` while the summary read ``~/ck/…``."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    r = _mftk("train", str(TEMPLATE), "--set", "checkpoint.save_path=~/ck", "--set", "training.steps=1",
              "--output-dir", "out", cwd=work, home=home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (home / "ck" / "iteration_00000001").is_dir()
    assert not (work / "~").exists()
    assert "checkpoint: ~/ck/iteration_00000001" in r.stdout
