"""One pipeline stage of a `GPTModel`: which layers and parameters it holds, and its stage function.

Why the full model stays on every rank: it is built (or loaded) from one seed with global shapes, so
every stage starts from the very numbers of the single-process run. Parameters of other stages are
frozen (``requires_grad = False``), which keeps them out of the optimizer, the gradient sync, the
norm and the checkpoint; they cost memory only (tiny on the models this runs on CPU).

Stage contents (reference §1.3): the first stage holds the embedding, the last the final norm and
the output layer; decoder layer ``i`` is on the stage `derive.stage_layers` gives it
('auto' or the explicit per-stage strings). Tied embeddings and MTP would share the embedding
between the first and last stage; they are refused (`pipeline_problems`) rather than half-handled.
"""
from __future__ import annotations

from typing import Any

import attrs
import numpy as np
from mindspore import Tensor

from mftk.ckpt.names import ADAMW_STATES, STEP, state_name
from mftk.engine.models.gpt import loss_weights
from mftk.engine.parallel.groups import StagePosition


def stage_layers_of(config: Any) -> list[list[int]]:
    """Decoder layer ids per stage from ``parallelism.pipeline_parallel_layers_per_stage``."""
    from mftk.derive import stage_layers

    p, m = config.parallelism, config.model
    out = stage_layers(int(m.num_hidden_layers), int(p.pipeline_parallel), 1,
                       p.pipeline_parallel_layers_per_stage or "auto")
    if out is None:  # the config rules reject this earlier; a guard, not a user path
        raise ValueError(f"cannot split {m.num_hidden_layers} layers into {p.pipeline_parallel} stages "
                         f"as {p.pipeline_parallel_layers_per_stage!r}")
    return out


def stage_of_name(name: str, layers: list[list[int]]) -> int:
    """The stage holding a model tensor (also ``adam_m.<name>``-style optimizer names)."""
    from mftk.ckpt.names import param_of

    name = param_of(name)
    last = len(layers) - 1
    if name.startswith("embedding."):
        return 0
    if name.startswith("decoder.layers."):
        i = int(name.split(".")[2])
        return next(s for s, ids in enumerate(layers) if i in ids)
    return last  # final norm, output layer


def pipeline_problems(spec: Any, pp: int) -> list[str]:
    """Why this model cannot run with pipeline_parallel=pp (empty when it can)."""
    out = []
    if spec.tie_word_embeddings:
        out.append("pipeline parallel with tie_word_embeddings (embedding shared by first and last stage) "
                   "is not supported yet")
    if spec.mtp_layers:
        out.append("pipeline parallel with MTP layers is not supported yet")
    if any(ls.is_moe for ls in spec.layers):
        out.append("pipeline parallel with MoE layers is not supported yet")
    if spec.hidden_dropout:
        out.append("pipeline parallel recomputes each stage in backward, so hidden_dropout must be 0")
    return out


@attrs.frozen
class PipelineTable:
    """Every stage's tensors (name → shape, numpy dtype) so rank 0 can write the whole metadata.json."""

    layers: list
    model: dict  # name -> (shape, dtype) of every parameter and buffer
    trainable: tuple  # names that have optimizer states (adam_m / adam_v)

    def stage_of(self, key: str) -> int | None:
        return None if key == STEP else stage_of_name(key, self.layers)

    def placeholders(self, with_optimizer: bool) -> tuple[dict, dict | None]:
        """Zero-memory arrays of the right shapes and dtypes (`metadata_specs` reads only those)."""
        def empty(shape, dtype):
            return np.broadcast_to(np.zeros((), dtype), shape)

        model = {n: empty(s, d) for n, (s, d) in self.model.items()}
        if not with_optimizer:
            return model, None
        opt = {state_name(k, n): empty(*self.model[n]) for k in ADAMW_STATES for n in self.trainable}
        opt[STEP] = empty((1,), np.int64)
        return model, opt


class StageModel(StagePosition):
    """This rank's stage: freezes other stages' parameters and provides the `PipelineStage` function."""

    def __init__(self, model: Any, layers: list[list[int]], stage: int) -> None:
        self.model, self.layers, self.stage, self.pp = model, layers, stage, len(layers)
        self.my_layers = list(layers[stage])
        params = list(model.get_parameters())
        self.table = PipelineTable(layers=layers, model={p.name: (tuple(p.shape), p.asnumpy().dtype) for p in params},
                                   trainable=tuple(p.name for p in params if p.requires_grad))
        for p in model.get_parameters():
            if stage_of_name(p.name, layers) != stage and p.requires_grad:
                p.requires_grad = False

    def owns(self, name: str) -> bool:
        return stage_of_name(name, self.layers) == self.stage

    def owned_tensors(self, tensors: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in tensors.items() if k == STEP or self.owns(k)}

    def micro_inputs(self, batch: dict, scale: float) -> tuple:
        """The `PipelineStage.step` inputs of one micro-batch: ``(x, *extra)`` on the first stage."""
        m = self.model
        ids = np.ascontiguousarray(batch["input_ids"]).astype(np.int32)
        rope, mask = m.rope(ids.shape[1]), m._mask(ids, batch.get("attention_mask"))
        extra: tuple = (rope, mask)
        if self.is_last:
            lab = np.ascontiguousarray(batch["labels"]).astype(np.int32)
            lm = batch.get("loss_mask")
            lm = (ids != m.spec.pad_token_id) if lm is None else np.asarray(lm)
            extra += (Tensor(lab), Tensor(loss_weights(lm, lab)), scale)
        if self.is_first:
            return (Tensor(np.zeros((), np.float32)), Tensor(ids)) + extra
        return extra

    def fn(self, x, *extra):
        """Stage forward: embedding (first) → this stage's layers → norm, head, loss × scale (last)."""
        m = self.model
        if self.is_first:
            ids, extra = extra[0], extra[1:]
            h = m.embedding(ids) + x  # x: a float zero, so the stage has a differentiable input
        else:
            h = x
        rope, mask = extra[0], extra[1]
        for i in self.my_layers:
            h, _, _ = m.decoder.layers[i](h, rope, mask)
        if not self.is_last:
            return h
        lab, weights, scale = extra[2], extra[3], extra[4]
        return m.head_loss(m.decoder.final_layernorm(h), lab, weights) * scale

    def act_shape(self, local_batch_size: int, seq_length: int) -> tuple[int, int, int]:
        return (local_batch_size, seq_length, int(self.model.spec.hidden_size))
