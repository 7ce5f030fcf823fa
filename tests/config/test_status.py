"""The config-field status table (`mftk.config.status`): every field has a row, every refused field is refused."""
from __future__ import annotations

import re
from pathlib import Path

import attrs
import pytest
import yaml

from mftk.config import sections as S
from mftk.config import status as ST
from mftk.config.load import load_data
from mftk.config.model import model_configs
from mftk.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SECTION_PATHS = [p for p, _, _ in ST.leaf_fields(S.Config)]
MODEL_FIELDS = sorted({f.name for c in set(model_configs().values()) for f in attrs.fields(c)})


def _template(name: str = "qwen3_tiny.yaml") -> dict:
    return yaml.safe_load((ROOT / "templates" / name).read_text())


def test_every_section_field_has_a_status():
    missing = [p for p in SECTION_PATHS if ST.status_of(p) is None]
    assert not missing, f"fields without a row in mftk/config/status.py: {missing}"


def test_every_model_field_has_a_status():
    missing = [n for n in MODEL_FIELDS if ST.status_of(f"model.{n}") is None]
    assert not missing, f"model fields without a row in mftk/config/status.py: {missing}"


def test_no_row_without_a_field():
    """A row for a field that no longer exists would document a key the config model rejects."""
    stale = [f"{s}.{n}".lstrip(".") for s, rows in ST.SECTIONS.items() for n in rows
             if f"{s}.{n}".lstrip(".") not in SECTION_PATHS]
    stale += [f"model.{n}" for n in ST.MODEL if n not in MODEL_FIELDS]
    assert not stale


@pytest.mark.parametrize("path", SECTION_PATHS + [f"model.{n}" for n in MODEL_FIELDS])
def test_row_is_well_formed(path):
    st = ST.status_of(path)
    assert st.kind in (ST.IMPLEMENTED, ST.NO_EFFECT, ST.REFUSED)
    if st.kind == ST.IMPLEMENTED:
        node = st.test_for(path)
        module, _, func = node.partition("::")
        assert (ROOT / module).is_file(), f"{path}: the test module {module!r} showing its effect does not exist"
        if st.only:
            return  # its proof is the refusal of every other value (below)
        assert func, f"{path}: name the test function (pytest node id) that proves the field's effect"
        name, _, param = func.partition("[")
        assert re.search(rf"^def {name}\(", (ROOT / module).read_text(), re.M), f"{path}: no test {node}"
        if param and module == "tests/engine/test_field_effects.py":
            from tests.engine import test_field_effects as fx

            assert param[:-1] in {**fx.EFFECTS, **fx.MONITOR_SETTINGS, **fx.RECOMPUTE_SETTINGS}, node
    elif not st.rule:
        assert st.why, f"{path}: a no-effect or refused row says why / what to use instead"


def _set(data: dict, path: str, value) -> None:
    node = data
    *parents, key = path.split(".")
    for p in parents:
        node = node.setdefault(p, {})
    node[key] = value


def _refused_value(path: str, st: ST.Status):
    if st.example is not None:
        return st.example
    section, _, name = path.rpartition(".")
    if path.startswith("model."):
        default = next(f.default for c in set(model_configs().values()) for f in attrs.fields(c) if f.name == name)
    else:
        cls = S.Config
        for part in section.split(".") if section else ():
            cls = _nested(cls, part)
        default = attrs.fields_dict(cls)[name].default
    assert isinstance(default, bool), f"{path}: give the row an example value"
    return not default


def _nested(cls, name):
    import typing

    tp = typing.get_type_hints(cls)[name]
    return next(a for a in (tp, *typing.get_args(tp)) if attrs.has(a))


REFUSED = [p for p in SECTION_PATHS + [f"model.{n}" for n in MODEL_FIELDS]
           if ST.status_of(p).kind == ST.REFUSED
           or (ST.status_of(p).kind == ST.IMPLEMENTED and ST.status_of(p).only and p.startswith("model."))]


@pytest.mark.parametrize("path", REFUSED)
def test_setting_a_refused_field_is_an_error_naming_it(path):
    st = ST.status_of(path)
    data = _template(_template_with(path))
    if path.startswith("checkpoint.base_load_path") or path == "checkpoint.save_trainable_only":
        data["checkpoint"]["base_load_path"] = "base"
    _set(data, path, _refused_value(path, st))
    if path == "recompute.mode":
        data["recompute"]["full_recompute_layer"] = ["0-1"]  # the grammar's own requirement
    if path == "recompute_comm.enable":
        data["recompute_comm"]["select_module"] = {"*": ["0"]}
    world = 1
    if st.multi_only:
        world = 2
        data["training"]["global_batch_size"] = 2 * data["training"]["local_batch_size"]
        assert path in {p.path for p in load_data(data, check_files=False).notes if p.severity == "note"}
    with pytest.raises(ConfigError) as info:
        load_data(data, check_files=False, world_size=world)
    paths = {p.path for p in info.value.problems if p.severity == "error"}
    assert path in paths, f"{path} set to a refused value; errors at: {sorted(paths)}"


