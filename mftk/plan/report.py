"""`plan-parallel` as one library call: load the YAML, search or check, estimate, rank, explain.

Returns a `PlanReport` that the command renders as a table or JSON; nothing here prints.
The YAML is loaded with its own parallel degrees reset to 1 for the search (its layout is what we
are replacing), so a config written for 8 devices can be planned for 64 without first being edited.
"""
from __future__ import annotations

import copy
import math
import re
from pathlib import Path
from typing import Any, Iterable

import attrs

from mftk.config.load import LoadedConfig, apply_override, build_config, load_data, locate, parse_override
from mftk.config.rules import DEGREES, degree_problems
from mftk.config.yamlio import parse_yaml, read_config_file
from mftk.errors import ConfigError, InputError, PlanError
from mftk.plan import search as S
from mftk.derive import Layout, layout_from_config
from mftk.plan.memory import Assumptions, LayoutEstimate, PlanInputs, estimate, human, preset
from mftk.units import count, parse_bytes

SHAPE_KEYS = ("vocab_size", "seq_length", "hidden_size", "num_hidden_layers", "num_attention_heads")
_RESET = {"tensor_parallel": 1, "pipeline_parallel": 1, "context_parallel": 1, "expert_parallel": 1,
          "pipeline_parallel_interleave_num": 1, "data_parallel_shard": -1,
          "pipeline_parallel_layers_per_stage": "auto", "ulysses_degree_in_cp": None}


@attrs.frozen
class Ranked:
    estimate: LayoutEstimate
    fits: bool


@attrs.frozen(kw_only=True)
class PlanReport:
    source: str
    world: int
    nodes: int | None
    device_memory_bytes: int
    model: str
    candidates: int
    ranked: tuple[Ranked, ...]
    rejected: tuple[S.Candidate, ...]
    check: bool = False
    check_ok: bool | None = None
    yaml_block: str = ""
    explained: str | None = None
    notes: tuple[str, ...] = ()
    ranking: str = ""  # how the layouts are ordered
    why_chosen: tuple[str, ...] = ()  # why the first one is the recommendation
    check_failures: tuple[str, ...] = ()  # with --check: which memory term does not fit, by how much
    profile: str = "accelerator"
    hardware: str | None = None
    accuracy: tuple[str, ...] = ()  # the profile's measured error on published runs (references.py)
    accuracy_data: dict = attrs.field(factory=dict)

    @property
    def best(self) -> Ranked | None:
        return self.ranked[0] if self.ranked else None

    def to_dict(self, top: int | None = None) -> dict:
        return {
            "source": self.source, "world_size": self.world, "nodes": self.nodes,
            "device_memory_bytes": self.device_memory_bytes, "model": self.model,
            "candidates": self.candidates, "valid": len(self.ranked), "rejected_count": len(self.rejected),
            "check": self.check, "check_ok": self.check_ok,
            "layouts": [_ranked_dict(r) for r in self.ranked[:top]],
            "rejected": [{"layout": attrs.asdict(c.layout),
                          "rules": [{"rule": r.rule, "message": r.message} for r in c.rejections]}
                         for c in self.rejected],
            "yaml": self.yaml_block, "explain": self.explained, "notes": list(self.notes),
            "ranking": self.ranking, "why_chosen": list(self.why_chosen), "check_failures": list(self.check_failures),
            "profile": self.profile, "hardware": self.hardware, "profile_error": self.accuracy_data,
            "profile_error_text": list(self.accuracy),
        }


def _ranked_dict(r: Ranked) -> dict:
    e = r.estimate
    return {
        "layout": attrs.asdict(e.layout), "label": label(e.layout), "fits": r.fits,
        "peak_bytes": round(e.peak_bytes), "peak_stage": e.peak.stage, "micro_batches": e.micro_batches,
        "stages": [{"stage": s.stage, "layers": list(s.layers), "total_bytes": round(s.total),
                    "terms": {t.name: round(t.value) for t in s.terms}} for s in e.stages],
        "flops_per_step": e.flops.value, "bubble": e.bubble.value,
        "comm_bytes": {t.name.removeprefix("comm "): round(t.value) for t in e.comm},
        "step_time_s": e.step_time.value if e.step_time else None,
        "tokens_per_s_per_device": tokens_per_s(e),
    }


