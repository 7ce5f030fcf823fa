"""A resume never loads a damaged checkpoint and never replaces its own source (issue 34, part B).

One process, the tiny Qwen3 of `tests.helpers.tiny`: 4 steps saved at 2 and 4; the reference for every
resume is that uninterrupted run (bit-exact resume gives the very same losses)."""
from __future__ import annotations

import filecmp
import shutil

import pytest
import yaml
from safetensors.numpy import load_file

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.verify import check_step_dir
from tests.helpers.damage import MODEL, flip_exponent_bit, write_nan
from tests.helpers.cli import runner
from tests.helpers.tiny import load, tiny_raw

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, corpus):
    from mftk.engine.run import train

    d = tmp_path_factory.mktemp("verify-baseline")
    raw = tiny_raw("qwen3_tiny.yaml", corpus, d / "ckpt", steps=4)
    return raw, train(load(raw), output_dir=d / "out"), d / "ckpt"


def _copy(baseline, tmp_path):
    raw, full, root = baseline
    shutil.copytree(root, tmp_path / "ckpt")
    return dict(raw, checkpoint=dict(raw["checkpoint"], save_path=str(tmp_path / "ckpt"))), full


def _resume(raw, tmp_path, *overrides):
    from mftk.engine.run import train

    return train(load(raw, *overrides), output_dir=tmp_path / "out", resume_from=tmp_path / "ckpt")


@pytest.mark.parametrize("damage", [flip_exponent_bit, write_nan], ids=["exponent-bit", "nan"])
def test_resume_skips_a_damaged_checkpoint_and_continues_from_the_previous(baseline, tmp_path, damage):
    raw, full = _copy(baseline, tmp_path)
    damage(tmp_path / "ckpt" / "iteration_00000004" / MODEL, "output_layer.weight")
    r = _resume(raw, tmp_path, "training.steps=4")
    assert r.resume.step_dir.endswith("iteration_00000002") and r.start_step == 2
    skipped = [n for n in r.notes if n.startswith("skipped iteration_00000004")]
    assert len(skipped) == 1 and f"{MODEL}: output_layer.weight: checksum mismatch" in skipped[0]
    assert r.losses == full.losses[2:]  # the uninterrupted run's, bit for bit
    assert check_step_dir(tmp_path / "ckpt" / "iteration_00000004").ok  # re-saved, sound


def test_checkpoint_without_checksums_loads_with_a_note(baseline, tmp_path):
    raw, full = _copy(baseline, tmp_path)
    d = tmp_path / "ckpt" / "iteration_00000004"
    for f in d.glob("*.safetensors"):  # as an mftk from before checksums wrote it
        st.write_file(f, load_file(str(f)), checksums=False)
        assert st.CHECKSUM_KEY not in st.read_header(f).metadata
    r = _resume(raw, tmp_path, "training.steps=5")
    assert r.resume.step_dir.endswith("iteration_00000004") and r.final_step == 5
    assert any("carry no checksums" in n for n in r.resume.notes)


def test_no_checkpoint_left_exits_1_naming_tensor_and_file(baseline, tmp_path):
    raw, _ = _copy(baseline, tmp_path)
    for step in (2, 4):
        flip_exponent_bit(tmp_path / "ckpt" / f"iteration_0000000{step}" / MODEL, "output_layer.weight", 7)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    from commands.app import app

    r = runner.invoke(app, ["resume", str(cfg), "--set", "training.steps=5", "--output-dir", str(tmp_path / "o")])
    assert r.exit_code == 1, r.output
    assert "no checkpoint in" in r.stderr and f"{MODEL}: output_layer.weight: checksum mismatch" in r.stderr
    assert "Traceback" not in r.output


def test_changed_batch_size_saving_every_step_keeps_the_source(baseline, tmp_path):
    """gbs 2 → 4 rescales step 4 to 2; saving every step reaches step 4 again: the source is kept aside."""
    raw, _ = _copy(baseline, tmp_path)
    source = baseline[2] / "iteration_00000004"
    r = _resume(raw, tmp_path, "training.global_batch_size=4", "checkpoint.save_interleaved_steps=1",
                "training.steps=4")
    assert r.resume.scenario == 3 and r.start_step == 2 and r.final_step == 4
    assert any("kept as iteration_00000004.resume-source" in n for n in r.notes)
    kept = tmp_path / "ckpt" / "iteration_00000004.resume-source"
    names = sorted(p.name for p in source.iterdir())
    assert sorted(p.name for p in kept.iterdir()) == names
    assert filecmp.cmpfiles(source, kept, names, shallow=False)[0] == names  # byte for byte the source
    new = tmp_path / "ckpt" / "iteration_00000004"
    assert not filecmp.cmp(source / MODEL, new / MODEL, shallow=False) and check_step_dir(new).ok
