"""Activation recompute applied to the built model, per layer, from the ``recompute`` / ``recompute_comm``
sections (reference `distributed/activation_checkpoint.py`; 2.1.0 forms, mindformers-2.1.md §1.7).

- ``mode: full`` + ``full_recompute_layer`` (``["0-3", 5]``; MTP layer i is id ``num_layers + i``): each listed
  transformer layer is checkpointed (`engine.checkpoint`) — only its inputs are kept, its forward is replayed
  in its backward;
- ``mode: select`` + ``select_module`` (module-path glob → layer ranges): in each listed layer, every sub-cell
  whose path inside the layer matches the glob (``self_attention``, ``mlp``, ``*core_attention``…) is
  checkpointed; ``full_recompute_layer`` is honoured in select mode too (those layers checkpointed whole);
- ``recompute_comm.enable`` + ``select_module``: the same selection over the cells that communicate (a
  tensor-parallel ``linear_qkv`` with its sequence all-gather, a context-parallel attention…), so their
  collectives run again in the backward instead of their outputs being kept;
- ``exclude_op`` (glob → layer ranges, the same form; only with ``mode`` full or select, as the reference): in
  each listed layer, the matching cells inside a checkpointed one keep their outputs and are not replayed
  (the reference's ``checkpoint_exclude_wrapper``).

Gradients are those of the run without recompute (the backward is the recorded one; the replay only
supplies the tensors it saved). Applied after TP/CP/EP cut the model and before FSDP wraps its units around
the layers, so the replay of a checkpointed cell inside a unit gathers the unit's weights again (`parallel.fsdp`).

Applied when several processes run, as the reference does (on one process every value is ignored; the
planner and validate-config say so).
"""
from __future__ import annotations

import fnmatch
from typing import Any

import attrs

from mftk.derive import parse_layer_range
from mftk.engine import checkpoint
from mftk.errors import ConfigError, Problem


@attrs.frozen
class Applied:
    """What `apply_recompute` installed: the checkpointed cells' paths and the excluded cells' paths."""

    checkpointed: list[str]
    excluded: list[str]


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


def _selections(recompute: Any, recompute_comm: Any) -> list[dict]:
    """The ``select_module`` dicts that apply: recompute's under ``select``, recompute_comm's when enabled."""
    out = []
    if str(getattr(recompute, "mode", "None")) == "select" and isinstance(recompute.select_module, dict):
        out.append(recompute.select_module)
    if recompute_comm is not None and recompute_comm.enable and isinstance(recompute_comm.select_module, dict):
        out.append(recompute_comm.select_module)
    return out


def apply_recompute(model: Any, recompute: Any, recompute_comm: Any = None) -> Applied:
    """Install the checkpoints and exclusions the sections ask for (their paths are logged at start-up)."""
    mode = str(getattr(recompute, "mode", "None"))
    layers = numbered_layers(model)
    done: list[str] = []
    if mode in ("full", "select"):
        for i in layer_ids(recompute.full_recompute_layer):
            path, layer = layers[i]
            if _trains(layer) and checkpoint.of(layer) is None:
                checkpoint.install(layer, path)
                done.append(path)
    for select in _selections(recompute, recompute_comm):
        for pattern, ranges in select.items():
            for i in layer_ids(ranges):
                path, layer = layers[i]
                if checkpoint.of(layer) is not None or not _trains(layer):  # checkpointed whole already
                    continue
                for sub, cell in _matching(layer, str(pattern)):
                    if not checkpoint.within(cell) and _trains(cell):
                        checkpoint.install(cell, f"{path}.{sub}")
                        done.append(f"{path}.{sub}")
    excluded = _exclude(layers, recompute) if done and mode in ("full", "select") else []  # as the reference
    return Applied(checkpointed=done, excluded=excluded)


def _exclude(layers: dict, recompute: Any) -> list[str]:
    """``exclude_op``: each matching cell inside a checkpointed cell of its layer keeps its outputs. A pattern
    that matches no such cell in a layer it lists would be a setting accepted and ignored: an error."""
    spec = recompute.exclude_op if isinstance(recompute.exclude_op, dict) else {}
    out: list[str] = []
    for pattern, ranges in spec.items():
        for i in layer_ids(ranges):
            path, layer = layers[i]
            found = [(sub, cell, owner) for sub, cell in _matching(layer, str(pattern))
                     if (owner := _owner(layer, sub)) is not None and checkpoint.of(cell) is None]
            if not found:
                raise ConfigError(message="recompute.exclude_op matches no cell inside a recomputed one",
                                  problems=[Problem(path=f"recompute.exclude_op.{pattern}", message=(
                                      f"layer {i} ({path}) has no cell matching {pattern!r} inside a cell that "
                                      "recompute replays"), hint="name a sub-cell of a recomputed layer or module, "
                                      "e.g. '*self_attention.linear_proj'")])
            for sub, cell, owner in found:
                checkpoint.exclude(cell, owner)
                out.append(f"{path}.{sub}")
    return out


def _owner(layer: Any, sub: str) -> checkpoint.Checkpoint | None:
    """The checkpoint of ``layer`` or of a cell on the path to ``layer.<sub>`` (not ``sub`` itself)."""
    if checkpoint.of(layer) is not None:
        return checkpoint.of(layer)
    cells = dict(layer.cells_and_names())
    parts = sub.split(".")
    for k in range(len(parts) - 1, 0, -1):
        ck = checkpoint.of(cells.get(".".join(parts[:k])))
        if ck is not None:
            return ck
    return None


def _trains(cell: Any) -> bool:
    return any(p.requires_grad for p in cell.get_parameters())


def _matching(layer: Any, pattern: str) -> list[tuple[str, Any]]:
    """Sub-cells of ``layer`` whose path inside it matches ``pattern`` (outermost first; not inside a match)."""
    out: list[tuple[str, Any]] = []
    for sub, cell in layer.cells_and_names():
        if not sub or any(sub.startswith(p + ".") for p, _ in out):
            continue
        if fnmatch.fnmatchcase(sub, pattern) or fnmatch.fnmatchcase(sub, pattern.lstrip("*.")):
            out.append((sub, cell))
    return out
