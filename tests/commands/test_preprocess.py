"""`mftk preprocess` through the CLI: exit codes, stdout (table, data_path block, JSON), stderr."""
from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.data import make_tokenizer, read_pair



def flat(text):
    """Rich wraps long error lines at the terminal width; compare with whitespace collapsed."""
    return " ".join(text.split())


def _setup(tmp_path):
    make_tokenizer(tmp_path / "tokenizer.json")
    (tmp_path / "a.jsonl").write_text('{"text": "hello fox"}\n{"text": "lazy dog"}\n')
    (tmp_path / "b.jsonl").write_text('{"text": "quick"}\nnot json\n')
    return tmp_path


def test_table_and_data_path(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "out"), "-t", str(d),
                            "--append-eod"])
    assert r.exit_code == 0, r.output
    assert "eod: 0" in r.stdout and "data_path:" in r.stdout and f"'{d}/out_text_document'" in r.stdout
    assert "uint16" in r.stdout
    code, seqs, docs = read_pair(d / "out_text_document")
    assert code == 8 and len(seqs) == 2 and seqs[0][-1] == 0 and docs == [0, 1, 2]


def test_bad_line_exit_1_and_skip(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "b.jsonl"), "-o", str(d / "out"), "-t", str(d)])
    assert r.exit_code == 1
    assert f"{d / 'b.jsonl'}:2" in flat(r.stderr) and "invalid JSON" in flat(r.stderr) and "--on-error skip" in flat(r.stderr)
    assert r.stdout == ""
    r = runner.invoke(app, ["preprocess", "-i", str(d / "b.jsonl"), "-o", str(d / "out"), "-t", str(d),
                            "--on-error", "skip", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["sources"][0]["rejected"] == 1
    assert data["sources"][0]["rejects_path"] == f"{d}/out.rejects.jsonl"


def test_multi_source_and_merge(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", f"x={d / 'a.jsonl'}", "-i", f"y={d / 'a.jsonl'}", "-o",
                            str(d / "m"), "-t", str(d / "tokenizer.json"), "--weights", "0.3,0.7"])
    assert r.exit_code == 0, r.output
    snippet = r.stdout[r.stdout.index("train_dataset:"):]  # printed as valid YAML nested under its section
    assert yaml.safe_load(snippet) == {"train_dataset": {"dataloader": {"config": {"data_path": [
        "0.3", f"{d}/m_x_text_document", "0.7", f"{d}/m_y_text_document"]}}}}
    r = runner.invoke(app, ["preprocess", "--merge", "-i", str(d / "m_x_text_document"), "-i",
                            str(d / "m_y_text_document"), "-o", str(d / "merged")])
    assert r.exit_code == 0, r.output
    assert len(read_pair(d / "merged")[1]) == 4


def test_missing_input_and_tokenizer_exit_2(tmp_path):
    d = _setup(tmp_path)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "nope.jsonl"), "-o", str(d / "o"), "-t", str(d)])
    assert r.exit_code == 2 and "no such input file" in flat(r.stderr)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "o"), "-t", str(d / "x.json")])
    assert r.exit_code == 2 and "no such tokenizer file" in flat(r.stderr)
    r = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "o"), "-t", str(d),
                            "--weights", "a,b"])
    assert r.exit_code == 2 and "--weights" in flat(r.stderr)


