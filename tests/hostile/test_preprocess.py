"""Hostile input and faults for `mftk preprocess` (issue 21: items 2, 5 and 7).

Each case asserts the exit code, that no traceback is printed, what the message names, and what
is (and is not) left on disk.
"""
from __future__ import annotations

import errno
import gzip
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from commands.app import app
from mftk.data import indexed
from mftk.data.indexed import IndexedDataset, IndexedDatasetBuilder

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "mftk" / "templates" / "data"
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def flat(text: str) -> str:
    return " ".join(text.split())


def _mftk(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mftk", *args], capture_output=True, text=True, cwd=ROOT,
                          env=ENV, timeout=timeout)


def _example_jsonl(path: Path, repeat: int = 1) -> Path:
    raw = gzip.decompress((EXAMPLES / "corpus.jsonl.gz").read_bytes())
    path.write_bytes(raw * repeat)
    return path


def _leftovers(d: Path) -> list[str]:
    """Temporary files, state, locks: what a failed or finished run must not leave behind."""
    return sorted(p.name for p in d.iterdir() if p.name.endswith((".partial", ".lock", ".tmp"))
                  or "preprocess-state" in p.name)


# -- item 2: two runs on one output prefix ----------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys
    from mftk.data.preprocess import LOCK_WHAT
    from mftk.lock import exclusive_output
    with exclusive_output(sys.argv[1], LOCK_WHAT):
        print("held", flush=True)
        sys.stdin.read()
