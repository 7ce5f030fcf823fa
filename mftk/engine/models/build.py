"""``build_model(model_cfg, seed=...)``: spec → GPTModel → deterministic normal init.

Init: every matrix (Linear weights, embedding, router, expert weights) ~ N(0, std) with
std = ``initializer_range`` (YAML alias ``init_method_std``); RMSNorm weights 1; biases and buffers
(``expert_bias``, ``tokens_per_expert``, …) 0. The reference PyNative trainer ignores the configured
value and hard-codes N(0, 0.01) (models.md §2.14); mftk makes the configured value take effect — set
``initializer_range: 0.01`` to reproduce the reference. Numbers come from a numpy generator seeded
with ``seed`` in parameter-name order, so a seed fixes the weights on every device.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import Tensor

from mftk.engine.layers.norm import RMSNorm
from mftk.engine.models.gpt import GPTModel
from mftk.engine.spec import build_spec


def init_parameters(model: GPTModel, std: float, seed: int) -> None:
    """A cell may name its own init for some parameters (``init_overrides() → {param: f(rng, shape, std)}``,
    e.g. DeepSeek-V4's hyper-connections); those draw from the same generator in the same name order."""
    norms = {id(c.weight) for _, c in model.cells_and_names() if isinstance(c, RMSNorm)}
    special = {id(p): f for _, c in model.cells_and_names() if hasattr(c, "init_overrides")
               for p, f in c.init_overrides().items()}
    rng = np.random.default_rng(seed)
    for name, p in sorted(model.parameters_and_names(), key=lambda kv: kv[0]):
        if id(p) in special:
            p.set_data(Tensor(special[id(p)](rng, tuple(p.shape), std)))
        elif p.requires_grad and id(p) not in norms and not name.endswith(".bias"):
            p.set_data(Tensor(rng.normal(0.0, std, p.shape).astype(np.float32)))


def build_model(model_cfg: Any, *, seed: int) -> GPTModel:
    """Build the family's model from its ``model:`` config (registry by model_type/architectures).

    The model is returned in training mode, so ``hidden_dropout`` applies (MindSpore cells default
    to eval mode, which would silently turn dropout off)."""
    spec = build_spec(model_cfg)
    model = GPTModel(spec)
    init_parameters(model, spec.init_std, seed)
    model.set_train(True)  # dropout (hidden_dropout) active; call ``set_train(False)`` for evaluation
    return model


def state_dict(model: GPTModel) -> dict[str, np.ndarray]:
    """Reference-named numpy copy of every parameter and buffer (checkpoint keys, models.md §3)."""
    return {p.name: p.asnumpy().copy() for p in model.get_parameters()}


def load_state_dict(model: GPTModel, tensors: dict[str, np.ndarray]) -> None:
    """Assign reference-named arrays; every model tensor must be present with its exact shape.

    Exception: ``…core_attention.max_logits_val`` (max-logit tracking, a statistic reset every step) may
    be absent (the model keeps its zeros) or extra (dropped), so tracking can be switched either way."""
    from mftk.errors import CheckpointError

    problems = []
    optional = lambda n: n.endswith(".max_logits_val")  # noqa: E731
    params = {p.name: p for p in model.get_parameters()}
    tensors = {n: a for n, a in tensors.items() if n in params or not optional(n)}
    tensors.update({n: p.asnumpy() for n, p in params.items() if n not in tensors and optional(n)})
    for name, p in params.items():
        if name not in tensors:
            problems.append(f"missing tensor: {name}")
        elif tuple(tensors[name].shape) != tuple(p.shape):
            problems.append(f"{name}: expected shape {tuple(p.shape)}, found {tuple(tensors[name].shape)}")
    problems += [f"unexpected tensor: {n}" for n in sorted(set(tensors) - set(params))]
    if problems:
        raise CheckpointError(message=f"state dict does not fit the model ({len(problems)} problems)",
                              problems=problems, hint="check that the model: section matches the checkpoint")
    for name, p in params.items():  # float parameters as float32; integer buffers (tid2eid) keep their dtype
        dtype = np.float32 if p.dtype.is_floating_point else p.asnumpy().dtype
        p.set_data(Tensor(np.ascontiguousarray(tensors[name], dtype=dtype)))
