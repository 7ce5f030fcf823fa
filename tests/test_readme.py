"""Every command block of README.md and of every docs/**/*.md page works when pasted: its exit code and
the lines it shows.

`scripts/readme_blocks.py` extracts the ```bash and ```console blocks of each page; each block runs in a fresh
directory holding the files a reader would bring (a corpus, a tokenizer, `my.yaml`, a broken
`bad.yaml`, a static-graph config, msrun logs, a checkpoint, a Hugging Face export), with `mftk` on
PATH, stdout and stderr piped and ``COLUMNS=80``, as in CI. The templates in that directory are the
shipped ones with ``training.steps: 4`` (saves every 2 steps), so blocks that train stay tiny; blocks
that launch msrun are marked slow.
"""
from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.helpers.logsynth import synth_lines

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "mftk" / "templates"


def _extractor():
    spec = importlib.util.spec_from_file_location("readme_blocks", ROOT / "scripts" / "readme_blocks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["readme_blocks"] = module
    spec.loader.exec_module(module)
    return module


RB = _extractor()
BLOCKS = RB.all_blocks(ROOT)

# Blocks not run here, each with the reason (matched by the start of their first command).
NOT_RUN = {
    "make demo": "creates .venv, installs mftk and runs the 2-3 minute quick-start (tests/commands/"
                 "test_quickstart.py runs the quick-start with fewer steps; tests/test_packaging.py the install)",
}


def _not_run(block) -> str | None:
    first = block.commands[0].text.strip() if block.commands else ""
    return next((why for start, why in NOT_RUN.items() if first.startswith(start)), None)


def _params():
    out = []
    for b in BLOCKS:
        marks = [pytest.mark.slow] if any("--nproc 2" in c.text for c in b.commands) else []
        why = _not_run(b)
        if why:
            marks.append(pytest.mark.skip(reason=why))
        out.append(pytest.param(b, id=f"{b.page}:{b.line}", marks=marks))
    return out


# ----------------------------------------------------------------------------- fixtures

def _shim(bin_dir: Path) -> None:
    """`mftk` on PATH: this checkout's code with this interpreter (what `source .venv/bin/activate` gives)."""
    bin_dir.mkdir()
    exe = bin_dir / "mftk"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} -m mftk \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)


def _tiny_templates(dest: Path) -> None:
    """The shipped templates, 4 steps each (a save every 2), with their example data beside them."""
    dest.mkdir()
    (dest / "data").symlink_to(TEMPLATES / "data", target_is_directory=True)
    for path in TEMPLATES.glob("*.yaml"):
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
        if "tiny" in path.stem:
            text = text.replace(f"steps: {data['training']['steps']}\n", "steps: 4\n", 1)
            text = text.replace(f"save_interleaved_steps: {data['checkpoint']['save_interleaved_steps']}\n",
                                "save_interleaved_steps: 2\n", 1)
        (dest / path.name).write_text(text, encoding="utf-8")


def _bad_yaml(dest: Path) -> None:
    """The tiny template with three mistakes: TP without sequence parallel, a global batch that does not
    divide at 4 devices (dp = 4 // tp = 2; 5 / (2·1) = 2.5) and a misspelt key."""
    text = (TEMPLATES / "qwen3_tiny.yaml").read_text(encoding="utf-8")
    text = text.replace("tensor_parallel: 1\n", "tensor_parallel: 2\n", 1)
    text = text.replace("global_batch_size: 8\n", "global_batch_size: 5\n  global_batch: 5\n", 1)
    dest.write_text(text, encoding="utf-8")


def _msrun_log(dest: Path) -> None:
    dest.mkdir()
    for rank in range(2):
        lines = synth_lines(200, nan_at=(120,), spike_at=(150,))  # data-parallel ranks log the same loss
        (dest / f"worker_{rank}.log").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _run(cmd: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"fixture {' '.join(cmd)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def _env(bin_dir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLUMNS", "LINES", "FORCE_COLOR", "TTY_"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONPATH=str(ROOT), COLUMNS="80",
               MPLBACKEND="Agg")
    env.pop("MFTK_DEBUG", None)
    return env


@pytest.fixture(scope="module")
def kit(tmp_path_factory):
    """What every block directory gets, built once: the shim, tiny templates, the user's files and a
    trained 2-step checkpoint (with its Hugging Face export)."""
    root = tmp_path_factory.mktemp("readme_kit")
    _shim(root / "bin")
    env = _env(root / "bin")
    _tiny_templates(root / "templates")
    corpus = gzip.decompress((TEMPLATES / "data" / "corpus.jsonl.gz").read_bytes()).decode("utf-8").splitlines()
    (root / "corpus.jsonl").write_text("\n".join(corpus[:40]) + "\n", encoding="utf-8")
    shutil.copy(TEMPLATES / "data" / "corpus.jsonl.gz", root / "corpus.jsonl.gz")
    shutil.copy(TEMPLATES / "data" / "tokenizer.json", root / "tokenizer.json")
    shutil.copy(root / "templates" / "qwen3_tiny.yaml", root / "my.yaml")
    _bad_yaml(root / "bad.yaml")
    from tests.config.static_yamls import STATIC

    (root / "pretrain_deepseek3_671b.yaml").write_text(STATIC["deepseek3_671b"], encoding="utf-8")
    _msrun_log(root / "msrun_log")
    run = root / "trained"
    run.mkdir()
    (run / "data").symlink_to(TEMPLATES / "data", target_is_directory=True)
    _run(["mftk", "train", str(root / "my.yaml"), "--set", "training.steps=2", "--set",
          "checkpoint.save_interleaved_steps=1"], run, env)
    _run(["mftk", "inspect-ckpt", "output/qwen3_tiny/checkpoint", "--export-hf", "hf_dir"], run, env)
    return root, env


