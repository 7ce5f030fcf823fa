"""`mftk inspect-ckpt`: what a checkpoint holds, from headers only; --verify, --diff."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from commands._options import JsonOpt
from mftk.units import count_exact

EPILOG = """Examples:

  mftk inspect-ckpt output/checkpoint                  (latest, via the tracker)

  mftk inspect-ckpt output/checkpoint/iteration_00000100 --verify --tensors

  mftk inspect-ckpt ckpt/iteration_00000100 --diff ckpt/iteration_00000200 --tensors --json | jq .changes

  mftk inspect-ckpt output/checkpoint --export-hf exported/      (then AutoModelForCausalLM.from_pretrained)

  mftk inspect-ckpt lora_run/checkpoint --export-hf merged/ --merge-lora   (LoRA folded into the weights)
"""

PathArg = Annotated[Path, typer.Argument(
    help="A save root (latest via latest_checkpointed_iteration.txt), an iteration_* dir, an HF dir or one "
         ".safetensors file.", show_default=False)]
TensorsOpt = Annotated[bool, typer.Option(
    "--tensors", help="Read tensor data: norms and NaN/Inf counts; with --diff, each tensor's relative change.")]
VerifyOpt = Annotated[bool, typer.Option(
    "--verify", help="Check every referenced file, header, offset and shard coverage, then read every tensor once: "
                     "its bytes against the checksum recorded at save time, and no NaN/Inf; exit 1 on any problem. "
                     "Add --quick for the headers-only check.")]
QuickOpt = Annotated[bool, typer.Option(
    "--quick", help="With --verify: headers, offsets and shard coverage only (a few small reads per file; no "
                    "checksums, no NaN/Inf scan).")]
FiniteOpt = Annotated[bool, typer.Option(
    "--finite", help="With --verify --quick: also read every tensor and report those holding NaN or infinity "
                     "(a full --verify always does).")]
DiffOpt = Annotated[Optional[Path], typer.Option(
    "--diff", help="Compare with another checkpoint: added, removed, reshaped tensors.", show_default=False)]
ExportOpt = Annotated[Optional[Path], typer.Option(
    "--export-hf", help="Write a Hugging Face transformers dir (model.safetensors or shards + index, config.json) "
                        "to this new or empty directory.", show_default=False)]
MergeLoraOpt = Annotated[bool, typer.Option(
    "--merge-lora", help="With --export-hf: fold the LoRA adapters into the weights (W + alpha/rank·B·A). Without "
                         "it a LoRA checkpoint exports its base weights plus a PEFT adapter in OUT/adapter/.")]
ModelConfigOpt = Annotated[Optional[Path], typer.Option(
    "--model-config", help="With --export-hf: the training YAML whose model: section describes the checkpoint "
                           "(only for checkpoints without mftk's extra state).", show_default=False)]


def inspect_ckpt(path: PathArg, json_out: JsonOpt = False, tensors: TensorsOpt = False, verify: VerifyOpt = False,
                 quick: QuickOpt = False, finite: FiniteOpt = False, diff: DiffOpt = None, export_hf: ExportOpt = None,
                 model_config: ModelConfigOpt = None, merge_lora: MergeLoraOpt = False) -> None:
    """Show a checkpoint's step, files, tensors and supported resume scenarios without loading it."""
    from mftk.errors import CheckpointError, InputError

    if export_hf is not None:
        if diff is not None or verify or tensors or finite or quick:
            raise InputError(message="--export-hf cannot be combined with --diff, --verify, --quick, --finite or "
                             "--tensors",
                             hint="run the export and the inspection as two commands")
        from mftk.ckpt.export import export_hf as export

        exported = export(path, export_hf, model_config=model_config, progress=_progress(), merge_lora=merge_lora)
        _print_json(exported.to_dict()) if json_out else _render_export(exported)
        return
    if model_config is not None or merge_lora:
        flag = "--model-config" if model_config is not None else "--merge-lora"
        raise InputError(message=f"{flag} only applies to --export-hf", hint="add --export-hf OUT")
    if finite and not verify:
        raise InputError(message="--finite only applies to --verify", hint="use --verify --finite")
    if quick and not verify:
        raise InputError(message="--quick only applies to --verify", hint="use --verify --quick")
    if diff is not None:
        from mftk.ckpt.diff import diff_checkpoints

        result = diff_checkpoints(path, diff, read_tensors=tensors, progress=_progress())
        _print_json(result.to_dict()) if json_out else _render_diff(result)
    else:
        from mftk.ckpt.inspect import inspect_checkpoint

        result = inspect_checkpoint(path, verify=verify, read_tensors=tensors, finite=finite, quick=quick,
                                    progress=_progress())
        _print_json(result.to_dict()) if json_out else _render_report(result)
    if result.problems:
        raise CheckpointError(message=f"{len(result.problems)} problem(s) in the checkpoint", path=str(path),
                              problems=result.problems, hint="use an earlier iteration_* dir, or re-save")


def _progress() -> Any:
    from commands._render import RichProgress

    return RichProgress()