def test_finished_run_ends_without_teardown_and_keeps_its_output(tmp_path):
    """The real process (commands.entry.main) ends with os._exit once the outputs are in place: stdout is
    complete, the files equal an in-process run's, and a failed run still exits normally (code 1)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    d = _setup(tmp_path)
    root = Path(__file__).resolve().parents[2]
    code = ("import atexit, sys\natexit.register(lambda: print('TEARDOWN', file=sys.stderr))\n"
            "sys.argv = ['mftk', *sys.argv[1:]]\nfrom commands.entry import main\nmain()\n")

    def run(*args):
        return subprocess.run([sys.executable, "-c", code, "preprocess", "-t", str(d), *args], capture_output=True,
                              text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, timeout=300)

    r = run("-i", str(d / "a.jsonl"), "-o", str(d / "sub"), "--append-eod", "--json")
    assert r.returncode == 0 and "TEARDOWN" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["sources"][0]["outputs"][0]["tokens"] > 0
    inproc = runner.invoke(app, ["preprocess", "-i", str(d / "a.jsonl"), "-o", str(d / "cli"), "-t", str(d),
                                 "--append-eod"])
    assert inproc.exit_code == 0, inproc.output
    for ext in ("bin", "idx"):
        assert (d / f"sub_text_document.{ext}").read_bytes() == (d / f"cli_text_document.{ext}").read_bytes()
    assert sorted(p.name for p in d.iterdir() if p.name.startswith("sub")) == [
        "sub_text_document.bin", "sub_text_document.idx", "sub_text_document.mftk.json"]
    bad = run("-i", str(d / "b.jsonl"), "-o", str(d / "bad"))
    assert bad.returncode == 1 and "TEARDOWN" in bad.stderr and "b.jsonl:2" in flat(bad.stderr)


@pytest.mark.parametrize("user_value", [None, "2"])
def test_a_preprocess_process_runs_one_openblas_thread(tmp_path, user_value):
    """numpy's OpenBLAS starts a thread per core at import, which spin beside the tokenizer loads; the
    command keeps it to one before numpy is imported (`no_blas_threads`), unless the user set a value."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if (os.cpu_count() or 1) < 2:
        pytest.skip("one core: OpenBLAS starts one thread anyway")
    d = _setup(tmp_path)
    root = Path(__file__).resolve().parents[2]
    code = ("import ctypes, glob, os, sys\nreal_exit = os._exit\n"
            "def _exit(code):\n"
            "    import numpy\n"
            "    lib = glob.glob(os.path.join(os.path.dirname(numpy.__file__), '..', 'numpy.libs', 'libopenblas*'))[0]\n"
            "    print('THREADS', ctypes.CDLL(lib).openblas_get_num_threads64_(), flush=True)\n"
            "    real_exit(code)\n"
            "os._exit = _exit\nsys.argv = ['mftk', *sys.argv[1:]]\nfrom commands.entry import main\nmain()\n")
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    env.update({"PYTHONPATH": str(root)}, **({"OPENBLAS_NUM_THREADS": user_value} if user_value else {}))
    r = subprocess.run([sys.executable, "-c", code, "preprocess", "-t", str(d), "-i", str(d / "a.jsonl"), "-o",
                        str(d / "o"), "--json"], capture_output=True, text=True, cwd=root, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.rsplit("THREADS", 1)[1].split() == [user_value or "1"]


@pytest.mark.parametrize("env", [{}, {"FORCE_COLOR": "1"}, {"FORCE_COLOR": ""}, {"TTY_COMPATIBLE": "1"},
                                 {"TTY_COMPATIBLE": "0"}, {"TTY_INTERACTIVE": "1"}])
@pytest.mark.parametrize("tty", [False, True])
def test_plain_stderr_only_when_rich_would_not_draw(monkeypatch, env, tty):
    """`stderr_surely_plain` lets `mftk preprocess` skip importing Rich: it may only say so when Rich's own
    ``Console.is_terminal`` (the reference) says the stream is no terminal."""
    import io
    import sys

    from rich.console import Console

    from commands._plain import stderr_surely_plain

    class Stream(io.StringIO):
        def isatty(self) -> bool:
            return tty

    for name in ("TTY_COMPATIBLE", "FORCE_COLOR", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    stream = Stream()
    monkeypatch.setattr(sys, "stderr", stream)
    if stderr_surely_plain():
        assert not Console(file=stream).is_terminal
    assert stderr_surely_plain() == (not tty and not env)  # plain stderr, nothing forcing: the fast path is taken
