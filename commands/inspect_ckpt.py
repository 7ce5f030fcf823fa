"""`mftk inspect-ckpt`: what a checkpoint holds, from headers only; --verify, --diff."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from commands._options import JsonOpt

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
    "--verify", help="Check every referenced file, header, offset and shard coverage; exit 1 on any problem.")]
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
                 diff: DiffOpt = None, export_hf: ExportOpt = None, model_config: ModelConfigOpt = None,
                 merge_lora: MergeLoraOpt = False) -> None:
    """Show a checkpoint's step, files, tensors and supported resume scenarios without loading it."""
    from mftk.errors import CheckpointError, InputError

    if export_hf is not None:
        if diff is not None or verify or tensors:
            raise InputError(message="--export-hf cannot be combined with --diff, --verify or --tensors",
                             hint="run the export and the inspection as two commands")
        from mftk.ckpt.export import export_hf as export

        exported = export(path, export_hf, model_config=model_config, progress=_progress(), merge_lora=merge_lora)
        _print_json(exported.to_dict()) if json_out else _render_export(exported)
        return
    if model_config is not None or merge_lora:
        flag = "--model-config" if model_config is not None else "--merge-lora"
        raise InputError(message=f"{flag} only applies to --export-hf", hint="add --export-hf OUT")
    if diff is not None:
        from mftk.ckpt.diff import diff_checkpoints

        result = diff_checkpoints(path, diff, read_tensors=tensors, progress=_progress())
        _print_json(result.to_dict()) if json_out else _render_diff(result)
    else:
        from mftk.ckpt.inspect import inspect_checkpoint

        result = inspect_checkpoint(path, verify=verify, read_tensors=tensors, progress=_progress())
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
    from rich.markup import escape
    from rich.table import Table

    from commands._render import console

    c = r.common or {}
    console.print(f"[bold]{r.kind.upper()} checkpoint[/] {r.step_dir or r.path}", highlight=False)
    if r.kind == "mf":
        console.print(f"  step {r.step}  consumed_samples {c.get('consumed_samples')}  "
                      f"global_batch_size {c.get('global_batch_size')}  epoch {c.get('epoch_num')}  "
                      f"world {r.world}  prefix {r.prefix!r}  metadata.json {'yes' if r.has_metadata else 'no'}  "
                      f"mftk extra state {'yes' if r.has_extra_state else 'no'}", highlight=False)
        if r.other_steps:
            console.print(f"  iteration dirs here: {', '.join(map(str, r.other_steps))}", highlight=False)
        for note in r.notes:
            console.print(f"  [cyan]note:[/] {escape(note)}", highlight=False)
    if r.ranks:
        files = Table("rank", "model file", "opt file", "extra state", "size", title="Files per rank")
        for f in r.ranks:
            files.add_row(str(f.rank), f.model or "[red]missing[/]", f.opt or "-", f.state or "-", _size(f.bytes))
        console.print(files)
    table = Table("name", "kind", "dtype", "shape", "size", "layout", title="Tensors")
    if r.tensors_read:
        for col in ("norm", "NaN/Inf"):
            table.add_column(col, justify="right")
    for t in r.tensors:
        row = [t.name, t.kind, t.dtype, "x".join(map(str, t.shape)) or "scalar", _size(t.nbytes), t.layout]
        if r.tensors_read:
            row += [f"{t.norm:.6g}" if t.norm is not None else "-", f"{t.nan}/{t.inf}" if t.nan is not None else "-"]
        table.add_row(*row)
    console.print(table)
    by_dtype = ", ".join(f"{k} {_size(v)}" for k, v in sorted(r.bytes_by_dtype.items()))
    console.print(f"model parameters {r.model_parameters:,}  optimizer elements {r.optimizer_elements:,}  "
                  f"bytes by dtype: {by_dtype or '-'}  files {_size(r.file_bytes)}", highlight=False)
    if r.unused_optimizer_states:
        from mftk.ckpt.names import describe_unused

        console.print("optimizer states mftk's AdamW does not use (skipped by a resume; all names in --json):")
        for line in describe_unused(r.unused_optimizer_states):
            console.print(f"  {escape(line)}", highlight=False)
    scen = Table("#", "resume scenario", "supported", "why", title="Resume scenarios")
    for s in r.scenarios:
        scen.add_row(str(s.number), s.name, "[green]yes[/]" if s.supported else "[red]no[/]", s.reason)
    console.print(scen)
    if r.verified and not r.problems:
        console.print("[green]verified:[/] files, headers, offsets and shard coverage agree"
                      + (", no NaN/Inf" if r.tensors_read else ""))


def _render_diff(d: Any) -> None:
    from rich.table import Table

    from commands._render import console

    console.print(f"[bold]A[/] {d.a} (step {d.step_a})  [bold]B[/] {d.b} (step {d.step_b})", highlight=False)
    ca, cb = d.common_a or {}, d.common_b or {}
    for key in sorted(set(ca) | set(cb)):
        if ca.get(key) != cb.get(key):
            console.print(f"  common.json {key}: {ca.get(key)} -> {cb.get(key)}", highlight=False)
    table = Table("change", "name", "A", "B", title="Tensor differences")
    for n in d.added:
        table.add_row("added", n, "-", "")
    for n in d.removed:
        table.add_row("removed", n, "", "-")
    for ch in d.reshaped:
        table.add_row("reshaped", ch.name, "x".join(map(str, ch.shape_a)), "x".join(map(str, ch.shape_b)))
    for ch in d.retyped:
        table.add_row("dtype", ch.name, ch.dtype_a, ch.dtype_b)
    if d.tensors_read:
        for ch in d.changes:
            table.add_row("rel. change", ch.name, f"{ch.rel_change:.3e}", f"max |Δ| {ch.max_abs_change:.3e}")
    console.print(table)
    console.print(f"{len(d.changes)} tensor(s) with the same name and shape"
                  + ("" if d.tensors_read else " (add --tensors for per-tensor relative change)")
                  + ("; checkpoints identical" if d.identical and d.tensors_read else ""), highlight=False)


def _render_export(r: Any) -> None:
    from commands._render import console, err_console

    for note in r.notes:
        err_console.print(f"[yellow]note:[/] {note}", highlight=False)
    files = ", ".join(r.files) + (f" + {r.index_file}" if r.index_file else "")
    console.print(f"[bold]exported[/] {r.source} (step {r.step}, {r.model_type}) -> {r.out_dir}", highlight=False)
    console.print(f"  {r.tensors} tensors, {r.parameters:,} parameters, {_size(r.total_bytes)} {r.dtype}  "
                  f"files: {files}, {r.config_file}  (model section from {r.model_source})", highlight=False)
