"""Activation recompute applied to the built model, per layer, from the ``recompute`` / ``recompute_comm``
sections (reference `distributed/activation_checkpoint.py`; 2.1.0 forms, mindformers-2.1.md §1.7).

- ``mode: full`` + ``full_recompute_layer`` (``["0-3", 5]``; MTP layer i is id ``num_layers + i``): each listed
  transformer layer becomes a `unit_replay.ReplayedUnit` — only its input is kept, its forward is replayed in its
  backward;
- ``mode: select`` + ``select_module`` (module-path glob → layer ranges): in each listed layer, every sub-cell
  whose path inside the layer matches the glob (``self_attention``, ``mlp``, ``*core_attention``…) is replayed;
  ``full_recompute_layer`` is honoured in select mode too (those layers replayed whole);
- ``recompute_comm.enable`` + ``select_module``: the same selection over the cells that communicate (a
  tensor-parallel ``linear_qkv`` with its sequence all-gather, a context-parallel attention…), so their
  collectives run again in the backward instead of their outputs being kept;
- ``exclude_op`` (glob → layer ranges, the same form; only with ``mode`` full or select, as the reference): in
  each listed layer, the matching cells inside a recomputed one keep their outputs and are not replayed (the
  reference's ``checkpoint_exclude_wrapper``).

Two mechanisms, one per layer. A recomputed layer without exclusions: `unit_replay.ReplayedUnit` (a custom-``bprop``
cell that keeps nothing but its inputs — the lowest memory). A recomputed layer that ``exclude_op`` lists: its
recomputed cells (the layer, or its selected cells) are checkpointed over saved-tensor hooks
(`engine.activation_checkpoint`, `apply_exclusions`), so that the excluded cells inside them keep their outputs and their
own saved tensors (a custom ``bprop`` cannot keep them: a nested ``ms.vjp`` in its forward is refused by
MindSpore 2.10); such a layer keeps more than a replayed unit does (the hooks' handles, what the excluded cells
save).

Gradients are those of the run without recompute (the replay sees the very inputs, weights and buffers).
Under FSDP (`parallel.fsdp`) a layer is one unit whose weights are gathered: the layers recompute selects
without exclusions (`replayed_layers`: the full ones, and under ``select`` / ``recompute_comm`` every layer with
a selected cell) become replaying FSDP units, replayed whole; a layer with exclusions is a unit that keeps its
activations, with its checkpoints (installed before FSDP wraps it, `apply_exclusions`) inside it, whose replays
gather the unit's weights again (`FsdpHooks.regathered`); the other layers keep their activations.

Applied when several processes run, as the reference does (on one process every value is ignored; the
planner and validate-config say so).
"""
from __future__ import annotations

import fnmatch
from typing import Any

from mftk.derive import parse_layer_range
from mftk.engine import activation_checkpoint, unit_replay
from mftk.errors import ConfigError, Problem


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
    """Paths of the layers recompute replays in part or whole, but for those ``exclude_op`` lists
    (`excluding_layers`): under FSDP each of them is replayed whole (a replay inside a unit whose weights are
    gathered for the unit is not built)."""
    return _recomputed_layers(model, recompute, recompute_comm) - excluding_layers(model, recompute, recompute_comm)


def _recomputed_layers(model: Any, recompute: Any, recompute_comm: Any) -> frozenset[str]:
    mode = str(getattr(recompute, "mode", "None"))
    layers = numbered_layers(model)
    ids = set(layer_ids(recompute.full_recompute_layer)) if mode in ("full", "select") else set()
    for select in _selections(recompute, recompute_comm):
        for ranges in select.values():
            ids.update(layer_ids(ranges))
    return frozenset(layers[i][0] for i in ids if i in layers)


def _exclusions(recompute: Any) -> dict:
    """``exclude_op`` where it applies: a mapping, with ``mode`` full or select (the reference ignores it else)."""
    mode = str(getattr(recompute, "mode", "None"))
    spec = getattr(recompute, "exclude_op", None)
    return spec if mode in ("full", "select") and isinstance(spec, dict) else {}


def excluding_layers(model: Any, recompute: Any, recompute_comm: Any = None) -> frozenset[str]:
    """Paths of the recomputed layers ``exclude_op`` lists: checkpointed over saved-tensor hooks
    (`apply_exclusions`), not replayed units."""
    layers = numbered_layers(model)
    ids = {i for ranges in _exclusions(recompute).values() for i in layer_ids(ranges) if i in layers}
    return frozenset(layers[i][0] for i in ids) & _recomputed_layers(model, recompute, recompute_comm)