def tokens_per_s(e: LayoutEstimate) -> float | None:
    """Tokens per second per device of the estimated step (None without a step time)."""
    if not e.step_time or e.step_time.value <= 0:
        return None
    return e.flops.inputs["global_batch_size"] * e.flops.inputs["seq_length"] / e.layout.world / e.step_time.value


def label(lay: Layout) -> str:
    """Compact layout name, also accepted by --explain: dpr1.dps4.cp1.tp2.pp1.ep1(.v2)."""
    text = f"dpr{lay.dp_replicate}.dps{lay.dp_shard}.cp{lay.cp}.tp{lay.tp}.pp{lay.pp}.ep{lay.ep}"
    return text + (f".v{lay.interleave}" if lay.interleave > 1 else "")


# ----------------------------------------------------------------------------- loading

def load_for_plan(path: str | Path, *, world: int, check: bool, overrides: Iterable[str] = (),
                  engine_support: bool = True) -> tuple[LoadedConfig, Any]:
    """The validated config (degrees reset for a search) and the YAML's own parallelism section, both with the
    ``--set`` overrides applied (as `validate-config` and `train` apply them). ``engine_support=False``: a model
    mftk's engine does not implement (GeLU, a non-gated MLP, biases) is planned with a warning."""
    source, overrides = str(path), list(overrides)
    data, lines = parse_yaml(read_config_file(path), source)
    if not isinstance(data, dict):
        load_data(data, lines=lines, source=source)  # raises the loader's own error
    problems = [p for item in overrides for p in apply_override(data, item)]
    if problems:
        raise ConfigError(message=f"{len(problems)} problem(s) in the --set overrides", source=source,
                          problems=problems)
    original, _ = build_config(copy.deepcopy(data), lines)
    degrees = degree_problems(original.parallelism) if original is not None and not check else []
    if degrees:  # the search resets the degrees below: a 0 or -2 in the YAML would pass unseen
        locate(degrees, lines, {item: parse_override(item)[0] for item in overrides})
        raise ConfigError(message=f"{len(degrees)} problem(s) in {source}", source=source, problems=degrees)
    if check:
        loaded = load_data(data, lines=lines, source=source, world_size=world, check_files=False,
                           engine_support=engine_support, applied=overrides)
    else:
        reset = copy.deepcopy(data)
        par = dict(reset.get("parallelism") or {})
        par.update(_RESET)
        if str(par.get("pipeline_parallel_schedule", "")).lower() == "interleaved_1f1b":
            par["pipeline_parallel_schedule"] = "1f1b"
        if str(par.get("context_parallel_method", "")).lower() in ("ulysses", "hybrid"):
            par["context_parallel_method"] = "colossal"
        reset["parallelism"] = par
        loaded = load_data(reset, lines=lines, source=source, world_size=1, check_files=False,
                           engine_support=engine_support, applied=overrides)
    missing = [k for k in SHAPE_KEYS if k not in (data.get("model") or {})]
    if missing:
        raise PlanError(message=f"{source}: model section is missing {', '.join(missing)}",
                        rule="model_fields", values={"missing": missing},
                        hint="a plan from the family defaults would describe a different model; "
                             "write these keys in model: (see templates/)")
    return loaded, (original.parallelism if original is not None else loaded.config.parallelism)


def yaml_layout(parallelism: Any) -> str:
    """The degrees a YAML sets away from the search's starting point (`_RESET`), e.g. 'tensor_parallel 2';
    '' when it sets none."""
    return ", ".join(f"{k} {getattr(parallelism, k)}" for k, v in _RESET.items()
                     if k in DEGREES + ("data_parallel_shard",) and getattr(parallelism, k) != v)


