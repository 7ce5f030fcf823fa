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
    """The full YAML with defaults filled in; lines that come from defaults end in '# default', fields that
    are not (fully) implemented say so (`config.status`), and unset (null) fields are commented out, so the
    text loads in MindSpore Transformers 2.1.0's own `TrainConfig` as well as in mftk."""
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
            head = len(lines)
            lines.append(f"{pad}{f.name}:" + ("" if given else "  # default"))
            _emit(value, sub_raw, indent + 1, lines, f"{prefix}{f.name}.")
            if all(line.lstrip().startswith("#") for line in lines[head + 1:]):  # every field unset: a mapping
                lines[head] = f"{pad}{f.name}: {{}}" + ("" if given else "  # default")
            continue
        text = yaml.safe_dump(resolved(value), default_flow_style=True, width=10_000).strip()
        if text.endswith("\n..."):
            text = text[: -len("\n...")]
        text = text.removesuffix("...").strip()
        comment = "" if given else "  # default"
        status = status_comment(f"{prefix}{f.name}")
        if status:
            comment += f"  # {status}"
        # an unset (null) value is shown commented out: MindSpore Transformers 2.1.0's loader refuses null for
        # fields typed `str`/`int` (config/utils.py `check_type`: "Field 'ContextConfig.device_target' cannot be
        # None"), and leaving the key out gives the same unset value in mftk and the reference's default in MF
        lead = "# " if value is None else ""
        lines.append(f"{pad}{lead}{f.name}: {text}{comment}")
