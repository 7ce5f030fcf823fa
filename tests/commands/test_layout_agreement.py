"""`plan-parallel`, `validate-config` and `train` agree on every layout of the tiny templates (Qwen3, DeepSeek-V3,
Qwen3-MoE, and DeepSeek-V4 with Muon, whose plan covers fewer dimensions) at world sizes 2, 4 and 8: a layout the plan lists as valid loads without a problem and is parallelized by the engine on its first
and last rank (no process needed: the groups are rank arithmetic), and a layout the plan rejects is refused by
validate-config with the same rules (one function, `config.runnable.layout_refusals`, decides for all three)."""
from __future__ import annotations

import pytest

from mftk.config.load import load_config
from mftk.errors import ConfigError
from mftk.plan.report import label, parallelism_yaml, plan_inputs, plan_parallel
from tests.helpers.tiny import ROOT

pytestmark = pytest.mark.engine
# template -> world sizes (global_batch_size 4 of the V4/Qwen3-MoE templates leaves no layout at 8: dp ≤ 4)
CASES = [(t, w) for t in ("qwen3_tiny.yaml", "deepseek_v3_tiny.yaml") for w in (2, 4, 8)] + [
    (t, w) for t in ("deepseek_v4_tiny.yaml", "qwen3_moe_tiny.yaml") for w in (2, 4)]


def _overrides(layout, inputs) -> list[str]:
    """The --set overrides that select ``layout`` (plan-parallel's own YAML block for it)."""
    lines = parallelism_yaml(layout, inputs).splitlines()[1:]
    return [f"parallelism.{line.strip().replace(': ', '=', 1)}" for line in lines]


def _parallelizes(path, overrides, layout) -> None:
    """What `train` does with the layout before its first step, on the first and the last rank."""
    from mftk.config.runnable import runnable_layout
    from mftk.derive import stage_chunks
    from mftk.engine.models.gpt import GPTModel
    from mftk.engine.parallel.groups import mesh_groups
    from mftk.engine.parallel.parallelize import ParallelDims, parallelize
    from mftk.engine.spec import build_spec

    loaded = load_config(path, overrides=overrides, world_size=layout.world, check_files=False)
    lay = runnable_layout(loaded, layout.world)
    assert lay == layout
    p, m = loaded.config.parallelism, loaded.config.model
    chunks = stage_chunks(m.num_hidden_layers, lay.pp, lay.interleave, p.pipeline_parallel_layers_per_stage) \
        if lay.pp > 1 else None
    for rank in {0, lay.world - 1}:
        model = GPTModel(build_spec(m))  # zeros: the shapes are what matters here
        par = parallelize(model, ParallelDims(layout=lay, groups=mesh_groups(lay, rank), stage_chunks=chunks))
        assert {q.name for q in model.get_parameters()} == {t.name for t in par.table}


@pytest.mark.parametrize("template,world", CASES)
def test_plan_validate_and_train_agree_on_every_layout(template, world):
    path = ROOT / "templates" / template
    report = plan_parallel(path, world_size=world)
    from mftk.plan.report import load_for_plan

    loaded, parallelism = load_for_plan(path, world=world, check=False)
    inputs = plan_inputs(loaded.config, parallelism)
    valid = [r.estimate.layout for r in report.ranked]
    rejected = [c for c in report.rejected]
    assert valid and rejected and len(valid) + len(rejected) == report.candidates
    for layout in valid:
        overrides = _overrides(layout, inputs)
        _parallelizes(path, overrides, layout)  # loads (validate-config's check) and runs parallelize
    for cand in rejected:
        with pytest.raises(ConfigError) as err:
            load_config(path, overrides=_overrides(cand.layout, inputs), world_size=world, check_files=False)
        # one error per path: the reasons at one path are joined with "; " (the --set note follows the last)
        refused = {reason for p in err.value.problems if p.severity == "error"
                   for reason in p.message.split(" (from --set ")[0].split("; ")}
        for r in cand.rejections:  # every rule the plan names is reported by validate-config, with its arithmetic
            assert r.message in refused, (label(cand.layout), r.message, refused)