def plan_inputs(config, parallelism) -> PlanInputs:
    mode = str(config.recompute.mode).lower()
    recompute = {"full": "full", "select": "selective", "selective": "selective"}.get(mode, "none")
    schedule = (parallelism.pipeline_parallel_schedule or "1f1b").lower()
    from mftk.config.optimizer_muon import qk_clip_active
    from mftk.config.sections import tracking_requested

    t = config.training
    return PlanInputs(model=config.model, local_batch_size=t.local_batch_size,
                      global_batch_size=t.global_batch_size, schedule=schedule,
                      recompute=recompute, reshard_policy=parallelism.reshard_after_forward_policy,
                      layers_per_stage=parallelism.pipeline_parallel_layers_per_stage,
                      cp_method=parallelism.context_parallel_method, ulysses_degree=parallelism.ulysses_degree_in_cp,
                      sequence_parallel=parallelism.sequence_parallel,
                      rampup=tuple(t.rampup_batch_size) if t.rampup_batch_size else None,
                      track_max_logits=tracking_requested(config), muon=config.optimizer.type == "Muon",
                      qk_clip=qk_clip_active(config), update_on_device=config.mftk.update_on_device)


def _rate_ok(flag: str, value: float | None, what: str) -> None:
    """A hardware rate divides every time estimate: it must be a positive, finite number."""
    if value is not None and not (math.isfinite(value) and 0 < value < 1e12):
        raise InputError(message=f"{flag} {value:g} is not a positive finite number", hint=f"pass the {what}")


def _nodes_ok(world: int, nodes: int | None) -> None:
    if nodes is not None and (nodes < 1 or world % nodes):
        raise InputError(message=f"--nodes {nodes} does not split world size {world} evenly",
                         hint=f"pass a node count that divides {world}, e.g. "
                              f"{', '.join(str(d) for d in S.divisors(world)[:6])}")


# ----------------------------------------------------------------------------- the command's function

