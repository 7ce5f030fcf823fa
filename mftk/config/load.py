"""YAML file -> frozen `Config`, or one `ConfigError` listing every problem.

Four steps: (1) safe-load the YAML keeping line numbers; (2) walk it against the schema
(unknown keys with "did you mean", YAML-1.1 float strings, empty sections) and structure it
with the strict converter; (3) run the cross-field rules; (4) raise once if anything failed.
Warnings and notes never stop a load: they come back in `LoadedConfig.notes`.
"""
from __future__ import annotations

import copy
import difflib
import os
import types
import typing
from typing import Any, Iterable, Union

import attrs

from mftk.config import sections as S
from mftk.config.compat import normalize_raw
from mftk.config.converter import structure
from mftk.config.numbers import number_problems
from mftk.config.paths import expand_config_paths, resolve_data_paths
from mftk.config.static import STATIC_TOP_LEVEL, is_static_config, static_config_message, static_markers
from mftk.config.yamlio import LineMap, parse_value, parse_yaml, read_config_file
from mftk.errors import ConfigError, InputError, Problem


@attrs.frozen
class LoadedConfig:
    """A valid config plus what the loader noticed on the way (warnings, notes)."""

    config: S.Config
    notes: list[Problem]
    source: str
    raw: dict


def load_config(path: str | os.PathLike, *, overrides: Iterable[str] = (), world_size: int = 1,
                check_files: bool = True) -> LoadedConfig:
    """Load and fully check a training YAML; raises ConfigError with every problem found."""
    source = str(path)
    text = read_config_file(path)
    data, lines = parse_yaml(text, source)
    return load_data(data, lines=lines, source=source, overrides=overrides, world_size=world_size,
                     check_files=check_files, base_dir=os.path.dirname(os.path.abspath(path)))


def load_data(data: Any, *, lines: LineMap | None = None, source: str = "<config>",
              overrides: Iterable[str] = (), world_size: int = 1, check_files: bool = True,
              base_dir: str | None = None, engine_support: bool = True,
              applied: Iterable[str] = ()) -> LoadedConfig:
    """Check a parsed YAML; ``base_dir`` (the YAML's directory) is where relative data paths are looked
    for when they are not in the working directory (`config.paths`); ``engine_support=False`` (plans for an
    accelerator cluster) turns "not implemented by mftk's engine" errors into warnings. ``applied`` are
    ``--set`` items the caller already applied to ``data`` (problems are still attributed to them)."""
    lines = lines or LineMap()
    if not isinstance(data, dict):
        raise ConfigError(message=f"{source}: the top level must be a mapping of sections, got {type(data).__name__}",
                          source=source, problems=[Problem(path="", message=f"expected a mapping, got {type(data).__name__}",
                                                           hint="a config starts with 'training:', 'model:', ... sections")])
    if is_static_config(data):
        raise ConfigError(message=static_config_message(source, static_markers(data)), source=source)
    overrides = list(overrides)
    set_keys = {item: parse_override(item)[0] for item in [*applied, *overrides]}  # malformed: a usage error
    raw = copy.deepcopy(data)
    problems: list[Problem] = []
    for item in overrides:
        problems += apply_override(raw, item)
    problems += normalize_raw(raw, lines)
    problems += expand_config_paths(raw)
    problems += resolve_data_paths(raw, base_dir)
    config, found = build_config(raw, lines)
    problems += found
    _refuse_unknown_overrides(problems, set_keys)
    if config is not None:
        numbers = number_problems(config, _model_key(raw.get("model")))
        problems += numbers
        if not numbers:  # the rules do arithmetic with these numbers: NaN or 10**30 would break it
            from mftk.config.rules import check

            problems += check(config, world_size=world_size, check_files=check_files,
                              reported=frozenset(p.path for p in problems if p.severity == "error"))
    locate(problems, lines, set_keys)
    if not engine_support:
        from mftk.config.support import demote_for_plan

        problems = demote_for_plan(problems)
    errors = [p for p in problems if p.severity == "error"]
    if errors or config is None:
        raise ConfigError(message=f"{len(errors)} problem(s) in {source}", source=source, problems=problems)
    from mftk.config.mutant import forget_from_env

    return LoadedConfig(config=forget_from_env(config), notes=problems, source=source, raw=raw)


def _model_key(model_raw: Any) -> Any:
    """Field name -> the key the YAML's model: section spelt it with (an alias such as num_layers)."""
    from mftk.config.model import yaml_key_for

    return (lambda name: yaml_key_for(model_raw, name)) if isinstance(model_raw, dict) else None


def build_config(raw: dict, lines: LineMap | None = None) -> tuple[S.Config | None, list[Problem]]:
    """Schema walk + structuring (steps 2 of the load); no cross-field rules."""
    problems: list[Problem] = []
    model_raw = raw.pop("model", None)
    cleaned = _walk(raw, S.Config, "", problems)
    config, found = structure(cleaned, S.Config)
    problems += found
    model, found = build_model_section(model_raw)
    problems += found
    raw["model"] = model_raw
    if config is None:
        return None, problems
    # With a broken model section the other sections are still checked (model-specific rules skip).
    return attrs.evolve(config, model=model), problems


