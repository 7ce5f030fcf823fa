"""`mftk validate-config`: check a training YAML completely before anything expensive runs."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commands._options import JsonOpt, NoCheckFilesOpt, SetOpt, WorldSizeOpt

EPILOG = """[bold]Examples[/]

  mftk validate-config templates/qwen3_tiny.yaml
  mftk validate-config my.yaml --world-size 8 --set training.global_batch_size=64
  mftk validate-config my.yaml --print-resolved      [dim]# full YAML, defaults marked[/]
  mftk validate-config --model-from-hf config.json   [dim]# HF config.json -> model: section[/]
  mftk convert-config static.yaml -o my.yaml         [dim]# a static-graph config: convert it first[/]
  mftk validate-config my.yaml --show-samples 2 --rank 1 --world-size 2 --tokenizer tok.json

Exit codes: 0 valid, 1 invalid config, 2 usage or file error."""


def validate_config(
    config: Annotated[Optional[Path], typer.Argument(help="Training YAML to check.", show_default=False)] = None,
    world_size: WorldSizeOpt = None,
    no_check_files: NoCheckFilesOpt = False,
    print_resolved: Annotated[bool, typer.Option("--print-resolved", help="Print the full YAML with defaults filled in and marked.")] = False,
    json_out: JsonOpt = False,
    overrides: SetOpt = None,
    model_from_hf: Annotated[Optional[Path], typer.Option("--model-from-hf", help="Print the model: section for a Hugging Face config.json and exit.")] = None,
    show_samples: Annotated[Optional[int], typer.Option("--show-samples", min=1, help="Show the first N samples a rank's loader yields.", rich_help_panel="Samples")] = None,
    rank: Annotated[int, typer.Option("--rank", min=0, help="With --show-samples: which rank's loader.", rich_help_panel="Samples")] = 0,
    start: Annotated[int, typer.Option("--start", min=0, help="With --show-samples: first sample position of the rank's epoch.", rich_help_panel="Samples")] = 0,
    tokenizer: Annotated[Optional[Path], typer.Option("--tokenizer", help="With --show-samples: decode tokens with this tokenizer.json.", rich_help_panel="Samples")] = None,
) -> None:
    """Check a training YAML: every problem at once, with its YAML path, the arithmetic and a fix."""
    from commands._render import console, notice, print_json
    from mftk.config.load import load_config
    from mftk.errors import ConfigError, InputError, Problem

    if model_from_hf is not None:
        _print_hf_section(model_from_hf, json_out)
        return
    if config is None:
        raise InputError(message="missing CONFIG argument", hint="mftk validate-config path/to/config.yaml")
    world = world_size or 1
    try:
        loaded = load_config(config, overrides=overrides or (), world_size=world, check_files=not no_check_files)
        if not no_check_files:
            loaded = _with_data_checks(loaded)
    except ConfigError as exc:
        if json_out:  # the JSON on stdout, the same problems on stderr, exit 1
            problems = exc.problems or [Problem(path="", message=exc.message, hint=exc.hint)]  # e.g. a static config
            print_json({"valid": False, "source": str(config), "problems": [_problem_dict(p) for p in problems]})
        raise
    if show_samples is not None:
        _show_samples(loaded.config, world, rank, show_samples, start, tokenizer, json_out)
        return
    from mftk.config.report import resolved, resolved_yaml
    from mftk.plan.config_summary import summarize

    summary = summarize(loaded, world)
    if json_out:
        print_json({"valid": True, "source": str(config), "problems": [_problem_dict(p) for p in loaded.notes],
                    "summary": summary.to_dict(), "resolved": resolved(loaded.config)})
        return
    for p in loaded.notes:
        notice(p.severity, p.render())
    if print_resolved:
        console.print(resolved_yaml(loaded), markup=False, highlight=False, soft_wrap=True)  # YAML: never wrapped
        return
    _render_summary(str(config), summary)


def _with_data_checks(loaded):  # type: ignore[no-untyped-def]
    """The data files against the model (`mftk.data.loader.vocabulary_problems`): errors fail the config as
    the loader's do, warnings join its notes."""
    import attrs

    from mftk.data.loader import vocabulary_problems
    from mftk.errors import ConfigError

    found = vocabulary_problems(loaded.config)
    errors = [p for p in found if p.severity == "error"]
    if errors:
        raise ConfigError(message=f"{len(errors)} problem(s) in {loaded.source}", source=loaded.source,
                          problems=loaded.notes + found)
    return attrs.evolve(loaded, notes=loaded.notes + found)