def plan_parallel(path: str | Path, *, world_size: int, nodes: int | None = None, device_memory: str = "64GiB",
                  check: bool = False, explain: str | None = None, device_tflops: float | None = None,
                  link_gbps: float | None = None, assumptions: Assumptions | str = "accelerator",
                  overrides: Iterable[str] = (), hardware: str | None = None) -> PlanReport:
    """Search (or, with check, evaluate the YAML's own) layouts for `world_size` devices.

    ``assumptions`` may name a profile: "accelerator" (the default: Megatron-core's accounting, = "megatron"), a
    framework's ("megatron", "torchtitan": measured on mftk/plan/references.py), "generic" (the uncalibrated
    ZeRO/Korthikanti accounting) or "mftk-cpu" (this engine on CPU); ``overrides`` are
    ``section.key=value`` strings applied to the YAML first (``--set``); ``hardware`` a preset of plan/hardware.py
    whose published peaks give the step time (instead of ``device_tflops``/``link_gbps``).
    """
    from mftk.plan import hardware as HW
    from mftk.plan.references import error_lines, profile_error

    if isinstance(assumptions, str):
        assumptions = preset(assumptions)
    hw = HW.preset(hardware) if hardware else None
    if hw and (device_tflops or link_gbps):
        raise InputError(message="--hardware and --device-tflops/--link-gbps both give the step time's rates",
                         hint="pass one: a preset (e.g. --hardware h100-sxm) or your own sustained rates")
    if world_size < 1:
        raise PlanError(message=f"world size must be ≥ 1, got {world_size}", rule="world_size",
                        values={"world_size": world_size}, hint="pass --world-size N with N devices")
    memory = parse_bytes(device_memory)
    _nodes_ok(world_size, nodes)
    _rate_ok("--device-tflops", device_tflops, "sustained TFLOP/s of one device, e.g. 300")
    _rate_ok("--link-gbps", link_gbps, "link bandwidth in Gbit/s, e.g. 400")
    on_cpu = assumptions.name == "mftk-cpu"
    loaded, parallelism = load_for_plan(path, world=world_size, check=check, overrides=overrides,
                                        engine_support=on_cpu)
    inputs = plan_inputs(loaded.config, parallelism)
    if not check:  # the plan's YAML block turns sequence_parallel on wherever tp > 1
        inputs = attrs.evolve(inputs, sequence_parallel=True)
    notes = [p.render() for p in loaded.notes if p.severity == "warning"]
    ignored = yaml_layout(parallelism) if not check else ""
    if ignored:
        notes.append(f"the YAML's layout ({ignored}) is not used: plan-parallel ranks every layout for "
                     f"{world_size} device(s); pass --check to evaluate the YAML's own")
    if inputs.recompute != "none" and world_size == 1:
        notes.append("recompute is ignored at world size 1 (the reference applies it only when world > 1)")
    elif inputs.recompute != "none" and isinstance(loaded.config.recompute.exclude_op, dict):
        notes.append("recompute.exclude_op: the activations and outputs the excluded cells keep are not in the "
                     "activation estimate (it counts their layers as recomputed)")
    kw = dict(device_tflops=device_tflops, link_gbps=link_gbps, hardware=hw)
    if check:
        lay = layout_from_config(loaded.config.parallelism, world_size)
        candidates = [S.Candidate(lay, tuple(S.check_layout(lay, inputs, nodes=nodes, engine=on_cpu)))]
    else:
        inter = 1 if inputs.schedule == "gpipe" else max(2, parallelism.pipeline_parallel_interleave_num)
        candidates = S.search(world_size, inputs, nodes=nodes, max_interleave=inter, engine=on_cpu)
    valid = [c for c in candidates if c.valid]
    rejected = tuple(c for c in candidates if not c.valid)
    ranked = tuple(sorted((Ranked(e, e.peak_bytes <= memory) for e in
                           (_estimate(c.layout, inputs, assumptions, **kw) for c in valid)), key=_rank_key))
    if not ranked and not check:
        raise PlanError(message=f"no valid layout for world size {world_size} "
                        f"({len(candidates)} candidates, all rejected):\n  " + "\n  ".join(S.why_none(candidates)),
                        rule="no_layout", values={"world_size": world_size},
                        hint="change the world size, or the batch/sequence/heads that the rules above name")
    explained = _explain(explain, world_size, inputs, nodes, assumptions, kw, on_cpu) if explain else None
    chosen = next((r for r in ranked if r.fits), ranked[0] if ranked else None)
    if chosen and not on_cpu:
        from mftk.config.support import NOT_IN_ENGINE

        notes += [f"{label(chosen.estimate.layout)}: {r.message}; planned anyway for the cluster's trainer (e.g. "
                  "MindSpore Transformers), `mftk train` refuses it"
                  for r in S.check_layout(chosen.estimate.layout, inputs, nodes=nodes) if NOT_IN_ENGINE in r.message]
    timed = bool(ranked) and ranked[0].estimate.step_time is not None
    return PlanReport(source=str(path), world=world_size, nodes=nodes, device_memory_bytes=memory,
                      model=_model_summary(loaded.config.model), candidates=len(candidates), ranked=ranked,
                      rejected=rejected, check=check,
                      check_ok=(bool(ranked) and ranked[0].fits) if check else None,
                      yaml_block=parallelism_yaml(chosen.estimate.layout, inputs) if chosen else "",
                      explained=explained, notes=tuple(notes), ranking=ranking_text(timed),
                      why_chosen=() if check else why_chosen(ranked, memory),
                      check_failures=check_failures(ranked[0], memory) if check and ranked and not ranked[0].fits
                      else (), profile=assumptions.name, hardware=hardware, accuracy=error_lines(assumptions.name),
                      accuracy_data=profile_error(assumptions.name).to_dict())


def _estimate(lay: Layout, inputs: PlanInputs, assumptions: Assumptions, *, device_tflops=None, link_gbps=None,
              hardware=None) -> LayoutEstimate:
    """`memory.estimate`, with the step time of a hardware preset when one is given."""
    est = estimate(lay, inputs, assumptions, device_tflops=device_tflops, link_gbps=link_gbps)
    if hardware is None:
        return est
    from mftk.plan import hardware as HW

    return attrs.evolve(est, step_time=HW.step_term(est, inputs, hardware, assumptions))


