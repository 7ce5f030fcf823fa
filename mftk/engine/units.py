"""The cells and Parameters of a built model, for the passes that replace parameters after the build (FSDP's
row blocks): every cell that may hold one (`owners`), and fresh Parameter objects in place of old ones
(`renew`)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from mindspore import Parameter, Tensor


def owners(model: Any) -> list[Any]:
    """Every cell that may hold a parameter: the cell tree, and the plain cells whose bound forward a
    `parallel.tensor_parallel.Sharded` runs (out of the tree)."""
    cells, seen, todo = [], set(), [c for _, c in model.cells_and_names()]
    while todo:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        cells.append(c)
        bound = getattr(getattr(c, "_forward", None), "__self__", None)
        if bound is not None and hasattr(bound, "cells_and_names"):
            todo.extend(sub for _, sub in bound.cells_and_names())
    return cells


def renew(cells: Sequence[Any], params: Sequence[Parameter], data: dict | None = None) -> list[Parameter]:
    """New Parameter objects (same names) in place of ``params`` in every cell of ``cells`` holding them, holding
    ``data[id(p)]`` or their current values. Why: MindSpore checks a custom ``bprop``'s gradient of a Parameter
    input against the shape the Parameter was *created* with, and TP/EP/FSDP cut parameters with ``set_data``."""
    out = []
    for old in params:
        value = (data or {}).get(id(old))
        new = Parameter(Tensor(np.ascontiguousarray(old.asnumpy() if value is None else value)), name=old.name,
                        requires_grad=old.requires_grad)
        for cell in cells:
            registry = cell._params  # noqa: SLF001 — MindSpore's registry of a cell's own parameters
            for key, value_ in list(registry.items()):
                if value_ is old:
                    registry[key] = new
        out.append(new)
    return out
