"""Activation recompute applied to the built model, per layer, from the ``recompute`` / ``recompute_comm``
sections (reference `distributed/activation_checkpoint.py`; 2.1.0 forms, mindformers-2.1.md §1.7).

- ``mode: full`` + ``full_recompute_layer`` (``["0-3", 5]``; MTP layer i is id ``num_layers + i``): each listed
  transformer layer becomes a `units.ReplayedUnit` — only its input is kept, its forward is replayed in its
  backward;
- ``mode: select`` + ``select_module`` (module-path glob → layer ranges): in each listed layer, every sub-cell
  whose path inside the layer matches the glob (``self_attention``, ``mlp``, ``*core_attention``…) is replayed;
  ``full_recompute_layer`` is honoured in select mode too (those layers replayed whole);
- ``recompute_comm.enable`` + ``select_module``: the same selection over the cells that communicate (a
  tensor-parallel ``linear_qkv`` with its sequence all-gather, a context-parallel attention…), so their
  collectives run again in the backward instead of their outputs being kept.

Gradients are those of the run without recompute (the replay sees the very inputs, weights and buffers).
Under FSDP (`parallel.fsdp`) a layer is one unit whose weights are gathered: the layers recompute selects
(`replayed_layers`: the full ones, and under ``select`` / ``recompute_comm`` every layer with a selected
cell) become replaying FSDP units, replayed whole; the others keep their activations. ``exclude_op`` (outputs kept,
not replayed) is refused by `config.runnable` while recompute is on: a replay that skips a cell inside a
unit is not built.

Applied when several processes run, as the reference does (on one process every value is ignored; the
planner and validate-config say so).
"""
from __future__ import annotations

import fnmatch
from typing import Any

from mftk.derive import parse_layer_range
from mftk.engine import units


def layer_ids(ranges: Any) -> list[int]:
    """``["0-3", 5]`` → ``[0, 1, 2, 3, 5]`` (validated by the config rules)."""
    out: list[int] = []
    for entry in ranges or ():
        out += parse_layer_range(entry) or []
    return out


def numbered_layers(model: Any) -> dict[int, tuple[str, Any]]:
    """Layer id → (path, transformer layer): decoder layers 0..L−1, then MTP layers L+i (the reference's ids)."""
    out = {i: (f"decoder.layers.{i}", layer) for i, layer in enumerate(model.decoder.layers)}
    n = len(out)
    for i, mtp in enumerate(model.mtp.layers if model.mtp is not None else []):
        out[n + i] = (f"mtp.layers.{i}.transformer_layer", mtp.transformer_layer)
    return out


def replayed_layers(model: Any, recompute: Any, recompute_comm: Any = None) -> frozenset[str]:
    """Paths of the layers recompute replays in part or whole: under FSDP each of them is replayed whole
    (a replay inside a unit whose weights are gathered for the unit is not built)."""
    mode = str(getattr(recompute, "mode", "None"))
    layers = numbered_layers(model)
    ids = set(layer_ids(recompute.full_recompute_layer)) if mode in ("full", "select") else set()
    for select in _selections(recompute, recompute_comm):
        for ranges in select.values():
            ids.update(layer_ids(ranges))
    return frozenset(layers[i][0] for i in ids if i in layers)


def _selections(recompute: Any, recompute_comm: Any) -> list[dict]:
    """The ``select_module`` dicts that apply: recompute's under ``select``, recompute_comm's when enabled."""
    out = []
    if str(getattr(recompute, "mode", "None")) == "select" and isinstance(recompute.select_module, dict):
        out.append(recompute.select_module)
    if recompute_comm is not None and recompute_comm.enable and isinstance(recompute_comm.select_module, dict):
        out.append(recompute_comm.select_module)
    return out


def apply_recompute(model: Any, recompute: Any, recompute_comm: Any = None) -> list[str]:
    """Install the replayed units the sections ask for; returns their paths (logged at start-up)."""
    mode = str(getattr(recompute, "mode", "None"))
    layers = numbered_layers(model)
    cells = units.owners(model)
    done: list[str] = []
    if mode in ("full", "select"):
        for i in layer_ids(recompute.full_recompute_layer):
            path, layer = layers[i]
            if _trains(layer) and units.unit_of(layer) is None:
                units.install(layer, "layer", units.renew(cells, _params(layer)), name=path)
            if units.unit_of(layer) is not None:  # installed here, or an FSDP unit that replays (`replayed_layers`)
                done.append(path)
    for select in _selections(recompute, recompute_comm):
        for pattern, ranges in select.items():
            for i in layer_ids(ranges):
                path, layer = layers[i]
                if units.unit_of(layer) is not None or not _trains(layer):  # replayed whole already
                    continue
                for sub, cell in _matching(layer, str(pattern)):
                    if units.unit_of(cell) is None and _params(cell):
                        units.install(cell, "cell", units.renew(cells, _params(cell)), name=f"{path}.{sub}")
                        done.append(f"{path}.{sub}")
    return done


def _trains(cell: Any) -> bool:
    return any(p.requires_grad for p in cell.get_parameters())


def _params(cell: Any) -> list:
    return [p for p in cell.get_parameters() if p.requires_grad]


def _matching(layer: Any, pattern: str) -> list[tuple[str, Any]]:
    """Sub-cells of ``layer`` whose path inside it matches ``pattern`` (outermost first; not inside a match)."""
    out: list[tuple[str, Any]] = []
    for sub, cell in layer.cells_and_names():
        if not sub or any(sub.startswith(p + ".") for p, _ in out):
            continue
        if fnmatch.fnmatchcase(sub, pattern) or fnmatch.fnmatchcase(sub, pattern.lstrip("*.")):
            out.append((sub, cell))
    return out
