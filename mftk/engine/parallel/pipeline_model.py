"""One pipeline rank of a `GPTModel`: which layers and tensors it holds, and the forward of each of its chunks.

Why the full model stays on every rank: it is built (or loaded) from one seed with global shapes, so
every stage starts from the very numbers of the single-process run. Tensors of other stages are frozen
(``requires_grad = False``), which keeps them out of the optimizer, the gradient sync, the norm and the
checkpoint; they cost memory only (tiny on the models this runs on CPU).

Stage contents (reference §1.3): decoder layer ``i`` is on the rank whose chunk holds it
(`derive.stage_chunks`: chunk ``c`` of rank ``r`` is virtual stage ``c·pp + r``); the first virtual stage
embeds, the last one holds the final norm, the output layer and the MTP layers. When the last stage needs
the embedding too (tied output layer, or MTP's embedding of the shifted tokens) it keeps a trainable copy:
both copies start equal, their gradients are summed over the first and last stage (`DistContext.sync_grads`)
and the first stage's is the one saved.

The chunk forward is `GPTModel`'s own pieces (`prepare`, `run_layers`, `finish`); MoE aux losses of a chunk
are added to its objective (their gradient reaches the earlier stages through the activation gradient),
and the logged values (LM loss, per-layer aux losses, MTP losses, tokens per expert) are recorded per
micro-batch for the trainer.

``global_aux_loss`` keeps running expert counts in each router (`layers.moe.aux_loss` adds a micro-batch's
counts, then uses the running mean). The backward replays a chunk's forward, which would add them again
and see other micro-batches' counts (1F1B runs later forwards before earlier backwards); so each chunk's
first forward of a micro-batch records the counts it started from, and its replay runs from them and puts
back the counts it found: every forward sees what the single process's accumulation step sees.
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mindspore import Tensor

from mftk.engine.parallel.groups import StagePosition


def stage_chunks_of(config: Any) -> list[list[list[int]]]:
    """Decoder layer ids per rank and chunk from ``parallelism.pipeline_parallel_layers_per_stage``."""
    from mftk.derive import stage_chunks

    p, m = config.parallelism, config.model
    out = stage_chunks(int(m.num_hidden_layers), int(p.pipeline_parallel), int(p.pipeline_parallel_interleave_num),
                       p.pipeline_parallel_layers_per_stage or "auto")
    if out is None:  # the config rules reject this earlier; a guard, not a user path
        raise ValueError(f"cannot split {m.num_hidden_layers} layers into {p.pipeline_parallel} stages "
                         f"as {p.pipeline_parallel_layers_per_stage!r}")
    return out


def stages_of(name: str, chunks: list[list[list[int]]], *, shared_embedding: bool) -> tuple[int, ...]:
    """The pipeline ranks holding a model tensor, the saving one first."""
    last = len(chunks) - 1
    if name.startswith("embedding."):
        return (0, last) if shared_embedding and last > 0 else (0,)
    if name.startswith("decoder.layers."):
        i = int(name.split(".")[2])
        return (next(r for r, rank in enumerate(chunks) if any(i in c for c in rank)),)
    return (last,)  # final norm, output layer, MTP layers


def shares_embedding(model: Any) -> bool:
    """The last stage needs the embedding table too: a tied output layer, or MTP layers."""
    return model.output_layer is None or model.mtp is not None


class StageModel(StagePosition):
    """This rank's chunks: freezes what other stages hold and provides the `PipelineStage` function."""

    def __init__(self, model: Any, chunks: list[list[list[int]]], stage: int, table: Any) -> None:
        self.model, self.stage, self.pp = model, stage, len(chunks)
        self.chunks = [list(c) for c in chunks[stage]]
        shared = shares_embedding(model)
        for p in model.get_parameters():
            table.place(p.name, stages_of(p.name, chunks, shared_embedding=shared))
            if stage not in table[p.name].stages and p.requires_grad:
                p.requires_grad = False
        moe = model.moe_layers()
        self.moe_index = {id(m): i for i, m in enumerate(moe)}
        self.n_moe, self.n_mtp = len(moe), len(model.mtp.layers) if model.mtp is not None else 0
        self.n_experts = moe[0].e if moe else 0
        self.has_aux = any(m.aux_type for m in moe)
        self.batches: list = []
        self.scale = 1.0
        self.records: dict[int, dict] = {}
        self.routers = [m.router for m in moe if hasattr(m.router, "ga_steps")]  # global_aux_loss counts
        self.global_counts: dict[tuple[int, int], list] = {}  # (chunk, micro) -> counts before its forward
        # DeepSeek-V4's indexer layers (global order) and each chunk's own: a chunk adds its layers' indexer
        # losses to its objective, and the logged mean is summed over the stages like the aux losses
        from mftk.engine.layers.csa import indexer_cells

        self.indexer_index = {id(c): i for i, c in enumerate(c for c in model.indexer_cells() if c.with_indexer_loss)}
        self.chunk_indexers = [[c for i in chunk for c in indexer_cells(model.decoder.layers[i])]
                               for chunk in self.chunks]
        if self.chunks and model.mtp is not None:
            self.chunk_indexers[-1] += [c for layer in model.mtp.layers for c in indexer_cells(layer)]

    @property
    def my_layers(self) -> list[int]:
        return sorted(i for c in self.chunks for i in c)

    def first_chunk(self, chunk: int) -> bool:
        return self.is_first and chunk == 0

    def last_chunk(self, chunk: int) -> bool:
        return self.is_last and chunk == len(self.chunks) - 1

    def chunk_params(self, chunk: int) -> list:
        """The trainable parameters chunk ``chunk`` uses (its vjp weights)."""
        m = self.model
        cells = [m.decoder.layers[i] for i in self.chunks[chunk]]
        if self.first_chunk(chunk):
            cells.insert(0, m.embedding)
        if self.last_chunk(chunk):
            cells += [m.decoder.final_layernorm, *(c for c in (m.output_layer, m.mtp, m.decoder.hc_head)
                                                    if c is not None)]
            if m.output_layer is None or m.mtp is not None:
                cells.append(m.embedding)
        seen, out = set(), []
        for cell in cells:
            for p in cell.trainable_params():
                if id(p) not in seen:
                    seen.add(id(p))
                    out.append(p)
        return out

    def set_micro_batches(self, batches: list[dict], scale: float) -> None:
        """The step's micro-batches (loader dicts), prepared on the host once; ``scale`` = 1 / their count."""
        m = self.model
        self.batches = [m.prepare(b["input_ids"], b["labels"], b.get("loss_mask"), b.get("attention_mask"))
                        for b in batches]
        self.scale, self.records, self.global_counts = float(scale), {}, {}

    def fn(self, chunk: int, x, micro: int):
        """Chunk forward on micro-batch ``micro``: ``(activation, aux objective)``, or the scaled objective on
        the last virtual stage (`pipeline.PipelineStage`); a replay (the backward's) starts from the
        ``global_aux_loss`` counts the first forward started from."""
        if not self.routers:
            return self._forward(chunk, x, micro)
        key = (chunk, micro)
        if key not in self.global_counts:
            self.global_counts[key] = self._counts()
            return self._forward(chunk, x, micro)
        now = self._counts()
        self._set_counts(self.global_counts[key])
        try:
            return self._forward(chunk, x, micro)
        finally:
            self._set_counts(now)

    def _counts(self) -> list:
        return [(r.global_tokens_per_expert.asnumpy().copy(), r.ga_steps.asnumpy().copy()) for r in self.routers]

    def _set_counts(self, counts: list) -> None:
        for r, (tokens, steps) in zip(self.routers, counts):
            r.global_tokens_per_expert.set_data(Tensor(tokens))
            r.ga_steps.set_data(Tensor(steps))

    def _forward(self, chunk: int, x, micro: int):
        m, batch = self.model, self.batches[micro]
        layers = [m.decoder.layers[i] for i in self.chunks[chunk]]
        h = m.embed(batch.main.ids) + x if self.first_chunk(chunk) else x  # x: a float zero on the first
        moe: list = []
        h = m.run_layers(layers, h, batch, moe)
        owners = [self.moe_index[id(layer.mlp)] for layer in layers if layer.is_moe]
        cells = self.chunk_indexers[chunk]
        if self.last_chunk(chunk):
            objective, lm, aux, mtp, counts, _ = m.finish(h, batch, moe, cells)
            owners += [self.moe_index[id(layer.transformer_layer.mlp)] for layer in (m.mtp.layers if m.mtp else ())
                       if layer.transformer_layer.is_moe]
            self._record(micro, owners, aux, counts, lm=lm, mtp=mtp)
            self._record_indexer(micro, cells)
            return objective * self.scale
        aux = tuple(a for a, _ in moe if a is not None)
        self._record(micro, owners, aux, tuple(c for _, c in moe))
        extra = Tensor(0.0, h.dtype)
        for a in aux:
            extra = extra + a * m.spec.aux_loss_coeff
        for a in m.indexer_losses(cells):
            extra = extra + a * m.spec.indexer_loss_coeff
        self._record_indexer(micro, cells)
        return h, extra * self.scale

    def _record_indexer(self, micro: int, cells: list) -> None:
        rec = self.records.setdefault(micro, {"aux": {}, "counts": {}})
        for c in cells:
            if c.indexer_loss is not None:
                rec.setdefault("indexer", {})[self.indexer_index[id(c)]] = float(c.indexer_loss.asnumpy())

    def _record(self, micro: int, owners: list[int], aux: tuple, counts: tuple, lm=None, mtp: tuple = ()) -> None:
        rec = self.records.setdefault(micro, {"aux": {}, "counts": {}})
        for i, a in zip(owners, aux):
            rec["aux"][i] = float(a.asnumpy())
        for i, c in zip(owners, counts):
            rec["counts"][i] = c.asnumpy().astype(np.float64)
        if lm is not None:
            rec["lm"] = float(lm.asnumpy())
            rec["mtp"] = [float(t.asnumpy()) for t in mtp]

    def indexer_values(self) -> np.ndarray:
        """This stage's per-indexer-layer losses (α-free), means over micro-batches; zero for other stages'."""
        out = np.zeros(len(self.indexer_index), np.float64)
        n = max(len(self.records), 1)
        for r in self.records.values():
            for i, a in r.get("indexer", {}).items():
                out[i] += a / n
        return out

    def step_values(self) -> tuple[list[float], np.ndarray, np.ndarray, np.ndarray | None]:
        """This stage's part of the step's logged values: the LM losses (last stage), per-MoE-layer aux
        losses and MTP losses (means over micro-batches; zero where another stage holds the layer), and
        tokens per expert (summed; zero rows for other stages' layers)."""
        n = max(len(self.records), 1)
        losses = [r["lm"] for _, r in sorted(self.records.items()) if "lm" in r]
        aux = np.zeros(self.n_moe if self.has_aux else 0, np.float64)
        mtp = np.zeros(self.n_mtp, np.float64)
        counts = np.zeros((self.n_moe, self.n_experts), np.float64) if self.n_moe else None  # every rank reduces
        for r in self.records.values():
            for i, a in r["aux"].items():
                aux[i] += a / n
            for i, c in r["counts"].items():
                counts[i] += c
            mtp += np.asarray(r.get("mtp") or np.zeros(self.n_mtp), np.float64) / n
        return losses, aux, mtp, counts

    def act_shape(self, local_batch_size: int, seq_length: int, seq_shards: int) -> tuple[int, ...]:
        """Activations between stages: this rank's positions (``seq_length / (cp·tp)`` under CP and SP); with
        hyper-connections (DeepSeek-V4) every residual stream, ``(B, S, n, H)``."""
        shape = (local_batch_size, seq_length // seq_shards, int(self.model.spec.hidden_size))
        head = self.model.decoder.hc_head
        return shape if head is None else shape[:2] + (int(head.n),) + shape[2:]
