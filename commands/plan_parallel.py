"""`mftk plan-parallel`: every DP/FSDP/TP/PP/CP/EP layout for N devices, ranked, with memory per stage."""
from __future__ import annotations

from typing import Annotated, Optional

import typer

from commands._options import ConfigArg, JsonOpt, SetOpt

EPILOG = """[bold]Examples[/]

  mftk plan-parallel templates/qwen3_0.6b.yaml --world-size 8
  mftk plan-parallel templates/deepseek_v3_1b.yaml --world-size 16 --nodes 2 --device-memory 32GiB
  mftk plan-parallel my.yaml --world-size 8 --check          [dim]# the YAML's own layout; exit 1 if it does not fit[/]
  mftk plan-parallel my.yaml --world-size 8 --set training.global_batch_size=64  [dim]# plan the YAML you will run[/]
  mftk plan-parallel my.yaml --world-size 8 --explain dps4.tp2 [dim]# formula and inputs of every term[/]
  mftk plan-parallel my.yaml --world-size 64 --device-tflops 300 --link-gbps 400 --json | jq '.layouts[0]'
  mftk plan-parallel llama.yaml --world-size 256 --profile torchtitan --hardware h100-sxm [dim]# tokens/s per device[/]

Exit codes: 0 plan found (with --check: valid and fits), 1 invalid config, no layout, or --check failed,
2 usage error (bad --device-memory, --nodes, --explain)."""


def plan_parallel(
    config: ConfigArg,
    world_size: Annotated[int, typer.Option("--world-size", "-n", min=1, help="Devices to plan for.")],
    nodes: Annotated[Optional[int], typer.Option("--nodes", help="Nodes the devices span (keeps TP inside a node).")] = None,
    device_memory: Annotated[str, typer.Option("--device-memory", help="Memory per device, e.g. 64GiB or 80G (G, GB and GiB all mean GiB, as printed).")] = "64GiB",
    top: Annotated[int, typer.Option("--top", min=1, help="Layouts shown in the table.")] = 10,
    json_out: JsonOpt = False,
    check: Annotated[bool, typer.Option("--check", help="Evaluate only the YAML's own layout; exit 1 if invalid or too big.")] = False,
    explain: Annotated[Optional[str], typer.Option("--explain", help="Explain one layout term by term, e.g. dps4.tp2.")] = None,
    device_tflops: Annotated[Optional[float], typer.Option("--device-tflops", help="Sustained TFLOP/s per device (step time).")] = None,
    link_gbps: Annotated[Optional[float], typer.Option("--link-gbps", help="Link bandwidth in Gbit/s (step time).")] = None,
    profile: Annotated[str, typer.Option("--profile", help="Memory profile: accelerator (default: Megatron-core's accounting, as megatron), megatron or torchtitan (each measured on published runs), generic (uncalibrated ZeRO/Korthikanti accounting), mftk-cpu (mftk's CPU engine).")] = "accelerator",
    hardware: Annotated[Optional[str], typer.Option("--hardware", help="Hardware preset for the step time and tokens/s: h100-sxm, h200-sxm, a100-sxm, ascend-910 (published peaks).")] = None,
    overrides: SetOpt = None,
) -> None:
    """Search every parallel layout for N devices, reject invalid ones with the rule, estimate memory per device."""
    from commands._render import notice, print_json
    from mftk.plan.report import plan_parallel as run_plan

    report = run_plan(config, world_size=world_size, nodes=nodes, device_memory=device_memory, check=check,
                      explain=explain, device_tflops=device_tflops, link_gbps=link_gbps, assumptions=profile,
                      overrides=overrides or (), hardware=hardware)
    if json_out:
        print_json(report.to_dict(top=top))
    else:
        for note in report.notes:
            notice("warning", note)
        _render(report, top)
    if check and not report.check_ok:
        from mftk.errors import PlanError

        what = "; ".join(report.check_failures[:4]) if report.check_failures else "see the rules above"
        raise PlanError(message=f"--check: the layout of {config} does not fit {world_size} device(s): {what}",
                        rule="check", hint="lower the largest term (recompute.mode: full for activations, more "
                                           "tp/pp for weights and logits, FSDP for optimizer states) or raise "
                                           "--device-memory; plan-parallel without --check lists layouts that fit")


def _render(report, top: int) -> None:
    from rich import box

    from commands._render import add_row, column, print_table, say, styled, table
    from mftk.plan.memory import human
    from mftk.plan.report import short_label, tokens_per_s

    say((report.model, "bold"), f" · world {report.world}" + (f" on {report.nodes} nodes" if report.nodes else "")
        + f" · {human(report.device_memory_bytes)}/device · {len(report.ranked)} valid of {report.candidates}")
    if report.explained:  # one layout, term by term: the ranking table is not repeated
        say(report.explained)
        _accuracy(report)
        return
    t = table(*(column(c, justify="left" if c in ("layout", "fits") else "right")
                for c in ("layout", "fits", "peak@st", "states", "acts", "logits", "bub", "comm", "step", "tok/s")),
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for r in report.ranked[:top]:
        e, st = r.estimate, r.estimate.peak
        states = sum(st.term(n).value for n in ("weights", "gradients", "optimizer", "fsdp gathered"))
        logits = next((x.value for x in st.terms if x.name == "logits + loss"), 0.0)
        add_row(t, short_label(e.layout), styled("yes", "green") if r.fits else styled("no", "red"),
                f"{_short(e.peak_bytes)}@{st.stage}", _short(states), _short(st.term("activations").value),
                _short(logits), f"{e.bubble.value:.0%}", _short(e.comm_bytes),
                f"{e.step_time.value:.3g}s" if e.step_time else "-", _rate(tokens_per_s(e)))
    print_table(t)
    say("layout = dp_replicate·dp_shard·cp·tp·pp·ep(·v); sizes K/M/G = KiB/MiB/GiB; "
        "states = weights+grads+optimizer+FSDP gather; tok/s per device", style="dim")
    if not report.check:
        say(report.ranking)
    for line in report.why_chosen:
        say(line)
    _accuracy(report)
    if report.rejected:
        from collections import Counter

        counts = Counter(r.rule for c in report.rejected for r in c.rejections)
        say("rejected: " + ", ".join(f"{rule} ×{n}" for rule, n in counts.most_common()))
        if report.check:
            for r in report.rejected[0].rejections:
                say("  ", ("•", "red"), f" {r.rule}: {r.message}")
    if report.yaml_block:
        which = "this layout" if report.check else "best layout that fits" if report.best and report.best.fits \
            else "best layout (does not fit)"
        say("")
        say((f"{which}:", "bold"))
        say(report.yaml_block.rstrip("\n"))


def _accuracy(report) -> None:
    """The profile's measured error on published runs, under every plan (plan/references.py)."""
    from commands._render import say

    for line in report.accuracy:
        say(line, style="dim" if line.startswith(" ") else None)


def _rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}"


def _short(n: float) -> str:
    for unit, size in (("G", 1024 ** 3), ("M", 1024 ** 2), ("K", 1024)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n:.0f}B"
