"""LoRA adapters applied to a built model, like parallelism: the layers carry no LoRA code
(MindSpore Transformers 2.1 §3, ``pynative/pet/``).

`apply_lora` walks the model's cells. The module path of a cell is its dotted attribute path from the
model root with the reference's ``model.`` prefix (``model.decoder.layers.3.self_attention.linear_qkv``),
so a ``target_modules`` / ``exclude_layers`` regex written for MindSpore Transformers matches the same
cells here: ``exclude_layers`` (re.search) skips a whole subtree, ``target_modules`` (re.search) picks
each `Linear` (attention projections, MLP and shared-expert fc1/fc2, the MTP ``eh_proj``, the LM head
``output_layer``) and each `GroupedMLP` (routed experts). A picked cell is swapped for a wrapper that adopts the base cell's
parameters under their own names and runs its forward as a bound function (as `tensor_parallel.Sharded`
does), then adds the low-rank update:

- dense: ``y = base(x) + (drop(x)·Aᵀ)·Bᵀ·(alpha/rank)``, ``lora_a [r, in]``, ``lora_b [out, r]``; for the
  interleaved gate/up ``linear_fc1`` the even rows of B update the gate, the odd rows the up lanes;
- experts: ``fc1 = x·W1 + (drop(x)·A1)·B1·s`` then SwiGLU, ``out = h·W2 + (drop(h)·A2)·B2·s``, stored
  ``[E, in, out]`` like the base: ``weight1_lora_a [E, H, r]``, ``weight1_lora_b [E, r, 2F]``,
  ``weight2_lora_a [E, F, r]``, ``weight2_lora_b [E, r, H]``.

Names are the reference's checkpoint names (``…linear_qkv.lora_a``, ``…experts.weight1_lora_a``).
Init: ``A ~ N(0, lora_a_std)``, ``B = 0`` (or ``N(0, lora_b_std)``), from a generator seeded with the
run's seed in name order, so every layout starts from the same adapters. Every other parameter is frozen
(``requires_grad = False``): no gradient, no optimizer state, no FSDP rows, no gradient sync.

Checkpoints (`base_checkpoint`, `load_base`, `adapter_manifest`): a run with ``checkpoint.base_load_path`` loads the
frozen base first (2.1 §2.8), then the adapters (an adapter-only checkpoint, whose manifest must name the same
base) on top; with ``save_trainable_only`` its saves hold the adapters and a manifest naming the base.

Tensor parallel cuts an adapter with its base (`TP_SPLITS`, read by `parallel.parallelize`): a
column-parallel base keeps ``lora_a`` whole and splits ``lora_b`` by rows; a row-parallel base splits
``lora_a`` by columns and keeps ``lora_b`` whole (its partial products sum like the base's). Expert
parallel cuts every expert tensor on dim 0.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from mindspore import Parameter, Tensor, mint, nn, ops

from mftk.ckpt.layout import locate
from mftk.ckpt.lora import fingerprint, is_adapter_checkpoint, manifest, read_manifest
from mftk.ckpt.names import is_lora_name
from mftk.config.report import resolved
from mftk.engine.layers.linear import Linear
from mftk.engine.layers.mlp import GateUpLinear
from mftk.engine.layers.moe import GroupedMLP
from mftk.engine.layers.ops_cpu import split_last
from mftk.engine.restore import load_checkpoint, plan_for
from mftk.errors import CheckpointError, ConfigError, Problem
from mftk.logs.sinks import log

ROOT = "model"  # the reference's module paths start at its ForCausalLM root
HEAD = "output_layer"  # its forward is never called: the LM head's weight goes straight into the fused loss
# Tensor-parallel split of each adapter tensor, by the base's role: {role: ((attribute, dim), ...)}.
TP_SPLITS = {"column": (("lora_b", 0),), "row": (("lora_a", 1),)}


@attrs.frozen
class LoraSettings:
    target_modules: str
    exclude_layers: str | None
    rank: int
    alpha: float
    dropout: float
    a_std: float
    b_std: float

    @property
    def scaling(self) -> float:
        return float(self.alpha) / float(self.rank)

    @classmethod
    def of(cls, lora: Any) -> "LoraSettings":
        return cls(lora.target_modules, lora.exclude_layers, int(lora.lora_rank), float(lora.lora_alpha),
                   float(lora.lora_dropout), float(lora.lora_a_std), float(lora.lora_b_std))


@attrs.frozen
class LoraReport:
    """What `apply_lora` did: the wrapped module paths and the parameter counts (logged at start-up)."""

    modules: tuple[str, ...]
    total_params: int
    trainable_params: int


def _dropout(p: float) -> nn.Cell | None:
    return nn.Dropout(p=p) if p > 0 else None


def _param(array: np.ndarray, name: str) -> Parameter:
    return Parameter(Tensor(np.ascontiguousarray(array, np.float32)), name=name)


class LoRALinear(nn.Cell):
    """A `Linear` (or the gate/up `GateUpLinear`) plus ``B·A`` scaled by ``alpha/rank``."""

    tp_splits = TP_SPLITS

    def __init__(self, base: nn.Cell, s: LoraSettings) -> None:
        super().__init__()
        for name, p in base.parameters_and_names(expand=False):
            setattr(self, name.rsplit(".", 1)[-1], p)
        out_dim, in_dim = base.weight.shape
        self.lora_a = _param(np.zeros((s.rank, in_dim)), "lora_a")
        self.lora_b = _param(np.zeros((out_dim, s.rank)), "lora_b")
        self.scaling = s.scaling
        self.drop = _dropout(s.dropout)
        self.gate_up = isinstance(base, GateUpLinear)
        self._rows = base.rows if self.gate_up else None
        self._forward = base.construct  # a bound method: the base stays out of the cell tree
        self._mm = ops.MatMul(transpose_b=True)

    def construct(self, x):
        y = self._forward(x)
        h = self.drop(x) if self.drop is not None else x
        lead = x.shape[:-1]
        xa = self._mm(h.reshape(-1, h.shape[-1]), self.lora_a)  # (N, r)
        if self.gate_up:
            gate_rows, up_rows = self._rows(self.lora_b.shape[0])
            dg = self._mm(xa, ops.gather(self.lora_b, gate_rows, 0)) * self.scaling
            du = self._mm(xa, ops.gather(self.lora_b, up_rows, 0)) * self.scaling
            return y[0] + dg.reshape(*lead, dg.shape[-1]), y[1] + du.reshape(*lead, du.shape[-1])
        d = self._mm(xa, self.lora_b) * self.scaling
        return y + d.reshape(*lead, d.shape[-1])


class LoRAHead(LoRALinear):
    """The LM head: the model feeds its weight to the fused head loss (`GPTModel.head_weight`), so the adapter
    is folded into that weight, ``W + s·B·A`` — the same logits as ``h·Wᵀ + s·(h·Aᵀ)·Bᵀ``. Dropout on the
    head's input cannot be folded in (refused in `apply_lora`)."""

    def merged_weight(self):
        return self.weight + self._mm(self.lora_b, ops.transpose(self.lora_a, (1, 0))) * self.scaling