# The order of `_rank_key`, in words (one place for both).
RANK_ORDER = ("fits in device memory", "estimated step time", "pipeline bubble", "bytes communicated per step",
              "peak memory per device")


def _rank_key(r: Ranked) -> tuple:
    e = r.estimate
    time = e.step_time.value if e.step_time else 0.0
    return (not r.fits, time, e.bubble.value, e.comm_bytes, e.peak_bytes)


def ranking_text(timed: bool) -> str:
    """How layouts are ordered, as the table shows them."""
    if timed:
        return "ranked by: " + ", then ".join(RANK_ORDER)
    order = [RANK_ORDER[0]] + list(RANK_ORDER[2:])
    return ("ranked by: " + ", then ".join(order) + " (no step time without --hardware or --device-tflops and "
            "--link-gbps: less bubble and less traffic stand in for a faster step)")


def why_chosen(ranked: tuple[Ranked, ...], memory: float) -> tuple[str, ...]:
    """Why the first layout that fits is recommended: what it wins on against the next one, and where
    another layout would be better (least memory), so a choice of the highest peak is not a surprise."""
    fitting = [r for r in ranked if r.fits]
    if not fitting:
        best = ranked[0].estimate if ranked else None
        return (f"no layout fits {human(memory)} per device; the smallest peak is "
                f"{human(min(r.estimate.peak_bytes for r in ranked))}: raise --device-memory, add devices, or "
                "turn on recompute (recompute.mode: full)",) if best else ()
    best = fitting[0].estimate
    lines = [f"{short_label(best.layout)} is recommended: it fits ({human(best.peak_bytes)} of {human(memory)} per "
             f"device, at stage {best.peak.stage})" + _decider(fitting)]
    smallest = min(fitting, key=lambda r: r.estimate.peak_bytes).estimate
    if smallest is not best and smallest.peak_bytes < best.peak_bytes:
        lines.append(f"the least memory: {short_label(smallest.layout)} ({human(smallest.peak_bytes)} per device), at "
                     f"the cost of {human(smallest.comm_bytes)} communicated per step against "
                     f"{human(best.comm_bytes)}" + (f" and a {smallest.bubble.value:.0%} bubble"
                                                    if smallest.bubble.value else ""))
    return tuple(lines)


def _decider(fitting: list[Ranked]) -> str:
    """', and <the first criterion where it beats the runner-up>'."""
    if len(fitting) < 2:
        return ", the only layout that does"
    a, b = fitting[0].estimate, fitting[1].estimate
    if a.step_time and b.step_time and a.step_time.value < b.step_time.value:
        return f", with the shortest estimated step ({a.step_time.value:.3g} s; next {short_label(b.layout)} " \
               f"{b.step_time.value:.3g} s)"
    if a.bubble.value < b.bubble.value:
        return f", with the smallest pipeline bubble ({a.bubble.value:.0%}; next {short_label(b.layout)} {b.bubble.value:.0%})"
    if a.comm_bytes < b.comm_bytes:
        return (f", with {'no pipeline bubble and ' if not a.bubble.value else ''}the least communication "
                f"({human(a.comm_bytes)} per step; next {short_label(b.layout)} {human(b.comm_bytes)})")
    return f", with the lowest peak among equals ({human(a.peak_bytes)}; next {short_label(b.layout)} {human(b.peak_bytes)})"


def check_failures(r: Ranked, memory: float) -> tuple[str, ...]:
    """With --check on a layout that does not fit: the overshoot and the terms of its peak stage, largest first."""
    e = r.estimate
    over = e.peak_bytes - memory
    terms = sorted(e.peak.terms, key=lambda t: -t.value)
    head = (f"stage {e.peak.stage} needs {human(e.peak_bytes)} per device, {human(over)} more than the "
            f"{human(memory)} given ({over / memory:.0%} over)")
    return (head,) + tuple(f"{t.name} {human(t.value)} ({t.value / e.peak_bytes:.0%} of the peak)"
                           for t in terms if t.value > 0)


