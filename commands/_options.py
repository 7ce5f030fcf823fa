"""Reusable `Annotated` aliases so every command spells shared options the same way."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from commands._argspec import JSON_HELP

ConfigArg = Annotated[Path, typer.Argument(help="Training YAML (MindSpore Transformers PyNative format).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help=JSON_HELP)]
SetOpt = Annotated[
    Optional[list[str]],
    typer.Option("--set", metavar="KEY=VALUE",
                 help="Override a config value: --set training.steps=20 (repeatable; typed by the config model)."),
]
OutputDirOpt = Annotated[Optional[Path], typer.Option("--output-dir", help="Where logs and outputs go (default: ./output).")]
NoCheckFilesOpt = Annotated[bool, typer.Option("--no-check-files", help="Do not check that data files exist.")]
WorldSizeOpt = Annotated[Optional[int], typer.Option("--world-size", min=1, help="Number of devices/workers to check against.")]
NprocOpt = Annotated[int, typer.Option("--nproc", min=1, help="Local worker processes (1 runs in-process; >1 launches msrun).")]

DeviceOpt = Annotated[Optional[str], typer.Option(
    "--device", help="CPU, GPU or Ascend: overrides context.device_target (default: the YAML's, else the device "
    "MindSpore finds).")]


def with_device(overrides: Optional[list[str]], device: Optional[str]) -> Optional[list[str]]:
    """``--device X`` as the last ``--set context.device_target=X`` (it wins over the YAML and earlier --set)."""
    return overrides if device is None else [*(overrides or []), f"context.device_target={device}"]
