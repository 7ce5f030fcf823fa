"""The Typer-free start of `mftk preprocess` (`commands.entry`, `commands._argspec`): the argv it takes means what
Typer's parse of it means, and everything else goes to Typer."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from commands import preprocess as command
from commands._argspec import parse

ROOT = Path(__file__).resolve().parents[2]


def typer_params(argv: list[str], monkeypatch) -> dict:
    """The keyword arguments Typer calls the command with for ``argv``: the independent reference for `parse`."""
    from commands.app import app
    from tests.helpers.cli import runner

    seen: dict = {}
    monkeypatch.setattr(command, "preprocess", lambda **kw: seen.update(kw))  # Typer gives it the table's signature
    result = runner.invoke(app, ["preprocess", *argv])
    assert result.exit_code == 0, result.output
    return seen


TAKEN = [
    ["-i", "a.jsonl", "-o", "out"],
    ["--input", "a.jsonl", "--input", "b=b/*.jsonl", "--output-prefix=out", "--tokenizer", "tok/", "--append-eod"],
    ["-i", "a", "-o", "o", "-t", "t.json", "--json-keys", "text", "--json-keys", "title", "-w", "2", "--json"],
    ["-i", "a", "-o", "o", "--workers=3", "--compat", "mindformers", "--on-error", "skip", "--max-errors", "0"],
    ["-i", "a", "-o", "o", "--format", "mindrecord", "--seq-length", "8", "--tokenizer-backend", "hf"],
    ["-i", "a", "-o", "o", "--num-shards", "4", "--shard-index", "3", "--weights", "0.7,0.3", "--merge", "--resume"],
    ["-o", "o", "--eod-token", "</s>", "-i", "x y.jsonl"],
]
LEFT_TO_TYPER = [
    [],  # missing required options
    ["-i", "a"],
    ["--help"],
    ["-i", "a", "-o", "o", "-h"],
    ["-i", "a", "-o", "o", "--workers", "0"],  # below min
    ["-i", "a", "-o", "o", "--workers", "two"],
    ["-i", "a", "-o", "o", "--max-errors", "-1"],
    ["-i", "a", "-o", "o", "--wrokers", "2"],  # a typo
    ["-i", "a", "-o", "o", "positional"],
    ["-i", "a", "-o", "o", "-o", "p"],  # repeated single option (Click: the last wins)
    ["-i", "a", "-o"],  # no value
    ["-i", "a", "-o", "o", "--json=yes"],
    ["-i", "a", "-o", "o", "--tokenizer", ""],
    ["-ia", "-o", "o"],  # a short option with its value glued on
]


@pytest.mark.parametrize("argv", TAKEN, ids=lambda a: " ".join(a)[:40])
def test_parse_equals_typers_parse(argv, monkeypatch):
    assert parse(argv, command.OPTIONS) == typer_params(argv, monkeypatch)


@pytest.mark.parametrize("argv", LEFT_TO_TYPER, ids=lambda a: " ".join(a)[:40] or "empty")
def test_anything_else_is_left_to_typer(argv):
    assert parse(argv, command.OPTIONS) is None


def test_the_typer_command_is_built_from_the_table():
    """Every option of the table is a Click option with its flags, type, multiplicity, default and range."""
    import typer.main

    from commands.app import app

    cmd = typer.main.get_command(app).get_command(None, "preprocess")
    params = {p.name: p for p in cmd.params if p.name != "help"}
    assert set(params) == set(command.OPTIONS)
    for name, opt in command.OPTIONS.items():
        p = params[name]
        assert tuple(p.opts) == opt.flags and p.multiple == opt.many and p.required == opt.required, name
        assert p.is_flag == (opt.kind is bool), name
        assert (getattr(p.type, "min", None) == opt.min), name
        if not opt.required:
            assert p.default == opt.default, name


def _mftk(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE")}
    env["PYTHONPATH"] = str(ROOT)
    return subprocess.run([sys.executable, "-m", "mftk", *args], capture_output=True, text=True, cwd=cwd, env=env)


def test_errors_read_the_same_on_both_paths(tmp_path):
    """A library error on the plain path has the message and exit code of the same error through Typer; a bad
    value gets Typer's own message."""
    fast = _mftk(["preprocess", "-i", "missing.jsonl", "-o", "out"], tmp_path)
    typer_path = _mftk(["preprocess", "-i", "missing.jsonl", "-o", "elsewhere", "-o", "out"], tmp_path)  # repeated
    assert fast.returncode == typer_path.returncode != 0
    assert fast.stderr == typer_path.stderr and fast.stderr.startswith("error: ")
    bad = _mftk(["preprocess", "-i", "a", "-o", "o", "--workers", "0"], tmp_path)
    assert bad.returncode == 2 and "Invalid value for '--workers'" in bad.stderr


def test_the_plain_path_writes_the_outputs(tmp_path):
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i}"}) + "\n" for i in range(20)))
    tok = ROOT / "mftk" / "templates" / "data"
    run = _mftk(["preprocess", "-i", str(corpus), "-t", str(tok), "-o", str(tmp_path / "o"), "--json"], tmp_path)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["sources"][0]["documents"] == 20
    assert (tmp_path / "o_text_document.bin").stat().st_size > 0