class LoRAGroupedMLP(nn.Cell):
    """Routed experts with per-expert adapters on ``weight1`` and ``weight2``; dispatch is the base's: all
    experts at once on the padded ``(E, n, H)`` rows (``grouped``), or expert by expert (``expert``) under
    expert parallel."""

    construct = GroupedMLP.construct  # the dropless dispatch, calling `grouped` or `expert` below
    _padded = GroupedMLP._padded

    def __init__(self, base: GroupedMLP, s: LoraSettings) -> None:
        super().__init__()
        self.e, self.f, self.act = base.e, base.f, base.act
        self.weight1, self.weight2 = base.weight1, base.weight2
        self.dispatcher, self.combine = base.dispatcher, base.combine
        self.grouped = self._grouped  # a bound method in the base's `GroupedExpertsFn` slot
        e, h, f2 = base.weight1.shape
        f = base.weight2.shape[1]
        self.weight1_lora_a = _param(np.zeros((e, h, s.rank)), "weight1_lora_a")
        self.weight1_lora_b = _param(np.zeros((e, s.rank, f2)), "weight1_lora_b")
        self.weight2_lora_a = _param(np.zeros((e, f, s.rank)), "weight2_lora_a")
        self.weight2_lora_b = _param(np.zeros((e, s.rank, h)), "weight2_lora_b")
        self.scaling = s.scaling
        self.drop = _dropout(s.dropout)

    def _in(self, x):
        return self.drop(x) if self.drop is not None else x

    def _ffn(self, x, w1, a1, b1, w2, a2, b2):
        """``act(x·W1 + s·(x·A1)·B1)·W2 + s·(h·A2)·B2`` for one expert (2-D) or all of them (batched 3-D)."""
        s = self.scaling
        h = mint.matmul(x, w1) + mint.matmul(mint.matmul(self._in(x), a1), b1) * s
        gate, up = split_last(h, (self.f, self.f))
        a = self.act(gate, up)
        return mint.matmul(a, w2) + mint.matmul(mint.matmul(self._in(a), a2), b2) * s

    def expert(self, e: int, x):
        return self._ffn(x, self.weight1[e], self.weight1_lora_a[e], self.weight1_lora_b[e], self.weight2[e],
                         self.weight2_lora_a[e], self.weight2_lora_b[e])

    def _grouped(self, xs, w1, w2):
        return (self._ffn(xs, w1, self.weight1_lora_a, self.weight1_lora_b, w2, self.weight2_lora_a,
                          self.weight2_lora_b),)


