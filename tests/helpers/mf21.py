"""MindSpore Transformers 2.1.0's own config classes, as a test oracle for what mftk writes for MF users.

The wheel is installed with ``pip install --no-deps mindformers==2.1.0``: its requirements pin mindspore
2.11 (mftk runs 2.10), and ``import mindformers`` pulls in most of its dependencies. Its config module
(`mindformers/pynative/config/config.py` + `utils.py`) needs none of that: it is loaded here on its own,
under a private name, with the one helper it imports from `mindformers.tools.check_rules` (a YAML depth
check, used only when loading from a file) stubbed for the duration of the import. Nothing of MF's code is
copied; None when the wheel is absent.
"""
from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

_PRIVATE = "_mftk_test_mf21_config"
_STUBBED = ("mindformers", "mindformers.tools", "mindformers.tools.check_rules")


def package_dir() -> Path | None:
    """The installed ``mindformers`` package folder (found, not imported), or None."""
    spec = importlib.util.find_spec("mindformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def shipped_configs_dir() -> Path | None:
    """The wheel's ``configs/`` folder (installed next to the package), or None."""
    root = package_dir()
    return root.parent / "configs" if root is not None and (root.parent / "configs").is_dir() else None


def mf_config_dir() -> Path | None:
    """``mindformers/pynative/config`` of the installed wheel, or None."""
    root = package_dir()
    path = root / "pynative" / "config" if root is not None else None
    return path if path is not None and (path / "config.py").is_file() else None


def train_config_class() -> Any | None:
    """MF 2.1.0's ``TrainConfig`` (``from_dict`` builds and validates a whole config), or None."""
    if f"{_PRIVATE}.config" in sys.modules:
        return sys.modules[f"{_PRIVATE}.config"].TrainConfig
    root = mf_config_dir()
    if root is None:
        return None
    saved = {name: sys.modules.get(name) for name in _STUBBED}
    try:
        for name in _STUBBED:
            sys.modules[name] = types.ModuleType(name)
        sys.modules["mindformers.tools.check_rules"].check_yaml_depth_before_loading = lambda *a, **k: None
        package = types.ModuleType(_PRIVATE)
        package.__path__ = [str(root)]
        sys.modules[_PRIVATE] = package
        for sub in ("utils", "config"):
            spec = importlib.util.spec_from_file_location(f"{_PRIVATE}.{sub}", root / f"{sub}.py")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return sys.modules[f"{_PRIVATE}.config"].TrainConfig


WHEEL_FAMILIES = ("qwen3", "qwen3_moe", "deepseek3")  # the wheel's config folders of mftk's families


def wheel_train_configs() -> list[Path]:
    """The wheel's static-graph train configs of mftk's families (predict configs are not training); [] without
    the wheel."""
    import yaml

    from mftk.config.static import is_static_config

    root = shipped_configs_dir()
    if root is None:
        return []
    found = []
    for family in WHEEL_FAMILIES:
        for path in sorted((root / family).glob("*.yaml")):
            if path.name.startswith(("pretrain_", "finetune_")) and is_static_config(yaml.safe_load(path.read_text())):
                found.append(path)
    return found