def _block_dir(kit, tmp_path: Path, block) -> Path:
    root, _ = kit
    d = tmp_path / "work"
    d.mkdir()
    for name in ("templates", "corpus.jsonl", "corpus.jsonl.gz", "tokenizer.json", "my.yaml", "bad.yaml",
                 "pretrain_deepseek3_671b.yaml", "msrun_log"):
        src = root / name
        if src.is_dir():
            shutil.copytree(src, d / name, symlinks=True)
        else:
            shutil.copy(src, d / name)
    text = "\n".join(c.text for c in block.commands)
    if "preprocess" not in text:  # the data my.yaml points at, unless the block makes it
        (d / "data").mkdir()
        for ext in (".bin", ".idx"):
            shutil.copy(TEMPLATES / "data" / f"example_text_document{ext}", d / "data" / f"example_text_document{ext}")
    if "train " not in text:  # a run the block inspects or resumes (2 of my.yaml's 4 steps)
        shutil.copytree(root / "trained" / "output", d / "output")
        shutil.copytree(root / "trained" / "output" / "qwen3_tiny" / "checkpoint", d / "ckpt")
        shutil.copytree(root / "trained" / "hf_dir", d / "hf_dir")
    return d


# ----------------------------------------------------------------------------- the test

@pytest.mark.engine
@pytest.mark.parametrize("block", _params())
def test_readme_block_works_as_pasted(kit, tmp_path, block):
    _, env = kit
    work = _block_dir(kit, tmp_path, block)
    failures = []
    for cmd in block.commands:
        done = subprocess.run(["bash", "-c", cmd.text], cwd=work, env=env, capture_output=True, text=True,
                              timeout=600)
        where = f"{block.page}:{cmd.line}: $ {cmd.text}"
        if done.returncode != cmd.exit_code:
            failures.append(f"{where}\n  exit {done.returncode}, the page says {cmd.exit_code}\n"
                            f"  stdout: {done.stdout[-3000:]}\n  stderr: {done.stderr[-3000:]}")
            continue
        missing = RB.missing_lines(cmd.expected, done.stdout, done.stderr)
        if missing:
            failures.append(f"{where}\n  lines the page shows but the command did not print:\n    "
                            + "\n    ".join(missing) + f"\n  stdout:\n{done.stdout[-4000:]}\n  stderr:\n"
                            f"{done.stderr[-2000:]}")
        assert "Traceback" not in done.stderr, f"{where}\n{done.stderr}"
    assert not failures, "\n\n".join(failures)


def test_every_command_block_is_run_or_has_a_reason():
    """A block is either run above or named in NOT_RUN; the extractor found the blocks at all."""
    assert len(BLOCKS) >= 10
    assert all(b.commands for b in BLOCKS), [b.name for b in BLOCKS if not b.commands]
    skipped = [b for b in BLOCKS if _not_run(b)]
    assert all(b.commands[0].text.startswith("make demo") for b in skipped), [b.name for b in skipped]


def test_matcher_is_strict_about_the_claimed_text():
    """The matcher itself: whole lines, spacing free, `…` a wildcard, order kept per stream."""
    out = "error: 2 problem(s) in bad.yaml\n  • a (line 3): x\n"
    assert RB.missing_lines(["error: 3 problem(s) in bad.yaml"], out, "") == ["error: 3 problem(s) in bad.yaml"]
    assert RB.missing_lines(["error:   2 problem(s) in …"], out, "") == []
    assert RB.missing_lines(["• a (line 3): x", "error: 2 problem(s) in bad.yaml"], out, "") == [
        "error: 2 problem(s) in bad.yaml"]
    assert RB.missing_lines(["...", "hint: y"], out, "hint: y\n") == []
    blocks = RB.blocks("## s\n```console\n$ false\nerr\n$ echo $?\n1\n```\n```bash\nls \\\n  -l\n```\n")
    assert [(c.text, c.exit_code, c.expected) for b in blocks for c in b.commands] == [
        ("false", 1, ["err"]), ("ls \\\n  -l", 0, [])]


def test_blocks_come_from_every_page():
    """The docs pages are read, not only README.md: the blocks that moved there are found where they are."""
    found = {b.page for b in BLOCKS}
    assert {"README.md", "docs/commands/train.md", "docs/commands/validate-config.md"} <= found, found
    assert RB.pages(ROOT)[0] == ROOT / "README.md"
    assert all(p.suffix == ".md" and (p == ROOT / "README.md" or "docs" in p.parts) for p in RB.pages(ROOT))