def build_model_section(model_raw: Any) -> tuple[Any, list[Problem]]:
    from mftk.config.model import model_configs, normalize_model_dict, yaml_key_for

    configs = model_configs()
    if model_raw is None:
        return None, [Problem(path="model", message="the model section is missing",
                              hint="add model: {model_type: qwen3, architectures: Qwen3ForCausalLM, ...}")]
    if not isinstance(model_raw, dict):
        return None, [Problem(path="model", message=f"expected a mapping, got {type(model_raw).__name__}")]
    model_type = model_raw.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        return None, [Problem(path="model.model_type", value=model_type,
                              message=f"expected a string, got {type(model_type).__name__} {model_type!r:.40}",
                              hint=f"one of: {', '.join(sorted(configs))}")]
    if model_type is None:
        return None, [Problem(path="model.model_type", message="required key is missing",
                              hint=f"one of: {', '.join(sorted(configs))}")]
    if model_type not in configs:
        close = _did_you_mean(str(model_type), configs, cutoff=0.8)  # qwen3_moe is not a typo of qwen3
        return None, [Problem(path="model.model_type", value=model_type,
                              message=f"{model_type!r} is not a model family mftk trains "
                                      f"({', '.join(sorted(configs))})" + (f": {close}" if close else ""),
                              hint="" if close else "train this family with MindSpore Transformers")]
    cleaned, problems = normalize_model_dict(dict(model_raw))
    model, found = structure(cleaned, configs[model_type], root="model")
    for p in found:
        # Report on the key the user typed (an alias such as num_layers), so the line number matches.
        name = p.path.removeprefix("model.").split(".")[0].split("[")[0]
        p.path = f"model.{yaml_key_for(model_raw, name)}" + p.path.removeprefix("model.")[len(name):]
    return model, problems + found


# ---------------------------------------------------------------------------- schema walk

def _unwrap(tp: Any) -> Any:
    """Optional[X] -> X; other types unchanged."""
    if typing.get_origin(tp) in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in attrs.fields(cls)}


def _walk(data: Any, cls: type, path: str, problems: list[Problem]) -> Any:
    """Check keys of `data` against `cls`; return data with tolerated extras dropped."""
    if not isinstance(data, dict):
        return data  # the converter reports the type error with its path
    types_ = _field_types(cls)
    allow_extra = getattr(cls, "__mftk_allow_extra__", False)
    out: dict[str, Any] = {}
    for key, value in data.items():
        child = f"{path}.{key}" if path else str(key)
        if key not in types_:
            _unknown_key(cls, key, child, allow_extra, types_, problems)
            continue
        out[key] = _walk_value(value, types_[key], child, problems)
    return out