def _show_samples(config, world: int, rank: int, n: int, start: int, tokenizer, json_out: bool) -> None:
    from commands._render import RichProgress, notice, print_json, say
    from mftk.data.preview import preview_samples

    result = preview_samples(config, world_size=world, rank=rank, n=n, start=start,
                             tokenizer=str(tokenizer) if tokenizer else None, progress=RichProgress())
    for w in result["warnings"]:
        notice("warning", w)
    if json_out:
        print_json({"samples": result["samples"]})
        return
    say(f"rank {rank} reads data shard {result['dp_rank']} of {result['dp_size']} (the first 16 ids of each "
        "column; --json prints them all)")
    for smp in result["samples"]:
        say((f"position {smp['position']}", "bold"), f": blended sample {smp['blended_index']} = dataset "
            f"{smp['dataset']} ({smp['prefix']}) sample {smp['dataset_sample']}")
        for label, text in sample_lines(smp):
            say(f"  {label:<13} {text}")


def sample_lines(smp: dict) -> list[tuple[str, str]]:
    """(label, text) rows of one sample: token ids, labels, loss mask, position ids and the decoded text."""
    ids = smp["input_ids"]
    rows = [("input_ids", f"{_head(ids)} ({len(ids)} tokens)")]
    if "labels" in smp:
        shifted = smp["labels"][:-1] == ids[1:]
        rows.append(("labels", _head(smp["labels"]) + (" (input_ids shifted by one)" if shifted else "")))
    if "loss_mask" in smp:
        mask = smp["loss_mask"]
        zeros = [i for i, m in enumerate(mask) if not m]
        where = f"; 0 at {_spans(zeros)}" if zeros else ""
        rows.append(("loss_mask", f"{len(mask) - len(zeros)} of {len(mask)} tokens count in the loss{where}"))
    if "position_ids" in smp:
        pos = smp["position_ids"]
        restarts = [i for i in range(1, len(pos)) if pos[i] != pos[i - 1] + 1]
        text = f"{pos[0]}..{pos[-1]}" if not restarts else f"restart at {_spans(restarts)}"
        rows.append(("position_ids", text))
    for key in sorted(k for k in smp if k not in _SAMPLE_KEYS):
        rows.append((key, _head(smp[key]) if isinstance(smp[key], list) else str(smp[key])))
    if "text" in smp:
        text = smp["text"]
        more = f" … ({len(text):,} characters; --json has all)" if len(text) > 300 else ""
        rows.append(("text", repr(text[:300]) + more))
    return rows


_SAMPLE_KEYS = {"dataset", "dataset_sample", "input_ids", "labels", "loss_mask", "position_ids", "position",
                "blended_index", "prefix", "text"}


def _head(values: list, n: int = 16) -> str:
    return "[" + ", ".join(map(str, values[:n])) + (", …]" if len(values) > n else "]")


def _spans(indices: list[int], limit: int = 8) -> str:
    """'5, 77-79, 100' for sorted indices (the first `limit` spans)."""
    spans: list[list[int]] = []
    for i in indices:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans[:limit])
    return text + (f", … ({len(spans)} spans)" if len(spans) > limit else "")


def _problem_dict(p) -> dict:
    return {"path": p.path, "line": p.line, "severity": p.severity, "message": p.message,
            "value": p.value if isinstance(p.value, (int, float, str, bool, list, type(None))) else repr(p.value),
            "hint": p.hint}


def _render_summary(source: str, summary) -> None:
    from commands._render import add_row, print_table, say, table

    say(("✓ valid:", "bold green"), " ", source)
    for name, rows in summary.sections.items():
        t = table("what", "value", "why", title=name, show_header=False, box=None, pad_edge=False)
        t.columns[0].style, t.columns[2].style = "bold", "dim"
        for label, value, why in rows:
            add_row(t, label, value, why)
        print_table(t)


def _print_hf_section(path: Path, json_out: bool) -> None:
    from commands._render import console, notice, print_json
    from mftk.config.hf import hf_to_model_section, model_section_yaml, read_hf_config

    section, notes = hf_to_model_section(read_hf_config(path))
    for p in notes:
        notice(p.severity, p.render())
    if json_out:
        print_json({"model": section})
    else:
        console.print(model_section_yaml(section), markup=False, highlight=False, end="")
