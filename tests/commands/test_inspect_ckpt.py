import json

from tests.helpers.cli import runner

from commands.app import app
from tests.helpers.handmade import f32, mf_step_dir, write



def _run(*args):
    return runner.invoke(app, ["inspect-ckpt", *map(str, args)], env={"COLUMNS": "200"})


def test_table_output(tmp_path):
    mf_step_dir(tmp_path, step=4)
    res = _run(tmp_path)
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "step 4  consumed_samples 8  global_batch_size 2" in out
    assert "checkpoint-opt-0000000-0000001.safetensors" in out and "adam_v.w" in out
    assert "model parameters 6  optimizer elements 9" in out
    assert "standard resume" in out and "not bit-exact" in out


def test_json_output_and_verify(tmp_path):
    mf_step_dir(tmp_path, step=4)
    res = _run(tmp_path / "iteration_00000004", "--json", "--verify", "--tensors")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["step"] == 4 and data["verified"] and data["problems"] == []
    assert [s["supported"] for s in data["scenarios"]] == [True, True, True, True]
    assert {t["name"]: t["norm"] for t in data["tensors"]}["w"] == 30 ** 0.5


def test_missing_path_exits_2(tmp_path):
    res = _run(tmp_path / "nope")
    assert res.exit_code == 2 and "does not exist" in res.stderr


def test_nan_found_with_tensors_exits_1(tmp_path):
    write(tmp_path / "m.safetensors", [("w", "F32", [2], f32(1, float("nan")))])
    assert _run(tmp_path / "m.safetensors").exit_code == 0
    res = _run(tmp_path / "m.safetensors", "--verify", "--tensors")
    assert res.exit_code == 1 and "w: 1 NaN and 0 Inf" in res.stderr


def test_diff(tmp_path):
    mf_step_dir(tmp_path / "a", step=4)
    mf_step_dir(tmp_path / "b", step=6)
    res = _run(tmp_path / "a", "--diff", tmp_path / "b", "--tensors", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["step_a"] == 4 and data["step_b"] == 6 and data["added"] == [] and data["reshaped"] == []
    assert {c["name"]: c["rel_change"] for c in data["changes"]}["w"] == 0.0
    assert not data["identical"]  # global_step 4 -> 6 in the opt file
    res = _run(tmp_path / "a", "--diff", tmp_path / "b")
    assert res.exit_code == 0 and "global_step: 4 -> 6" in res.stdout


def test_export_hf_needs_the_model_section(tmp_path):
    mf_step_dir(tmp_path)
    res = _run(tmp_path, "--export-hf", tmp_path / "out")
    assert res.exit_code == 1 and "no mftk extra state" in res.stderr and "--model-config" in res.stderr


def test_verify_checks_checksums_and_quick_reads_headers_only(tmp_path):
    """A flipped exponent bit (still finite) and a NaN written over a saved weight fail --verify, naming the
    file and the tensor; --verify --quick reads only headers, so it passes (what --help says)."""
    from tests.helpers.damage import MODEL, flip_exponent_bit, save_small as _save, write_nan

    _save(tmp_path, 2)
    _save(tmp_path, 4)
    ok = _run(tmp_path, "--verify")
    assert ok.exit_code == 0 and "every tensor matches its checksum" in ok.stdout, ok.output
    flip_exponent_bit(tmp_path / "iteration_00000004" / MODEL, "w", 2)
    write_nan(tmp_path / "iteration_00000002" / MODEL, "w", 1)
    for step in (2, 4):
        bad = _run(tmp_path / f"iteration_0000000{step}", "--verify")
        assert bad.exit_code == 1 and f"{MODEL}: w: checksum mismatch" in bad.stderr, bad.output
        assert _run(tmp_path / f"iteration_0000000{step}", "--verify", "--quick").exit_code == 0
    assert "--quick" in _run("--help").stdout


def test_verify_notes_files_without_checksums(tmp_path):
    mf_step_dir(tmp_path, step=4)
    res = _run(tmp_path, "--verify")
    assert res.exit_code == 0 and "carry no checksums" in res.stdout, res.output
