"""The device a run uses (`engine.device`): ``context.device_target`` (or ``--device``) reaches MindSpore's
context, an unset one is the device MindSpore finds, and one that is not here stops the run naming it and
``--device``."""
from __future__ import annotations

import pytest

from mftk.errors import ConfigError
from tests.helpers.models import make_qwen3  # noqa: F401 - MindSpore present (and blocking launches)

pytestmark = pytest.mark.engine


def test_unset_is_the_device_mindspore_finds_and_a_missing_one_is_an_error(monkeypatch):
    from mftk.engine import device

    monkeypatch.setattr(device, "available", lambda d: d in ("CPU", "GPU"))
    assert device.select(None) == "GPU"  # Ascend absent: the next one found
    assert device.select("cpu") == "CPU"
    with pytest.raises(ConfigError) as exc:
        device.select("Ascend")
    err = exc.value
    assert "'Ascend' is not available" in err.message and "CPU, GPU" in err.message
    assert "--device" in err.hint and err.problems[0].path == "context.device_target"
    assert device.BACKENDS == {"CPU": "mccl", "GPU": "nccl", "Ascend": "hccl"}


def test_the_device_reaches_mindspore(monkeypatch, tmp_path):
    """`mftk train --device CPU` on a YAML that writes context.device_target: CPU: MindSpore's context is set to
    what the run resolved, seen on ``ms.set_context`` itself; a device that is not here fails before training."""
    import mindspore as ms
    from typer.testing import CliRunner

    from commands.app import app
    from tests.helpers.tiny import tiny_raw, write_corpus

    seen = []
    real = ms.set_context

    def spy(*args, **kw):
        if "device_target" in kw:
            seen.append(kw["device_target"])
        return real(*args, **kw)

    monkeypatch.setattr(ms, "set_context", spy)
    import yaml

    raw = tiny_raw("qwen3_tiny.yaml", write_corpus(tmp_path / "c" / "t_text_document"), tmp_path / "ck", steps=1, gbs=2)
    raw["checkpoint"]["enable_save"] = False
    raw["context"] = {"device_target": "CPU"}
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    r = CliRunner().invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "o"), "--device", "cpu"])
    assert r.exit_code == 0, r.output
    assert seen == ["CPU"]
    r = CliRunner().invoke(app, ["train", str(cfg), "--output-dir", str(tmp_path / "o2"), "--device", "Ascend"])
    assert r.exit_code != 0 and "context.device_target" in r.output and "--device CPU" in r.output
    assert seen == ["CPU"]  # refused before MindSpore was set up for it
    r = CliRunner().invoke(app, ["train", str(cfg), "--device", "TPU"])
    assert r.exit_code != 0 and "must be one of CPU, GPU, Ascend" in r.output
