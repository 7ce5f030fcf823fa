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


@pytest.mark.skipif(TrainConfig is None, reason="mindformers 2.1.0 not installed")
def test_converted_wheel_configs_round_trip_into_mindformers(tmp_path):
    """The wheel's static pretrain configs, converted, validated and printed resolved, load back in MF."""
    from mftk.config.convert import convert_file
    from tests.helpers.mf21 import shipped_configs_dir

    sources = sorted(p for family in ("qwen3", "qwen3_moe", "deepseek3")
                     for p in (shipped_configs_dir() / family).glob("pretrain_*.yaml") if "pynative" not in p.name)
    assert len(sources) >= 4
    for src in sources:
        conv = convert_file(src)
        out = tmp_path / f"{src.stem}.yaml"
        out.write_text(conv.to_yaml())
        r = runner.invoke(app, ["validate-config", str(out), "--no-check-files", "--print-resolved",
                                "--world-size", str(conv.world_size)])
        assert r.exit_code == 0, (src.name, r.output)
        TrainConfig.from_dict(yaml.safe_load(r.stdout))
