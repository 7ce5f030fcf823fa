"""The resolved config: plain data with defaults filled in, and the YAML `validate-config --print-resolved`
prints, which marks the values that came from defaults (from the field metadata)."""
from __future__ import annotations

from typing import Any

import attrs
import yaml

from mftk.config.load import LoadedConfig


# ---------------------------------------------------------------------------- resolved YAML

def resolved(config: Any) -> Any:
    """Plain data of the whole config, defaults filled in."""
    if attrs.has(type(config)):
        return {f.name: resolved(getattr(config, f.name)) for f in attrs.fields(type(config))}
    if isinstance(config, list):
        return [resolved(v) for v in config]
    return config


def resolved_yaml(loaded: LoadedConfig) -> str:
    """The full YAML with defaults filled in; lines that come from defaults end in '# default', and fields
    that are not (fully) implemented say so (`config.status`)."""
    lines: list[str] = []
    _emit(loaded.config, loaded.raw, 0, lines, "")
    return "\n".join(lines) + "\n"


def _emit(obj: Any, raw: Any, indent: int, lines: list[str], prefix: str) -> None:
    from mftk.config.status import status_comment

    pad = "  " * indent
    for f in attrs.fields(type(obj)):
        value = getattr(obj, f.name)
        given = isinstance(raw, dict) and f.name in raw
        sub_raw = raw.get(f.name) if isinstance(raw, dict) else None
        if attrs.has(type(value)):
            lines.append(f"{pad}{f.name}:" + ("" if given else "  # default"))
            _emit(value, sub_raw, indent + 1, lines, f"{prefix}{f.name}.")
            continue
        text = yaml.safe_dump(resolved(value), default_flow_style=True, width=10_000).strip()
        if text.endswith("\n..."):
            text = text[: -len("\n...")]
        text = text.removesuffix("...").strip()
        comment = "" if given else "  # default"
        status = status_comment(f"{prefix}{f.name}")
        if status:
            comment += f"  # {status}"
        lines.append(f"{pad}{f.name}: {text}{comment}")