def _walk_value(value: Any, tp: Any, path: str, problems: list[Problem]) -> Any:
    inner = _unwrap(tp)
    if attrs.has(inner):
        if value is None and inner is not tp:
            return None
        if value is None:
            problems.append(Problem(path=path, severity="note",
                                    message="section is empty; its defaults are used",
                                    hint="the reference rejects an empty section; remove it or fill it in"))
            return {}
        return _walk(value, inner, path, problems)
    if typing.get_origin(inner) is list and isinstance(value, list):
        (arg,) = typing.get_args(inner) or (Any,)
        return [_walk_value(v, arg, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if _accepts_float(inner) and isinstance(value, str):
        number = _yaml11_float(value)
        if number is not None:
            problems.append(Problem(path=path, severity="note", value=value,
                                    message=f"string {value!r} read as the number {number!r}",
                                    hint="YAML 1.1 reads '1e-5' as a string; write 1.0e-5 to be explicit"))
            return number
    return value


def _accepts_float(tp: Any) -> bool:
    return tp is float or (typing.get_origin(tp) in (Union, types.UnionType) and float in typing.get_args(tp))


def _yaml11_float(text: str) -> float | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return number if text.strip().lower() not in {"nan", "inf", "-inf", "+inf", "infinity"} else None


def _unknown_key(cls: type, key: Any, path: str, allow_extra: bool, known: dict, problems: list[Problem]) -> None:
    if cls is S.Config:
        problems.append(_unknown_top_level(key, path, known))
        return
    hint = _did_you_mean(str(key), known)
    if allow_extra:
        problems.append(Problem(path=path, severity="warning", message="unknown key, ignored",
                                hint=hint or "check the spelling against the config reference"))
    else:
        problems.append(Problem(path=path, message="unknown key", hint=hint or f"known keys: {', '.join(sorted(known))}"))


def _unknown_top_level(key: Any, path: str, known: dict) -> Problem:
    """MindSpore Transformers accepts and ignores unknown top-level keys (2.1 §1.1); so does mftk, saying so.

    Exception: a near-certain misspelling of a section (``trainingg``) is an error, since every
    setting under it would be silently ignored."""
    name = str(key)
    if key in S.KNOWN_EXTRA_TOP_LEVEL:
        return Problem(path=path, severity="warning", message=f"accepted but has no effect ({S.KNOWN_EXTRA_TOP_LEVEL[key]})")
    if key in STATIC_TOP_LEVEL:
        return Problem(path=path, severity="warning",
                       message="a static-graph key; ignored (MindSpore Transformers ignores it in PyNative too)",
                       hint=f"PyNative setting: {STATIC_TOP_LEVEL[key]}")
    typo = difflib.get_close_matches(name, list(known), n=1, cutoff=TYPO_CUTOFF)
    if typo:
        return Problem(path=path, message="unknown section",
                       hint=f"did you mean '{typo[0]}'? As written, every setting under it would be ignored")
    return Problem(path=path, severity="warning", message="unknown top-level key; ignored (MindSpore Transformers "
                   "accepts and ignores it too)", hint=_did_you_mean(name, known) or "remove it if it is a mistake")


TYPO_CUTOFF = 0.85  # difflib ratio above which an unknown top-level key is taken for a misspelt section


def _did_you_mean(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=cutoff)
    return f"did you mean '{close[0]}'?" if close else ""


# ---------------------------------------------------------------------------- overrides

def parse_override(item: str) -> tuple[str, str]:
    """``a.b.c=value`` -> (``a.b.c``, ``value``); anything else is a usage error (`InputError`, exit 2)."""
    if "=" not in item:
        raise InputError(message=f"--set {item}: expected KEY=VALUE",
                         hint=f"e.g. --set {item.strip() or 'training.steps'}=20")
    dotted, text = item.split("=", 1)
    dotted = dotted.strip()
    if not dotted or not all(dotted.split(".")):
        raise InputError(message=f"--set {item}: empty key in the dotted path {dotted!r}",
                         hint="name the YAML key by its dotted path, e.g. --set training.steps=20")
    return dotted, text


# Messages of the problems that say a key names no setting (the schema walk's and the model normaliser's).
UNKNOWN_KEY_MESSAGES = ("unknown key", "unknown section", "unknown top-level key", "unknown model key")


def _refuse_unknown_overrides(problems: list[Problem], set_keys: dict[str, str]) -> None:
    """A ``--set`` that names no setting is a usage error (exit 2), never a warning: the run would use the
    YAML's value while the user believes the override took effect."""
    for item, key in set_keys.items():
        for p in problems:
            if p.message.startswith(UNKNOWN_KEY_MESSAGES) and p.path and (key == p.path
                                                                            or key.startswith(p.path + ".")):
                raise InputError(message=f"--set {item}: {p.path!r} names no setting, so the override would be "
                                         "ignored", hint=p.hint or "check the key against the config reference")


def locate(problems: list[Problem], lines: LineMap, set_keys: dict[str, str]) -> None:
    """Give each problem its YAML line, or say which ``--set`` item supplied the value (``set_keys``: item ->
    dotted key, as `parse_override` splits it)."""
    for p in problems:
        item = _set_by(p.path, set_keys)
        if item is not None:  # the value came from --set, not from the YAML line it replaced
            p.line = None
            p.message += f" (from --set {item})"
        elif p.line is None and p.path:
            p.line = lines.line(p.path)


def _set_by(path: str, set_keys: dict[str, str]) -> str | None:
    """The ``--set`` item that supplied the value at ``path`` (or a section above it), if any."""
    for item, key in set_keys.items():
        if path == key or path.startswith((key + ".", key + "[")):
            return item
    return None


def apply_override(raw: dict, item: str) -> list[Problem]:
    """Apply one `a.b.c=value` override to the raw YAML data (value parsed as YAML)."""
    dotted, text = parse_override(item)
    keys = dotted.split(".")
    if _is_str_field(keys):
        value: Any = text
    else:
        try:
            value = parse_value(text, f"--set {dotted}") if text.strip() else ""
        except ConfigError as exc:
            return [Problem(path=dotted, message=f"the value of --set {dotted}: {exc.problems[0].message}",
                            hint=exc.problems[0].hint)]
    node = raw
    for depth, key in enumerate(keys[:-1]):
        if node.get(key) is None:
            node[key] = {}
        elif not isinstance(node[key], dict):
            where = ".".join(keys[:depth + 1])
            return [Problem(path=where, message=f"is {_kind(node[key])}, not a section, so --set {dotted} cannot "
                                                "set a key inside it",
                            hint=f"give {where} a mapping first, or drop the --set that replaced it")]
        node = node[key]
    if isinstance(value, dict) and isinstance(node.get(keys[-1]), dict):
        _merge(node[keys[-1]], value)  # --set 'training={steps: 5}' keeps the section's other keys
    else:
        node[keys[-1]] = value
    return []


def _merge(into: dict, update: dict) -> None:
    """Deep-merge ``update`` into ``into``: a mapping value changes the keys it names and no others."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list"}
    return f"{names.get(type(value), type(value).__name__)} ({value!r:.40})"


def _is_str_field(keys: list[str]) -> bool:
    cls: Any = S.Config
    for key in keys:
        if not attrs.has(cls):
            return False
        types_ = _field_types(cls)
        if key not in types_:
            return False
        cls = _unwrap(types_[key])
    return cls is str