def apply_exclusions(model: Any, recompute: Any, recompute_comm: Any = None) -> list[str]:
    """The layers ``exclude_op`` lists (`excluding_layers`): their recomputed cells checkpointed
    (`engine.activation_checkpoint`; the whole layer when ``full_recompute_layer`` lists it, else each of its selected
    cells) and the matching cells inside them excluded (outputs kept, not replayed). Run before FSDP wraps the
    layers (`parallelize`), so that the checkpoints' hooks sit inside the units' gathers; a layer already
    checkpointed, or not trained here (another pipeline stage's), is left as it is. Returns the excluded cells'
    paths. A pattern that matches no cell inside a recomputed one of a layer it lists would be a setting
    accepted and ignored: `ConfigError` (decided from the cell tree alone, so on every rank alike)."""
    spec = _exclusions(recompute)
    if not spec:
        return []
    layers = numbered_layers(model)
    targets: dict[int, list[str]] = {}  # layer id -> the excluded cells' paths inside it
    for pattern, ranges in spec.items():
        for i in layer_ids(ranges):
            if i not in layers:
                continue
            path, layer = layers[i]
            owners = _recomputed_cells(layer, i, recompute, recompute_comm)
            found = [sub for sub, _ in _matching(layer, str(pattern))
                     if any(o == "" or sub.startswith(o + ".") for o in owners)]
            if not found:
                raise ConfigError(message="recompute.exclude_op matches no cell inside a recomputed one", problems=[
                    Problem(path=f"recompute.exclude_op.{pattern}", message=(
                        f"layer {i} ({path}) has no cell matching {pattern!r} inside a cell that recompute replays"),
                        hint="name a sub-cell of a recomputed layer or module, e.g. '*self_attention.linear_proj'")])
            targets.setdefault(i, []).extend(sub for sub in found if sub not in targets.get(i, []))
    out: list[str] = []
    for i in sorted(targets):
        path, layer = layers[i]
        if activation_checkpoint.within(layer) or not _trains(layer):
            continue
        cells = dict(layer.cells_and_names())
        owners = _recomputed_cells(layer, i, recompute, recompute_comm)
        for owner in owners:
            activation_checkpoint.install(cells[owner], f"{path}.{owner}" if owner else path)
        for sub in targets[i]:
            if any(sub.startswith(t + ".") for t in targets[i]):
                continue  # inside another excluded cell: kept with it
            owner = next(o for o in owners if o == "" or sub.startswith(o + "."))
            activation_checkpoint.exclude(cells[sub], activation_checkpoint.of(cells[owner]))
            out.append(f"{path}.{sub}")
    return out


def _recomputed_cells(layer: Any, i: int, recompute: Any, recompute_comm: Any) -> list[str]:
    """Paths inside layer ``i`` of the cells recompute replays (``""``: the whole layer), outermost only; a
    selected cell without parameters is not replayed (as `apply_recompute`)."""
    if i in layer_ids(recompute.full_recompute_layer):
        return [""]
    out: list[str] = []
    for select in _selections(recompute, recompute_comm):
        for pattern, ranges in select.items():
            if i in layer_ids(ranges):
                out += [sub for sub, cell in _matching(layer, str(pattern))
                        if sub not in out and any(True for _ in cell.get_parameters())]
    return [sub for sub in out if not any(sub.startswith(o + ".") for o in out)]


def excluded_cells(model: Any) -> list[str]:
    """Paths of the cells ``exclude_op`` excluded (`apply_exclusions`), in layer order."""
    return [f"{path}.{sub}" for _, (path, layer) in sorted(numbered_layers(model).items())
            for sub, cell in layer.cells_and_names() if sub and "_excluded_from" in getattr(cell, "__dict__", {})]


def _selections(recompute: Any, recompute_comm: Any) -> list[dict]:
    """The ``select_module`` dicts that apply: recompute's under ``select``, recompute_comm's when enabled."""
    out = []
    if str(getattr(recompute, "mode", "None")) == "select" and isinstance(recompute.select_module, dict):
        out.append(recompute.select_module)
    if recompute_comm is not None and recompute_comm.enable and isinstance(recompute_comm.select_module, dict):
        out.append(recompute_comm.select_module)
    return out


def apply_recompute(model: Any, recompute: Any, recompute_comm: Any = None) -> list[str]:
    """Install what the sections ask for — the checkpoints of the layers ``exclude_op`` lists
    (`apply_exclusions`, unless `parallelize` did before FSDP) and the replayed units of the others; returns the
    paths of the recomputed cells (logged at start-up; the excluded ones: `excluded_cells`)."""
    apply_exclusions(model, recompute, recompute_comm)
    mode = str(getattr(recompute, "mode", "None"))
    layers = numbered_layers(model)
    cells = unit_replay.owners(model)
    done: list[str] = []
    if mode in ("full", "select"):
        for i in layer_ids(recompute.full_recompute_layer):
            path, layer = layers[i]
            if _trains(layer) and unit_replay.unit_of(layer) is None and not activation_checkpoint.within(layer):
                unit_replay.install(layer, "layer", unit_replay.renew(cells, _params(layer)), name=path)
            if unit_replay.unit_of(layer) is not None or activation_checkpoint.of(layer) is not None:
                done.append(path)  # installed here, an FSDP unit that replays (`replayed_layers`), or checkpointed
    for select in _selections(recompute, recompute_comm):
        for pattern, ranges in select.items():
            for i in layer_ids(ranges):
                path, layer = layers[i]
                if unit_replay.unit_of(layer) is not None or activation_checkpoint.of(layer) is not None or not _trains(layer):
                    if unit_replay.unit_of(layer) is not None and path not in done:
                        done.append(path)  # an FSDP unit that replays whole (`replayed_layers`)
                    continue  # replayed whole already
                excluding = bool(activation_checkpoint.within(layer))
                for sub, cell in _matching(layer, str(pattern)):
                    name = f"{path}.{sub}"
                    if excluding:  # checkpointed by apply_exclusions
                        if activation_checkpoint.of(cell) is not None and name not in done:
                            done.append(name)
                    elif unit_replay.unit_of(cell) is None and _params(cell):
                        unit_replay.install(cell, "cell", unit_replay.renew(cells, _params(cell)), name=name)
                        done.append(name)
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