TEMPLATES = {"qwen3": "qwen3_tiny.yaml", "deepseek_v3": "deepseek_v3_tiny.yaml", "deepseek_v4": "deepseek_v4_tiny.yaml",
             "qwen3_moe": "qwen3_moe_tiny.yaml"}


def _template_with(path: str) -> str:
    """The first tiny template whose model family has the field (qwen3 for the sections)."""
    name = path.removeprefix("model.")
    if not path.startswith("model."):
        return TEMPLATES["qwen3"]
    return next(t for family, t in TEMPLATES.items() if name in attrs.fields_dict(model_configs()[family]))


def test_no_effect_field_gets_a_note():
    data = _template()
    data["context"] = {"max_device_memory": "32GB"}
    data["model"]["apply_rope_fusion"] = True
    loaded = load_data(data, check_files=False)
    notes = {p.path: p.message for p in loaded.notes if p.severity == "note"}
    assert "no effect" in notes["context.max_device_memory"]
    assert "no effect" in notes["model.apply_rope_fusion"]


def test_templates_have_no_refused_or_no_effect_values_beyond_notes():
    for name in ("qwen3_tiny.yaml", "deepseek_v3_tiny.yaml"):
        load_data(_template(name), check_files=False)  # raises on any error


def test_print_resolved_marks_non_implemented_fields():
    from mftk.config.report import resolved_yaml

    data = _template()
    data["swap"] = {"default_prefetch": 2}
    text = resolved_yaml(load_data(data, check_files=False))
    line = next(l for l in text.splitlines() if l.strip().startswith("default_prefetch:"))
    assert "# no effect:" in line
    assert "# refused:" in next(l for l in text.splitlines() if l.strip().startswith("amsgrad:"))
    assert "#" not in next(l for l in text.splitlines() if l.strip().startswith("learning_rate:")).split("# default")[0]


def test_readme_reference_has_a_status_column():
    from mftk.config.reference import config_reference_markdown

    md = config_reference_markdown()
    assert "| `checkpoint` key | type | default | status | meaning |" in md
    row = next(l for l in md.splitlines() if l.startswith("| `amsgrad` |"))
    assert "refused" in row


def test_validate_config_exits_1_naming_a_refused_key(tmp_path):
    from tests.helpers.cli import runner

    from commands.app import app

    data = _template()
    data["optimizer"]["amsgrad"] = True
    data["train_dataset"]["dataloader"]["config"]["mock"] = True
    data["train_dataset"]["dataloader"]["config"].pop("data_path", None)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    r = runner.invoke(app, ["validate-config", str(tmp_path / "c.yaml"), "--no-check-files"])
    assert r.exit_code == 1
    assert "optimizer.amsgrad" in r.output and "AMSGrad is not implemented" in r.output


def test_print_resolved_output_is_yaml_with_long_status_comments(tmp_path):
    from tests.helpers.cli import runner

    from commands.app import app

    r = runner.invoke(app, ["validate-config", str(ROOT / "templates" / "qwen3_tiny.yaml"), "--print-resolved",
                            "--no-check-files"], env={"COLUMNS": "60"})
    assert r.exit_code == 0, r.output
    assert yaml.safe_load(r.stdout)["checkpoint"]["load_worker_number"] == 1  # no comment wrapped onto a line
    assert "# no effect: the reference ignores it too (2.0 §1.5)" in r.stdout


def test_moe_router_pre_softmax_says_it_does_not_change_routing():
    """The reference's PyNative router ignores the field in routing: mftk says so rather than accept it silently —
    a note when set, and a note when false would mean Megatron's other order (softmax, no renormalisation)."""
    data = _template("deepseek_v3_tiny.yaml")
    data["model"].update(moe_router_score_function="softmax", norm_topk_prob=False, moe_router_enable_expert_bias=False)
    notes = {p.path: p.message for p in load_data(data, check_files=False).notes if p.severity == "note"}
    assert "Megatron's order" in notes["model.moe_router_pre_softmax"]
    data["model"]["moe_router_pre_softmax"] = True
    notes = {p.path: p.message for p in load_data(data, check_files=False).notes if p.severity == "note"}
    assert notes["model.moe_router_pre_softmax"].startswith("no effect")


def test_async_save_says_it_has_no_effect_with_several_processes():
    data = _template()
    data["checkpoint"]["async_save"] = True
    assert "checkpoint.async_save" not in {p.path for p in load_data(data, check_files=False).notes}
    data["training"]["global_batch_size"] = 2 * data["training"]["local_batch_size"]
    notes = {p.path: p.message for p in load_data(data, check_files=False, world_size=2).notes}
    assert "no effect with more than one process" in notes["checkpoint.async_save"]


@pytest.mark.parametrize("key", ["enable_fused_opt", "use_fused"])
def test_fused_optimizer_switches_say_they_have_no_effect(key):
    data = _template()
    data["optimizer"][key] = True
    notes = {p.path: p.message for p in load_data(data, check_files=False).notes}
    assert notes[f"optimizer.{key}"].startswith("no effect")