ADAPTED = (LoRALinear, LoRAGroupedMLP)


def _compile(pattern: str | None, path: str) -> re.Pattern | None:
    if pattern is None or pattern == "":
        return None
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(message=f"{path} is not a valid regular expression ({exc})",
                          problems=[Problem(path=path, value=pattern, message=f"not a valid regular expression ({exc})")])


def apply_lora(model: Any, lora: Any, *, seed: int, init: bool = True) -> LoraReport:
    """Wrap the matched cells of ``model`` in place, freeze everything else, name and initialise the adapters."""
    s = LoraSettings.of(lora)
    target = _compile(s.target_modules, "lora_config.target_modules")
    exclude = _compile(s.exclude_layers, "lora_config.exclude_layers")
    wrapped: list[str] = []
    _walk(model, ROOT, target, exclude, s, wrapped)
    if not wrapped:
        raise ConfigError(message=f"LoRA target_modules {s.target_modules!r} matched no supported Linear or "
                          "GroupedMLP layers.", problems=[Problem(
                              path="lora_config.target_modules", value=s.target_modules,
                              message="matched no supported Linear or GroupedMLP layer",
                              hint="module paths look like model.decoder.layers.0.self_attention.linear_qkv")])
    for name, p in model.parameters_and_names():  # the reference's checkpoint names (swaps renamed nothing yet)
        p.name = name
    for p in model.get_parameters():
        if not is_lora_name(p.name):
            p.requires_grad = False
    if init:
        init_adapters(model, s, seed)
    # The adapters' dropout cells were built after the model was put in training mode (`models.build`):
    # give them the model's mode, or lora_dropout would never drop anything.
    model.set_train(bool(getattr(model, "training", False)))
    total = sum(int(np.prod(p.shape)) for p in model.get_parameters())
    trainable = sum(int(np.prod(p.shape)) for p in model.trainable_params())
    return LoraReport(modules=tuple(wrapped), total_params=total, trainable_params=trainable)


def _walk(cell: nn.Cell, path: str, target, exclude, s: LoraSettings, wrapped: list[str]) -> None:
    for name, child in list(cell.name_cells().items()):
        if child is None:
            continue
        sub = f"{path}.{name}"
        if exclude is not None and exclude.search(sub):
            continue
        if isinstance(child, ADAPTED):
            wrapped.append(sub)
            continue
        hit = target is not None and target.search(sub) is not None
        if hit and name == HEAD and path == ROOT and isinstance(child, Linear):
            _wrap_head(cell, child, s, sub)
            wrapped.append(sub)
        elif hit and isinstance(child, (Linear, GroupedMLP)):
            setattr(cell, name, LoRALinear(child, s) if isinstance(child, Linear) else LoRAGroupedMLP(child, s))
            wrapped.append(sub)
        else:
            _walk(child, sub, target, exclude, s, wrapped)