""")


def test_second_run_on_a_held_prefix_is_refused_naming_the_holder(tmp_path):
    src = _example_jsonl(tmp_path / "c.jsonl")
    out = tmp_path / "out"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True, cwd=ROOT, env=ENV)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = _mftk("preprocess", "-i", str(src), "-o", str(out), "-t", str(EXAMPLES), "--append-eod")
        assert r.returncode == 2 and "Traceback" not in r.stderr and r.stdout == ""
        msg = flat(r.stderr)
        assert f"{out}: another run is writing this output: pid {holder.pid} on host {socket.gethostname()}, " \
               "started " in msg and "(mftk preprocess output)" in msg and "wait for it to finish" in msg
        assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "out.lock"]  # the holder's lock only
    finally:
        holder.communicate("")
    r = _mftk("preprocess", "-i", str(src), "-o", str(out), "-t", str(EXAMPLES), "--append-eod")
    assert r.returncode == 0, r.stderr
    assert IndexedDataset(tmp_path / "out_text_document").document_count == 196 and _leftovers(tmp_path) == []


def test_concurrent_runs_never_interleave(tmp_path):
    src = _example_jsonl(tmp_path / "c.jsonl", repeat=4)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "mftk", "preprocess", "-i", str(src), "-o", str(out), "-t", str(EXAMPLES),
            "--append-eod", "--json"]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=ENV)
             for _ in range(3)]
    results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    for code, stdout, stderr in results:
        assert code in (0, 2) and "Traceback" not in stderr
        if code == 2:
            assert "another run is writing this output: pid " in flat(stderr)
    assert any(code == 0 for code, _, _ in results)
    _mftk("preprocess", "-i", str(src), "-o", str(tmp_path / "ref"), "-t", str(EXAMPLES), "--append-eod")
    for ext in ("bin", "idx"):  # whatever the interleaving of start times, the result is one complete run
        assert (tmp_path / f"out_text_document.{ext}").read_bytes() == \
            (tmp_path / f"ref_text_document.{ext}").read_bytes()
    assert _leftovers(tmp_path) == []


def test_a_merge_and_a_run_into_the_same_pair_exclude_each_other(tmp_path):
    from mftk.data.preprocess import LOCK_WHAT, preprocess
    from mftk.errors import InputError
    from mftk.lock import exclusive_output

    src = _example_jsonl(tmp_path / "c.jsonl")
    preprocess([str(src)], str(tmp_path / "a"), EXAMPLES)
    with exclusive_output(tmp_path / "out_text_document", LOCK_WHAT):  # as a --merge into it would hold
        with pytest.raises(InputError, match=f"out_text_document: another run is writing this output: pid {os.getpid()}"):
            preprocess([str(src)], str(tmp_path / "out"), EXAMPLES)
    with exclusive_output(tmp_path / "out", LOCK_WHAT):  # as a preprocess run writing prefix out holds
        with exclusive_output(tmp_path / "out_text_document", LOCK_WHAT):
            with pytest.raises(InputError, match="another run is writing this output"):
                preprocess([str(tmp_path / "a_text_document")], str(tmp_path / "out_text_document"), None,
                           merge_only=True)
    assert not list(tmp_path.glob("out*"))


def test_temporary_names_are_unique_per_writer(tmp_path):
    a = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    b = IndexedDatasetBuilder(tmp_path / "x", np.uint16)
    assert a.tmp_bin != b.tmp_bin and a.tmp_docs != b.tmp_docs and a.tmp_bin.name.endswith(".partial")
    a.add_document([np.array([1, 2, 3])])
    b.add_document([np.array([4])])
    a.finalize()
    b.finalize()  # the later rename wins whole: never a mix of both
    ds = IndexedDataset(tmp_path / "x")
    assert [ds[i].tolist() for i in range(len(ds))] == [[4]]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.bin", "x.idx", "x.mftk.json"]


def test_leftovers_of_a_killed_run_are_cleaned(tmp_path):
    src = _example_jsonl(tmp_path / "c.jsonl")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "out.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "started": "x"}))
    for part in ("bin", "lengths", "docs"):
        (tmp_path / f"out_text_document.{part}.{dead.pid}-deadbeef.partial").write_bytes(b"\0" * 100)
    r = _mftk("preprocess", "-i", str(src), "-o", str(tmp_path / "out"), "-t", str(EXAMPLES), "--append-eod")
    assert r.returncode == 0 and "Traceback" not in r.stderr
    assert _leftovers(tmp_path) == [] and len(IndexedDataset(tmp_path / "out_text_document")) == 196


# -- item 7: a full disk ---------------------------------------------------------------------------

class _FullDisk:
    """A file whose writes fail with ENOSPC after ``room`` bytes, and whose close fails again."""

    def __init__(self, real, room: int) -> None:
        self._real, self._room = real, room

    def write(self, data) -> int:
        n = len(memoryview(data).cast("B"))
        if n > self._room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._room -= n
        return self._real.write(data)

    def flush(self) -> None:
        if self._room <= 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        self._real.flush()

    def close(self) -> None:
        self._real.close()
        raise OSError(errno.ENOSPC, "No space left on device")  # the last flush of a full disk

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.mark.parametrize("room", [0, 50_000])
def test_full_disk_while_writing_tokens(tmp_path, monkeypatch, room):
    import builtins

    real_open = builtins.open

    def full_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return _FullDisk(f, room) if str(path).endswith(".partial") and "w" in mode else f

    monkeypatch.setattr(indexed, "open", full_open, raising=False)  # the builder's open, nothing else
    src = _example_jsonl(tmp_path / "c.jsonl")
    r = CliRunner().invoke(app, ["preprocess", "-i", str(src), "-o", str(tmp_path / "out"), "-t", str(EXAMPLES),
                                 "--append-eod"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    msg = flat(r.stderr)
    # the user's name for the file, never the temporary one (issue 35)
    assert f"{tmp_path / 'out_text_document.bin'}: cannot write (the disk is full)" in msg and ".partial" not in msg
    assert "free space on that filesystem" in msg
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl"]


def test_full_disk_while_saving_progress(tmp_path, monkeypatch):
    real_write_text = Path.write_text

    def full_write_text(self, *args, **kwargs):
        if self.name.endswith(".preprocess-state.json.tmp"):
            real_write_text(self, "{")  # a partly written file, then the disk is full
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_write_text)
    a = _example_jsonl(tmp_path / "a.jsonl")
    b = _example_jsonl(tmp_path / "b.jsonl")
    r = CliRunner().invoke(app, ["preprocess", "-i", str(a), "-i", str(b), "-o", str(tmp_path / "out"), "-t",
                                 str(EXAMPLES), "--append-eod"])
    assert r.exit_code == 2 and "Traceback" not in r.output, r.output
    assert "out.preprocess-state.json: cannot write (the disk is full)" in flat(r.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jsonl", "b.jsonl"]


def test_full_tmpfs(tmp_path):
    """A real full filesystem: a 64 KiB tmpfs (needs permission to mount; skipped without it)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()[:100]}")
    try:
        src = _example_jsonl(tmp_path / "c.jsonl")  # 1.4 MB of tokens: far more than fits
        r = _mftk("preprocess", "-i", str(src), "-o", str(mnt / "out"), "-t", str(EXAMPLES), "--append-eod")
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "cannot write (the disk is full)" in flat(r.stderr)
        assert list(mnt.iterdir()) == []  # the space is free again
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


