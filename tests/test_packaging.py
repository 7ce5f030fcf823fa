"""`pip install .` (not only -e): the wheel carries the templates and their data, and a shipped template
validates from any directory with nothing of the checkout on the path."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_wheel_ships_templates_and_a_template_validates_from_anywhere(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "dist"), str(ROOT)], check=True, capture_output=True, cwd=tmp_path)
    wheel = next((tmp_path / "dist").glob("mftk-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(site)
    for name in ("mftk/templates/qwen3_tiny.yaml", "mftk/templates/data/example_text_document.bin",
                 "mftk/templates/data/example_text_document.idx", "mftk/templates/data/tokenizer.json"):
        assert name in names, name
    cwd = tmp_path / "anywhere"
    cwd.mkdir()
    code = ("import sys, mftk; assert mftk.__file__.startswith(sys.argv[1]), mftk.__file__\n"
            "from commands.entry import main\n"
            "sys.argv = ['mftk', 'validate-config', sys.argv[2]]\n"
            "main()")
    template = site / "mftk" / "templates" / "qwen3_tiny.yaml"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code, str(site), str(template)], cwd=cwd, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "valid" in out.stdout and "data/example_text_document" in out.stderr  # found next to the template
    listed = subprocess.run([sys.executable, "-c", "import sys; from commands.entry import main; "
                             "sys.argv = ['mftk', 'templates', '--json']; main()"], cwd=cwd, env=env,
                            capture_output=True, text=True)
    assert listed.returncode == 0 and str(template) in listed.stdout, listed.stdout + listed.stderr
