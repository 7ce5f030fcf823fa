"""The MindSpore PyNative engine: models built from specs.

Only this package imports MindSpore, and only when a model symbol is used. Public model API::

    model = build_model(model_cfg, seed=1234)        # GPTModel (mindspore.nn.Cell), fp32
    out = model.forward(batch)                        # ModelOutput (numpy): loss, aux terms, counts
    grad_fn = ms.value_and_grad(model, None, model.trainable_params(), has_aux=True)
    (objective, lm_loss, aux, mtp, counts, named), grads = grad_fn(ids, labels, loss_mask)
    model.update_expert_bias()                        # after the optimizer step
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_model": "mftk.engine.models.build", "init_parameters": "mftk.engine.models.build",
    "load_state_dict": "mftk.engine.models.build", "state_dict": "mftk.engine.models.build",
    "GPTModel": "mftk.engine.models.gpt", "ModelOutput": "mftk.engine.models.gpt",
    "ModelSpec": "mftk.engine.spec", "ModuleSpec": "mftk.engine.spec", "LayerSpec": "mftk.engine.spec",
    "build_spec": "mftk.engine.spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(name)