# -- item 5: one very long line --------------------------------------------------------------------

@pytest.mark.slow
def test_a_50_mb_line_is_one_document(tmp_path):
    """What it costs in memory (was ~150x the line) is `bench/memory_guards.py --long-line`'s figure."""
    paragraph = "Ünïcödé words, numbers 12345 and 東京 in one very long document without a break.\n"
    line = json.dumps({"text": paragraph * (50_000_000 // len(paragraph.encode()))}, ensure_ascii=False) + "\n"
    (tmp_path / "long.jsonl").write_text(line, encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "mftk", "preprocess", "-i", str(tmp_path / "long.jsonl"), "-o",
                        str(tmp_path / "l"), "-t", str(EXAMPLES), "--json"], capture_output=True, text=True, cwd=ROOT,
                       env=ENV, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert data["backend"] == "gigatoken" and data["sources"][0]["outputs"][0]["documents"] == 1
    assert data["sources"][0]["outputs"][0]["tokens"] > 1_000_000
    assert _leftovers(tmp_path) == []


# -- item 6 (preprocess part): paths that look like globs or markup ---------------------------------

def test_literal_path_with_brackets_and_markup_in_the_output_prefix(tmp_path):
    d = tmp_path / "run[final]"
    d.mkdir()
    src = _example_jsonl(d / "data[1].jsonl")  # a literal path, not the glob data1.jsonl
    out = tmp_path / "out[" / "]x"  # the prefix holds "[/]", Rich's closing tag
    out.mkdir(parents=True)
    r = subprocess.run([sys.executable, "-m", "mftk", "preprocess", "-i", str(src), "-o", str(out / "o[bold]"),
                        "-t", str(EXAMPLES), "--append-eod"], capture_output=True, text=True, cwd=ROOT,
                       env={**ENV, "COLUMNS": "400"}, timeout=300)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert f"{out}/o[bold]_text_document" in r.stdout  # printed as text, not taken as markup
    assert len(IndexedDataset(out / "o[bold]_text_document")) == 196


@pytest.mark.slow
def test_text_of_unique_words_is_encoded(tmp_path):
    """gigatoken memoizes every distinct word without a bound (1.9 GB for 150 MB of random words): mftk bounds it.
    The peak it keeps is `bench/memory_guards.py --unique-words`'s figure (the suite asserts nothing on RSS)."""
    import base64

    with open(tmp_path / "random.jsonl", "w") as f:
        for _ in range(3_300):  # ~10 MB of random 10-character words
            b = base64.b64encode(os.urandom(2250)).decode().replace("+", "a").replace("/", "b")
            f.write(json.dumps({"text": " ".join(b[i:i + 10] for i in range(0, len(b), 10))}) + "\n")
    r = subprocess.run([sys.executable, "-m", "mftk", "preprocess", "-i", str(tmp_path / "random.jsonl"), "-o",
                        str(tmp_path / "r"), "-t", str(EXAMPLES), "--json"], capture_output=True, text=True, cwd=ROOT,
                       env=ENV, timeout=600)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
    data = json.loads(r.stdout)
    assert data["backend"] == "gigatoken" and data["sources"][0]["outputs"][0]["documents"] == 3_300
