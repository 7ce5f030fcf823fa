"""Static-graph (GRAPH_MODE) YAML → PyNative YAML, key by key per MindSpore Transformers 2.1 §7.

2.1.0 ships no such converter; the tables of §7 are the contract. Every key of the static file
ends up in one of two lists: mapped (static path → PyNative path) or not converted (with the
reason). Values that have no key of their own are derived the way the static trainer derives
them: ``training.global_batch_size`` from the batch size, data parallel, micro-batch count and
interleave (§7.2), ``training.steps`` from the epochs and ``sizes[0]``, and the per-stage layer
lists from the static ``offset``. Nothing here decides whether mftk can train the result: that
is `validate-config`'s job, run on the converted data.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import attrs
import yaml

from mftk.config.static import is_static_config
from mftk.config.static_map import map_static
from mftk.errors import ConfigError, InputError, Problem


class _PlainDumper(yaml.SafeDumper):
    """Safe dumping without anchors: a value shared in memory is written out each time."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


@attrs.frozen
class Conversion:
    """A converted config: the PyNative data, what went where, and what could not be converted."""

    source: str
    config: dict[str, Any]
    mapped: list[tuple[str, str]]  # (static path, PyNative path or derivation)
    unmapped: list[tuple[str, str]]  # (static path, reason)
    world_size: int  # dp·tp·pp·cp of the static layout: validate the result with it

    def header(self) -> str:
        """The comment block the written YAML starts with."""
        lines = [f"# Converted by `mftk convert-config` from {Path(self.source).name} (a static-graph config).",
                 f"# Its layout needs {self.world_size} processes: mftk validate-config THIS.yaml --world-size "
                 f"{self.world_size}"]
        if self.unmapped:
            lines.append("# Not converted (no PyNative equivalent):")
            lines += [f"#   {path}: {why}" for path, why in self.unmapped]
        return "\n".join(lines) + "\n"

    def to_yaml(self) -> str:
        return self.header() + yaml.dump(self.config, Dumper=_PlainDumper, sort_keys=False,
                                         default_flow_style=False, width=100)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "world_size": self.world_size, "config": self.config,
                "mapped": [{"from": a, "to": b} for a, b in self.mapped],
                "unmapped": [{"key": a, "reason": b} for a, b in self.unmapped]}


def convert_file(path: str | Path) -> Conversion:
    """Read a static-graph YAML and convert it; a file that is not static is a ConfigError."""
    from mftk.config.yamlio import parse_yaml, read_config_file

    source = str(path)
    data, _ = parse_yaml(read_config_file(path), source)
    if not is_static_config(data):
        raise ConfigError(message=f"{source} is not a static-graph config (no model.model_config, parallel_config, "
                          "runner_config ...): nothing to convert", source=source,
                          hint=f"check it directly: mftk validate-config {source}")
    return convert_static(data, source=source)


def write_conversion(conv: Conversion, out: str | Path, *, force: bool = False) -> Path:
    """Write atomically (a temp file renamed into place); never overwrite without ``force``."""
    from mftk.files import write_atomic

    out = Path(out)
    if out.exists() and not force:
        raise InputError(message=f"{out} already exists", path=str(out), hint="choose another -o path, or add --force")
    if out.is_dir():
        raise InputError(message=f"{out} is a directory", path=str(out), hint="give the path of the YAML file to write")
    write_atomic(out, conv.to_yaml())
    return out


def check_conversion(conv: Conversion) -> list[Problem]:
    """validate-config's verdict on the converted data at its own world size (files not checked)."""
    from mftk.config.load import load_data

    try:
        return load_data(copy.deepcopy(conv.config), source="converted", world_size=conv.world_size,
                         check_files=False).notes
    except ConfigError as exc:
        return exc.problems or [Problem(path="", message=exc.message)]


def convert_static(raw: dict, *, source: str = "<config>") -> Conversion:
    """The PyNative config for static-graph data ``raw`` (not modified)."""
    config, mapped, unmapped, world = map_static(raw)
    return Conversion(source=source, config=config, mapped=mapped, unmapped=unmapped, world_size=world)
