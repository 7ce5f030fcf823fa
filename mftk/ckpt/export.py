"""A MindSpore Transformers checkpoint → a Hugging Face ``transformers`` model directory.

``export_hf(path, out)``: merge the shards of every model tensor (``metadata.json``), map the
reference names and layouts to HF ones (the family's `mftk.ckpt.hf` module, numpy
only: MindSpore is never imported), and write ``model.safetensors`` (or ``model-0000i-of-0000n``
files plus ``model.safetensors.index.json`` above ``max_shard_bytes``) and a ``config.json``
describing what mftk's engine computed (:func:`mftk.config.hf.hf_config_from_model_section`).

The architecture comes from the resolved config mftk saves with each checkpoint (`mftk.ckpt.run_config`;
or from a training YAML for checkpoints without one): guessing it from tensor shapes cannot recover
rope, eps or routing settings. Everything is written into a hidden temp dir next to ``out``
and renamed when complete, so an interrupted export never looks like a finished one.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.layout import HF_INDEX, HF_SINGLE, locate, scan_step_dir
from mftk.ckpt.load import iter_global
from mftk.ckpt.run_config import saved_model_section
from mftk.config.families import family_of
from mftk.errors import CheckpointError, ConfigError, InputError, Problem
from mftk.lock import exclusive_output
from mftk.progress import NULL_PROGRESS, Progress

DEFAULT_MAX_SHARD_BYTES = 5 * 10**9  # transformers' save_pretrained default ("5GB")


@attrs.frozen
class ExportResult:
    """What was written, for the command to render."""

    source: str  # the step dir read
    out_dir: str
    model_type: str
    step: int | None
    files: tuple[str, ...]  # weight files, in order
    index_file: str | None  # model.safetensors.index.json when sharded
    config_file: str
    tensors: int
    parameters: int  # elements in the written tensors (MTP's shared copies counted once per name)
    total_bytes: int  # tensor data bytes (the index's total_size)
    dtype: str
    model_source: str  # where the model section came from
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


def export_hf(path: str | os.PathLike, out: str | os.PathLike, *, model_config: str | os.PathLike | None = None,
              max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES, progress: Progress = NULL_PROGRESS) -> ExportResult:
    """Export the checkpoint at ``path`` (save root, ``iteration_*`` dir) to the new HF dir ``out``.

    ``model_config``: a training YAML whose ``model:`` section describes the checkpoint, for
    checkpoints without mftk's extra state (written by the reference or an older mftk).
    """
    loc = locate(path)
    if loc.kind != "mf":
        what = "is already a Hugging Face weights dir" if loc.kind == "hf" else "is a single file"
        raise CheckpointError(message=f"{path} {what}; --export-hf needs a MindSpore Transformers checkpoint",
                              path=str(path), hint="pass the save_path of a run or one of its iteration_* dirs")
    out = Path(out)
    with exclusive_output(out, EXPORT_WHAT):  # a second export into `out` waits for nobody: it is refused
        return _export(loc, out, model_config, max_shard_bytes, progress)


EXPORT_WHAT = "mftk inspect-ckpt --export-hf output"


def _export(loc: Any, out: Path, model_config: str | os.PathLike | None, max_shard_bytes: int,
            progress: Progress) -> ExportResult:
    _check_out(out)
    files = scan_step_dir(loc.step_dir)
    if files.problems or not files.model:
        raise CheckpointError(message=f"{loc.step_dir}: inconsistent or missing model files", path=str(loc.step_dir),
                              problems=list(files.problems) or ["no *-model-*.safetensors file"])
    section, model_source = _model_section(loc.step_dir, files.world, model_config)
    cfg = _build_config(section, model_source)
    from mftk.config.hf import hf_config_from_model_section, hf_export_notes

    family = family_of(cfg)
    headers = {n: t for p in files.model.values() for n, t in st.read_header(p).tensors.items()}
    dtype = _export_dtype({t.dtype for t in headers.values()})
    hf_config = hf_config_from_model_section(cfg, dtype=dtype)  # refuses what HF cannot express, before reading data
    notes = [p.render() for p in hf_export_notes(cfg)]

    progress.start("reading model tensors", total=len(headers))
    mf: dict[str, np.ndarray] = {}
    for name, arr in iter_global(loc.step_dir, sorted(headers)):
        mf[name] = arr
        progress.advance()
    progress.done()
    hf = family.mf_to_hf(mf, cfg)
    hf.update(_zero_fill(cfg, hf, notes))
    del mf
    tensors = {k: (st.to_bf16(v) if dtype == "bfloat16" and v.dtype == np.float32 else v) for k, v in hf.items()}
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{out.name}-", dir=out.parent))  # unique to this run
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o777 & ~mask)  # mkdtemp's 0700 would become the export's mode
    except OSError as exc:
        raise InputError(message=f"cannot write the export to {out}: {exc.strerror or exc}", path=str(out),
                         hint="choose a writable directory with enough free space") from None
    try:
        names, index = _write_weights(tmp, tensors, max_shard_bytes, progress)
        (tmp / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n", encoding="utf-8")
        _publish(tmp, out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise InputError(message=f"cannot write the export to {out}: {exc.strerror or exc}", path=str(out),
                         hint="choose a writable directory with enough free space") from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(
        source=str(loc.step_dir), out_dir=str(out), model_type=cfg.model_type, step=loc.step,
        files=tuple(names), index_file=HF_INDEX if index else None, config_file="config.json", tensors=len(hf),
        parameters=sum(int(v.size) for v in hf.values()), total_bytes=sum(_nbytes(v) for v in tensors.values()),
        dtype=dtype, model_source=model_source, notes=tuple(notes))


# ------------------------------------------------------------------------------------- the model section
def _model_section(step_dir: Path, world: int, model_config: Any) -> tuple[dict, str]:
    if model_config is not None:
        from mftk.config.yamlio import parse_yaml, read_config_file

        data, _ = parse_yaml(read_config_file(model_config), str(model_config))
        section = data.get("model") if isinstance(data, dict) else None
        if not isinstance(section, dict):
            raise ConfigError(message=f"{model_config}: no model: section", source=str(model_config),
                              problems=[Problem(path="model", message="the model section is missing",
                                                hint="pass the training YAML the checkpoint was saved with")])
        return section, str(model_config)
    section, source = saved_model_section(step_dir, world)
    if section is None:
        raise CheckpointError(message=f"{step_dir} {source}: the architecture cannot be read from it",
                              path=str(step_dir),
                              hint="pass the training YAML it was saved with: mftk inspect-ckpt PATH --export-hf OUT "
                                   "--model-config CONFIG.yaml")
    return section, source


def _build_config(section: dict, source: str) -> Any:
    from mftk.config.load import build_model_section

    cfg, problems = build_model_section(dict(section))
    errors = [p for p in problems if p.severity == "error"]
    if cfg is None or errors:
        raise ConfigError(message=f"the model section from {source} does not load", source=source, problems=errors)
    return cfg


# ------------------------------------------------------------------------------------- tensors
def _export_dtype(dtypes: set[str]) -> str:
    """bf16 when every floating tensor was stored as bf16 (exact: read back as fp32), else fp32 and others as stored."""
    floats = {d for d in dtypes if d.startswith(("F", "BF"))}
    return "bfloat16" if floats == {"BF16"} else "float32"


def _zero_fill(cfg: Any, hf: dict[str, np.ndarray], notes: list[str]) -> dict[str, np.ndarray]:
    """Tensors transformers builds that mftk's model lacks, whose zero value is exactly "absent".

    Qwen3 with ``attention_bias``: HF also puts a bias on ``o_proj``; mftk's projection has none.
    """
    add: dict[str, np.ndarray] = {}
    if cfg.model_type in ("qwen3", "qwen3_moe") and cfg.attention_bias:
        for i in range(cfg.num_hidden_layers):
            name = f"model.layers.{i}.self_attn.o_proj.bias"
            if name not in hf:
                add[name] = np.zeros((cfg.hidden_size,), np.float32)
        if add:
            notes.append("self_attn.o_proj.bias written as zeros: transformers' Qwen3 has one, mftk's model has none")
    return add


def _nbytes(v: Any) -> int:
    return int(v.bits.nbytes if isinstance(v, st.Bf16) else v.nbytes)


def _write_weights(d: Path, tensors: dict[str, Any], max_shard_bytes: int,
                   progress: Progress) -> tuple[list[str], dict | None]:
    """One ``model.safetensors``, or shards (sorted names, greedily filled) plus the index."""
    groups: list[list[str]] = [[]]
    size = 0
    for name in sorted(tensors):
        n = _nbytes(tensors[name])
        if groups[-1] and size + n > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += n
    metadata = {"format": "pt"}  # what transformers' loader expects to find
    if len(groups) == 1:
        st.write_file(d / HF_SINGLE, tensors, metadata)
        return [HF_SINGLE], None
    names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    progress.start("writing shards", total=len(groups))
    for file_name, group in zip(names, groups):
        st.write_file(d / file_name, {k: tensors[k] for k in group}, metadata)
        progress.advance()
    progress.done()
    index = {"metadata": {"total_size": sum(_nbytes(v) for v in tensors.values())},
             "weight_map": {k: f for f, g in zip(names, groups) for k in g}}
    (d / HF_INDEX).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return names, index


# ------------------------------------------------------------------------------------- the output dir
def _check_out(out: Path) -> None:
    """A new or empty dir: never mix an export into existing files, never overwrite one."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(message=f"{out} already exists and is not an empty directory", path=str(out),
                         hint="choose a new directory for the export (or remove the old one)")


def _publish(tmp: Path, out: Path) -> None:
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if out.exists():
        out.rmdir()  # empty (checked above)
    os.replace(tmp, out)