def _wrap_head(model: Any, head: Linear, s: LoraSettings, path: str) -> None:
    """The LM head with an adapter: the model's ``head_weight`` (what the fused loss, the logits and MTP read)
    becomes the merged weight, swapped on the model object as parallelism swaps its parts."""
    if s.dropout > 0:
        raise ConfigError(message=f"LoRA on {path} with lora_dropout > 0 is not supported by mftk", problems=[Problem(
            path="lora_config.lora_dropout", value=s.dropout,
            message=f"the adapter of {path} is folded into the head weight the fused loss reads, so dropout on "
                    "its input cannot be applied", hint="set lora_dropout: 0, or add output_layer to "
                    "lora_config.exclude_layers")])
    model.output_layer = LoRAHead(head, s)
    model.head_weight = model.output_layer.merged_weight


def init_adapters(model: Any, s: LoraSettings, seed: int) -> None:
    """``A ~ N(0, a_std)``, ``B = 0`` or ``N(0, b_std)``, drawn in name order from one seeded generator."""
    rng = np.random.default_rng([seed, 0x10AA])
    for name, p in sorted(model.parameters_and_names(), key=lambda kv: kv[0]):
        if not is_lora_name(name):
            continue
        std = s.a_std if name.endswith("lora_a") else s.b_std
        value = rng.normal(0.0, std, p.shape) if std > 0 else np.zeros(p.shape)
        p.set_data(Tensor(value.astype(np.float32)))


# ------------------------------------------------------------------------------- checkpoints
def base_checkpoint(config: Any, load_path: str) -> tuple[str, list[str]]:
    """``checkpoint.base_load_path`` when it is to be loaded ("" when not): the run starts from it (no load_path)
    or load_path is an adapter-only checkpoint (whose manifest must name the same base); and the run's notes."""
    base = config.checkpoint.base_load_path.strip()
    adapter_only = bool(load_path) and is_adapter_checkpoint(load_path)
    if adapter_only and not base:
        raise CheckpointError(message="An adapter-only checkpoint requires checkpoint.base_load_path.",
                              path=load_path, hint="set checkpoint.base_load_path to the base it was trained on")
    if not base:
        return "", []
    if not Path(base).exists():
        raise CheckpointError(message=f"base_load_path does not exist: {base}", path=base,
                              hint="point checkpoint.base_load_path at the frozen base (an HF dir or a checkpoint)")
    if load_path and not adapter_only:
        note = f"checkpoint.base_load_path is not loaded: {load_path} is a full checkpoint"
        log.info(note)
        return "", [note]
    if adapter_only:
        saved = (read_manifest(locate(load_path).step_dir) or {}).get("base_fingerprint")
        now = fingerprint(base)
        if saved and now and saved != now:
            raise CheckpointError(message="base_load_path fingerprint does not match the adapter checkpoint.",
                                  path=base, hint="load the base the adapters were trained on (its files, "
                                  "sizes and modification times are fingerprinted)")
        if not (saved and now):
            log.warning("base fingerprint unknown: the base is not checked against the adapter checkpoint")
    return base, []


def load_base(model: Any, config: Any, base: str, *, layout: Any, rank: int) -> None:
    """The base weights into the model: no optimizer, no step, no data position."""
    plan = plan_for(config, model, base, weights_only=True, layout=layout)
    load_checkpoint(plan, model, config, rank=rank)
    log.info("Loaded the frozen base weights from base_load_path %s (%s)", base, plan.kind)


def adapter_manifest(config: Any, state: Any) -> dict | None:
    """What an adapter-only save records beside the adapters (`ckpt.lora.manifest`); None for full saves."""
    ck = config.checkpoint
    if not ck.save_trainable_only:
        return None
    fp = fingerprint(ck.base_load_path)
    if fp is None:
        log.warning("base_load_path %s cannot be fingerprinted; the adapter manifest records none", ck.base_load_path)
    return manifest(ck.base_load_path, resolved(config.lora_config), global_step=state.global_step,
                    consumed_samples=state.consumed_samples, base_fingerprint=fp)