def _print_json(data: Any) -> None:
    from commands._render import print_json

    print_json(data)


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _render_report(r: Any) -> None:
    from commands._render import add_row, column, print_table, say, styled, table

    c = r.common or {}
    say((f"{r.kind.upper()} checkpoint", "bold"), " ", str(r.step_dir or r.path))
    if r.kind == "mf":
        say(f"  step {r.step}  consumed_samples {c.get('consumed_samples')}  "
            f"global_batch_size {c.get('global_batch_size')}  epoch {c.get('epoch_num')}  world {r.world}  "
            f"prefix {r.prefix!r}  metadata.json {'yes' if r.has_metadata else 'no'}  "
            f"mftk extra state {'yes' if r.has_extra_state else 'no'}")
        if r.other_steps:
            say(f"  iteration dirs here: {', '.join(map(str, r.other_steps))}")
    for note in r.notes:
        say("  ", ("note:", "cyan"), " ", note)
    if r.ranks:
        files = table(column("rank", justify="right"), "model file", "opt file", "extra state",
                      column("size", justify="right"), title="Files per rank")
        for f in r.ranks:
            add_row(files, f.rank, f.model or styled("missing", "red"), f.opt or "-", f.state or "-", _size(f.bytes))
        print_table(files)
    cols = ["name", "kind", "dtype", column("shape", justify="right"), column("size", justify="right"), "layout"]
    if r.tensors_read:
        cols += [column("norm", justify="right"), column("NaN/Inf", justify="right")]
    tensors = table(*cols, title="Tensors")
    for t in r.tensors:
        row = [t.name, t.kind, t.dtype, "x".join(map(str, t.shape)) or "scalar", _size(t.nbytes), t.layout]
        if r.tensors_read:
            row += [f"{t.norm:.6g}" if t.norm is not None else "-", f"{t.nan}/{t.inf}" if t.nan is not None else "-"]
        add_row(tensors, *row)
    print_table(tensors)
    by_dtype = ", ".join(f"{k} {_size(v)}" for k, v in sorted(r.bytes_by_dtype.items()))
    say(f"model parameters {count_exact(r.model_parameters)}  optimizer elements "
        f"{r.optimizer_elements:,}  bytes by dtype: {by_dtype or '-'}  files {_size(r.file_bytes)}")
    if r.unused_optimizer_states:
        from mftk.ckpt.names import describe_unused

        say("optimizer states mftk's AdamW does not use (skipped by a resume; all names in --json):")
        for line in describe_unused(r.unused_optimizer_states):
            say(f"  {line}")
    scen = table(column("#", justify="right"), "resume scenario", "supported", "why", title="Resume scenarios")
    for sc in r.scenarios:
        add_row(scen, sc.number, sc.name, styled("yes", "green") if sc.supported else styled("no", "red"), sc.reason)
    print_table(scen)
    if r.verified and not r.problems:
        say(("verified:", "green"), " files, headers, offsets and shard coverage agree"
            + (", every tensor matches its checksum" if r.checksums_checked and not r.unchecksummed else "")
            + (", no NaN/Inf" if r.tensors_read or r.finite_checked else ""))


def _render_diff(d: Any) -> None:
    from commands._render import add_row, print_table, say, table

    say(("A", "bold"), f" {d.a} (step {d.step_a})  ", ("B", "bold"), f" {d.b} (step {d.step_b})")
    ca, cb = d.common_a or {}, d.common_b or {}
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            say(f"  common.json {key}: {ca.get(key)} -> {cb.get(key)}")
    rows = [("added", n, "-", "") for n in d.added] + [("removed", n, "", "-") for n in d.removed]
    rows += [("reshaped", ch.name, "x".join(map(str, ch.shape_a)), "x".join(map(str, ch.shape_b)))
             for ch in d.reshaped]
    rows += [("dtype", ch.name, ch.dtype_a, ch.dtype_b) for ch in d.retyped]
    if d.tensors_read:
        rows += [("rel. change", ch.name, f"{ch.rel_change:.3e}", f"max |Δ| {ch.max_abs_change:.3e}")
                 for ch in d.changes]
    if rows:
        t = table("change", "name", "A", "B", title="Tensor differences")
        for row in rows:
            add_row(t, *row)
        print_table(t)
    else:
        say("no tensor added, removed, reshaped or retyped")
    say(f"{len(d.changes)} tensor(s) with the same name and shape"
        + ("" if d.tensors_read else " (add --tensors for per-tensor relative change)")
        + ("; checkpoints identical" if d.identical and d.tensors_read else ""))


def _render_export(r: Any) -> None:
    from commands._render import notice, say

    for note in r.notes:
        notice("note", note)
    files = ", ".join(r.files) + (f" + {r.index_file}" if r.index_file else "")
    say(("exported", "bold"), f" {r.source} (step {r.step}, {r.model_type}) -> {r.out_dir}")
    say(f"  {r.tensors} tensors, {count_exact(r.parameters)} parameters, {_size(r.total_bytes)} "
        f"{r.dtype}  files: {files}, {r.config_file}  (model section from {r.model_source})")