def short_label(lay: Layout) -> str:
    """The table's layout label: dp_replicate·dp_shard·cp·tp·pp·ep(·v)."""
    text = f"{lay.dp_replicate}·{lay.dp_shard}·{lay.cp}·{lay.tp}·{lay.pp}·{lay.ep}"
    return text + (f"·v{lay.interleave}" if lay.interleave > 1 else "")


def _model_summary(cfg) -> str:
    from mftk.plan.flops import param_counts

    total, active = param_counts(cfg)
    text = f"{cfg.model_type} L={cfg.num_hidden_layers} H={cfg.hidden_size} S={cfg.seq_length}, {count(total)} params"
    return text + (f" ({count(active)} active)" if active != total else "")


def parallelism_yaml(lay: Layout, inputs: PlanInputs) -> str:
    """The `parallelism:` block that selects this layout (data_parallel_shard per the reference's §2.2)."""
    rows = [("data_parallel_shard", -1 if lay.dp_replicate == 1 else lay.dp_shard),
            ("tensor_parallel", lay.tp), ("context_parallel", lay.cp), ("pipeline_parallel", lay.pp),
            ("expert_parallel", lay.ep), ("sequence_parallel", "true" if lay.tp > 1 else "false")]
    if lay.pp > 1:
        schedule = "interleaved_1f1b" if lay.interleave > 1 else ("gpipe" if inputs.schedule == "gpipe" else "1f1b")
        rows += [("pipeline_parallel_schedule", schedule), ("pipeline_parallel_interleave_num", lay.interleave)]
    return "parallelism:\n" + "".join(f"  {k}: {v}\n" for k, v in rows)


_KEYS = {"dpr": "dp_replicate", "dp_replicate": "dp_replicate", "dps": "dp_shard", "dp_shard": "dp_shard",
         "fsdp": "dp_shard", "dp": "dp_shard", "cp": "cp", "tp": "tp", "pp": "pp", "ep": "ep", "v": "interleave",
         "interleave": "interleave"}
_PAIR = re.compile(r"([a-z_]+?)\s*=?\s*(\d+)")


def parse_layout(text: str, world: int) -> Layout:
    """'dps4.tp2' / 'tp=2,pp=2' / 'dpr1.dps4.cp1.tp2.pp1.ep1' -> Layout; dp_shard fills the rest when omitted."""
    pairs = _PAIR.findall(text.lower().replace(" ", ""))
    leftover = _PAIR.sub("", text.lower()).strip(" .,×x*")
    degrees: dict[str, int] = {}
    for key, value in pairs:
        if key not in _KEYS or leftover:
            raise InputError(message=f"cannot read layout {text!r}",
                             hint="write degrees like dps4.tp2 or tp=2,pp=2 (keys: dpr, dps, cp, tp, pp, ep, v)")
        degrees[_KEYS[key]] = int(value)
    if zero := [k for k, v in pairs if int(v) < 1]:
        raise InputError(message=f"cannot read layout {text!r}: degree {zero[0]} is 0; every degree is at least 1",
                         hint="write degrees like dps4.tp2 (1 for a dimension that is not split)")
    if not pairs:
        raise InputError(message=f"cannot read layout {text!r}", hint="write degrees like dps4.tp2 or tp=2,pp=2")
    if "dp_shard" not in degrees:
        rest = 1
        for k in ("dp_replicate", "cp", "tp", "pp"):
            rest *= degrees.get(k, 1)
        degrees["dp_shard"] = max(world // rest, 1)
    return Layout(world=world, **degrees)


def _explain(text: str, world: int, inputs: PlanInputs, nodes, assumptions, kw, engine: bool = True) -> str:
    lay = parse_layout(text, world)
    bad = S.check_layout(lay, inputs, nodes=nodes, engine=engine)
    if bad:
        return f"layout {label(lay)} is invalid:\n" + "\n".join(f"  {r.rule}: {r.message}" for r in bad)
    return _estimate(lay, inputs, assumptions, **kw).explain()
