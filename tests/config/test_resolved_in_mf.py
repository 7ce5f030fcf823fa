"""`validate-config --print-resolved` writes YAML that MindSpore Transformers 2.1.0's own `TrainConfig` loads
(issue 36: it refused it with "Field 'ContextConfig.device_target' cannot be None"), for every shipped
template, and that mftk reads back to the same config."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from commands.app import app
from mftk.config.load import load_config
from mftk.config.report import resolved
from tests.helpers.cli import runner
from tests.helpers.mf21 import train_config_class

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((ROOT / "templates").glob("*.yaml"))
TrainConfig = train_config_class()


def _print_resolved(path: Path) -> str:
    r = runner.invoke(app, ["validate-config", str(path), "--no-check-files", "--print-resolved"])
    assert r.exit_code == 0, r.output
    return r.stdout


@pytest.mark.skipif(TrainConfig is None, reason="mindformers 2.1.0 not installed (pip install --no-deps "
                                                "mindformers==2.1.0)")
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_print_resolved_loads_in_mindformers_train_config(template):
    data = yaml.safe_load(_print_resolved(template))
    config = TrainConfig.from_dict(data)  # raises on a field MF refuses (type, unknown key, post-init rule)
    assert config.training.global_batch_size == data["training"]["global_batch_size"]
    assert config.model.hidden_size == data["model"]["hidden_size"]


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.stem)
def test_print_resolved_reads_back_to_the_same_config(template, tmp_path):
    out = tmp_path / "resolved.yaml"
    out.write_text(_print_resolved(template))
    again = load_config(out, check_files=False).config
    assert resolved(again) == resolved(load_config(template, check_files=False).config)
