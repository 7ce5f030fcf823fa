"""GPTModel: embedding → L pre-norm layers → final norm → LM head (+ MTP), composed from a ModelSpec.

Activations are batch-first ``(B, S, H)`` (the reference is sequence-first; results are identical,
only MoE token order inside a layer differs and no output depends on it). ``position_ids`` are
accepted and ignored, as in the reference: RoPE positions are always 0..S−1 (models.md §7.10).

``construct`` returns a tuple so it can be differentiated with ``ms.value_and_grad(..., has_aux=True)``:
``(objective, lm_loss, aux_losses, mtp_losses, tokens_per_expert, named)`` where ``objective =
lm_loss + α·Σ aux + Σ mtp (+ the indexer terms)`` (the terms whose gradients the reference injects),
``aux_losses`` are α-free per MoE layer, ``mtp_losses`` are already ×λ/D (as logged), ``tokens_per_expert``
one (E,) per MoE layer, and ``named`` the model's own logged outputs by name (`named_outputs`: DeepSeek-V4's
``indexer_loss``; empty for the others), which the trainer logs without knowing the family.
``ModelOutput.from_tuple`` turns it into numpy.

The model holds no parallel code: `parallel.parallelize` cuts the built model's weights and swaps in
communicating parts (torchtitan's ``parallelize_*`` idea). Two of its parts exist to be swapped:
``seq`` (which positions of each sequence this rank holds: all of them, or context parallel's chunks)
and ``loss`` (the fused LM-head loss, or the vocabulary-parallel one). The forward is built from pieces
(`prepare`, the layers, `finish`) so a pipeline stage runs the same code on its share of the layers.
"""
from __future__ import annotations

import attrs
import numpy as np
from mindspore import Tensor, nn, ops

from mftk.engine.layers.embedding import LanguageModelEmbedding
from mftk.engine.layers.linear import Linear
from mftk.engine.layers.loss import IGNORE_INDEX, HeadLoss
from mftk.engine.layers.mtp import MultiTokenPredictionLayer
from mftk.engine.spec import LayerSpec, ModelSpec


class TransformerLayer(nn.Cell):
    """``x += attn(norm(x)); x += mlp(norm(x))``; returns (x, aux loss or None, expert counts or None)."""

    def __init__(self, spec: LayerSpec, dropout: float = 0.0) -> None:
        super().__init__()
        self.input_layernorm = spec.norm.build()
        self.self_attention = spec.attention.build()
        self.pre_mlp_layernorm = spec.norm.build()
        self.mlp = spec.mlp.build()
        self.is_moe, self.dropout = spec.is_moe, float(dropout)
        self._compiled = None  # set by `compile`

    def _drop(self, x):
        return ops.dropout(x, p=self.dropout) if self.dropout > 0.0 and self.training else x

    def _attend(self, x, rope, mask):
        return x + self._drop(self.self_attention(self.input_layernorm(x), rope, mask))

    def _dense(self, x, cos, sin, mask):
        x = self._attend(x, (cos, sin), mask)
        return x + self._drop(self.mlp(self.pre_mlp_layernorm(x)))

    def compile(self) -> None:
        """Run this layer under ``mindspore.jit`` (a CPU speed lever, see `GPTModel.jit_blocks`): a dense
        layer as one graph; only the attention of a MoE layer (its dispatch syncs with the host) or of
        a layer with dropout (a compiled graph would freeze the train/eval switch)."""
        import mindspore as ms

        if self.is_moe or self.dropout > 0.0:
            self.self_attention.construct = ms.jit(self.self_attention.construct)
        else:  # a plain function over the cell: a jitted bound ``construct`` of this class fails to compile
            layer = self

            def dense(x, cos, sin, mask):
                return layer._dense(x, cos, sin, mask)

            self._compiled = ms.jit(dense)

    def construct(self, x, rope, mask, input_ids=None):
        if self._compiled is not None:
            return self._compiled(x, rope[0], rope[1], mask), None, None
        if not self.is_moe:
            return self._dense(x, rope[0], rope[1], mask), None, None
        x = self._attend(x, rope, mask)
        m, aux, counts = self.mlp(self.pre_mlp_layernorm(x))
        return x + self._drop(m), aux, counts


def build_layer(spec: LayerSpec, dropout: float) -> nn.Cell:
    """The spec's layer class (`TransformerLayer` unless it names another, e.g. a hyper-connection layer)."""
    return (spec.layer or TransformerLayer)(spec, dropout)


class TransformerBlock(nn.Cell):
    """The decoder layers and final norm; with ``spec.hc_head`` the residual is several streams, expanded
    from the embedding and collapsed by ``hc_head`` before the final norm."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.layers = nn.CellList([build_layer(s, spec.hidden_dropout) for s in spec.layers])
        self.hc_head = spec.hc_head.build() if spec.hc_head is not None else None
        self.final_layernorm = spec.final_norm.build()


class MultiTokenPrediction(nn.Cell):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        eps = spec.final_norm.params.get("eps", 1e-6)
        self.layers = nn.CellList([
            MultiTokenPredictionLayer(spec.hidden_size, build_layer(s, spec.hidden_dropout), eps,
                                      hc_head=spec.hc_head.build() if spec.hc_head is not None else None)
            for s in spec.mtp_layers])


@attrs.frozen
class ModelOutput:
    """One forward's results in numpy: what the trainer logs (models.md §4)."""

    loss: float  # main masked-mean CE (the logged ``loss``)
    objective: float  # what is differentiated: loss + α·Σ aux + Σ mtp
    load_balancing_losses: np.ndarray  # (n_moe,) α-free, per MoE layer (MTP layers included)
    mtp_losses: np.ndarray  # (D,) already × λ/D, as the reference logs ``mtp_1_loss``
    tokens_per_expert: np.ndarray  # (n_moe, E)
    named: dict = attrs.field(factory=dict)  # the model's named outputs (`GPTModel.named_outputs`)

    @classmethod
    def from_tuple(cls, out) -> "ModelOutput":
        objective, lm, aux, mtp, counts, named = out
        arr = lambda ts: np.array([float(t.asnumpy()) for t in ts], np.float64)  # noqa: E731
        cnt = np.stack([c.asnumpy() for c in counts]) if counts else np.zeros((0, 0), np.float32)
        return cls(float(lm.asnumpy()), float(objective.asnumpy()), arr(aux), arr(mtp), cnt,
                   {k: float(v.asnumpy()) for k, v in named.items()})


def loss_weights(loss_mask: np.ndarray, labels: np.ndarray, eps: float = 1e-8) -> np.ndarray:
    """Per-token weights of the masked mean ``Σ ce·m / (Σ m + eps)``, ``m = loss_mask · (labels ≠ −100)``
    (models.md §4); ``eps = 0`` with nothing to predict gives NaN weights, as the formula does."""
    m = np.asarray(loss_mask, np.float32) * (np.asarray(labels) != IGNORE_INDEX)
    with np.errstate(divide="ignore", invalid="ignore"):
        return (m / np.float32(m.sum(dtype=np.float64) + eps)).astype(np.float32)


def _np(x) -> np.ndarray | None:
    return None if x is None else (x.asnumpy() if isinstance(x, Tensor) else np.asarray(x))


def _roll_left(a: np.ndarray, fill) -> np.ndarray:
    """Shift one step left along S, filling the last position (MTP targets, models.md §2.13)."""
    out = np.roll(a, -1, axis=1)
    out[:, -1] = fill
    return out


class WholeSequence:
    """This rank holds every position of each sequence. Context parallel swaps in
    `parallel.context_parallel.ColossalSequence`, which keeps this rank's chunks (same methods)."""

    scale = 1.0  # multiplies the loss weights (context parallel: cp, undone by the average over cp)

    def local(self, a: np.ndarray) -> np.ndarray:
        """A ``(B, S, ...)`` host array restricted to this rank's positions."""
        return a

    def rope(self, cos, sin):
        """The ``(1, S, 1, D)`` tables at this rank's positions."""
        return cos, sin

    def mask(self, mask: np.ndarray) -> np.ndarray:
        """``(B, 1, S, S)`` (True = masked) → this rank's queries × the keys its attention sees."""
        return mask


@attrs.frozen
class Targets:
    """One prediction target on this rank's positions: inputs, labels (ignored ones clamped) and loss weights."""

    ids: Tensor  # (B, S_local) int32
    labels: Tensor  # (B·S_local,) int32, ≥ 0
    weights: Tensor  # (B·S_local,) fp32: the masked-mean weights (`loss_weights`) of the whole batch


@attrs.frozen
class Batch:
    """A micro-batch prepared on the host: the main target, one per MTP depth, RoPE tables and the mask."""

    main: Targets
    mtp: tuple[Targets, ...]
    rope: tuple[Tensor, Tensor]
    mask: Tensor


class GPTModel(nn.Cell):
    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = LanguageModelEmbedding(spec.vocab_size, spec.hidden_size, spec.hidden_dropout)
        self.decoder = TransformerBlock(spec)
        self.output_layer = None if spec.tie_word_embeddings else Linear(spec.hidden_size, spec.vocab_size)
        self.mtp = MultiTokenPrediction(spec) if spec.mtp_layers else None
        self.rope = spec.rope()
        self.loss = HeadLoss()
        self.seq = WholeSequence()
        self._tied_mm = ops.MatMul(transpose_b=True)
        self._indexer_cells = None  # found on first use (`indexer_losses`)

    # -- pieces ---------------------------------------------------------------------------------
    def attention_mask(self, ids: np.ndarray) -> np.ndarray:
        """Causal mask plus the reference's key-padding rule: keys equal to ``pad_token_id`` are masked
        for every query (models.md §2.2; packed data containing that id is affected — gotcha #11)."""
        s = ids.shape[1]
        pad = (ids == self.spec.pad_token_id)[:, None, None, :]  # (B, 1, 1, S)
        return np.triu(np.ones((s, s), bool), 1)[None, None] | pad

    def head_weight(self):
        """``[V, H]`` of the LM head: the output layer's, or the embedding's when tied."""
        return self.embedding.word_embeddings.weight if self.output_layer is None else self.output_layer.weight

    def lm_head(self, h):
        """Logits ``(B, S, V)`` (evaluation and parity tests; training uses `head_loss`)."""
        b, s, hd = h.shape
        return self._tied_mm(h.reshape(b * s, hd), self.head_weight()).reshape(b, s, -1)

    def hidden_states(self, ids: Tensor, rope, mask):
        """Decoder output after the final norm, plus per-MoE-layer (aux, counts)."""
        h, moe = self.embedding(ids), []
        head = self.decoder.hc_head
        if head is not None:
            h = head.expand(h)  # (B, S, n, H)
        for layer in self.decoder.layers:
            h, aux, counts = layer(h, rope, mask, ids)
            if counts is not None:
                moe.append((aux, counts))
        if head is not None:
            h = head(h)
        return self.decoder.final_layernorm(h), moe

    def logits(self, input_ids, attention_mask=None):
        """Main logits ``(B, S, V)`` and MTP logits (one per depth) — for parity tests and eval."""
        ids = _np(input_ids).astype(np.int32)
        mask = Tensor(self._mask(ids, attention_mask))
        rope = self.rope(ids.shape[1])
        h, _ = self.hidden_states(Tensor(ids), rope, mask)
        mtp_logits, cur, hk = [], ids, h
        for layer in (self.mtp.layers if self.mtp is not None else []):
            cur = _roll_left(cur, 0)
            hk, _, _ = layer(self.embedding(Tensor(cur)), hk, rope, mask)
            mtp_logits.append(self.lm_head(hk))
        return self.lm_head(h), mtp_logits

    def head_loss(self, h, target: Targets):
        """``Σ wᵢ·CE(lm_head(h)ᵢ, labelsᵢ)`` over the tokens of ``h`` (`loss`: fused, or vocabulary-parallel)."""
        return self.loss(h, self.head_weight(), target.labels, target.weights)

    def _mask(self, ids: np.ndarray, attention_mask) -> np.ndarray:
        if attention_mask is None:
            return self.attention_mask(ids)
        return _np(attention_mask).astype(bool).reshape(ids.shape[0], 1, ids.shape[1], ids.shape[1])

    def targets(self, ids: np.ndarray, labels: np.ndarray, weights: np.ndarray) -> Targets:
        seq = self.seq
        w = np.ascontiguousarray(seq.local(weights), np.float32).reshape(-1) * np.float32(seq.scale)
        lab = np.ascontiguousarray(np.maximum(seq.local(labels), 0), np.int32).reshape(-1)  # ignored: weight 0
        return Targets(Tensor(np.ascontiguousarray(seq.local(ids), np.int32)), Tensor(lab), Tensor(w))

    # -- training forward -----------------------------------------------------------------------
    def prepare(self, input_ids, labels, loss_mask=None, attention_mask=None) -> Batch:
        """The host side of a training forward: every target (main and MTP shifts, computed on the whole
        sequence, then cut to this rank's positions), the RoPE tables and the mask."""
        ids, lab = _np(input_ids).astype(np.int32), _np(labels).astype(np.int32)
        lm = (ids != self.spec.pad_token_id) if loss_mask is None else _np(loss_mask)
        lm = lm.astype(np.float32) * (lab != IGNORE_INDEX)
        cos, sin = self.rope(ids.shape[1])
        mask = Tensor(np.ascontiguousarray(self.seq.mask(self._mask(ids, attention_mask))))
        main = self.targets(ids, lab, loss_weights(lm, lab))
        mtp, cur, cur_lab, cur_mask = [], ids, lab, lm
        for _ in range(len(self.spec.mtp_layers)):
            cur, cur_lab, cur_mask = _roll_left(cur, 0), _roll_left(cur_lab, IGNORE_INDEX), _roll_left(cur_mask, 0.0)
            mtp.append(self.targets(cur, cur_lab, loss_weights(cur_mask, cur_lab, eps=0.0)))
        return Batch(main=main, mtp=tuple(mtp), rope=self.seq.rope(cos, sin), mask=mask)

    def embed(self, ids: Tensor):
        """The first layer's input: the embedding, expanded to the residual streams with ``hc_head``."""
        h = self.embedding(ids)
        return self.decoder.hc_head.expand(h) if self.decoder.hc_head is not None else h  # (B, S, n, H)

    def run_layers(self, layers, h, batch: Batch, moe: list):
        """``h`` through ``layers`` (decoder layers), appending each MoE layer's (aux, counts) to ``moe``;
        the layers see this rank's input ids (DeepSeek-V4's hash-routed experts)."""
        for layer in layers:
            h, aux, counts = layer(h, batch.rope, batch.mask, batch.main.ids)
            if counts is not None:
                moe.append((aux, counts))
        return h

    def finish(self, h, batch: Batch, moe: list, indexer_cells: list | None = None):
        """Final norm, LM loss and MTP on the decoder output; the ``construct`` tuple (objective, lm loss,
        aux losses, MTP losses, tokens per expert, named outputs) of the MoE layers in ``moe`` and the MTP layers.
        ``indexer_cells``: whose indexer losses join the objective (default: every one that ran; a pipeline
        stage names its own, `pipeline_model.StageModel`)."""
        if self.decoder.hc_head is not None:
            h = self.decoder.hc_head(h)  # the residual streams collapsed
        h = self.decoder.final_layernorm(h)
        lm_loss = self.head_loss(h, batch.main)
        objective = lm_loss
        mtp_losses, hk = [], h
        if self.mtp is not None:
            lam = self.spec.mtp_loss_scaling_factor / len(self.mtp.layers)
            for layer, target in zip(self.mtp.layers, batch.mtp):
                hk, aux, counts = layer(self.embedding(target.ids), hk, batch.rope, batch.mask)
                if counts is not None:
                    moe.append((aux, counts))
                ce = self.head_loss(hk, target) * lam
                mtp_losses.append(ce)
                objective = objective + ce
        aux_losses = tuple(a for a, _ in moe if a is not None)
        for a in aux_losses:
            objective = objective + a * self.spec.aux_loss_coeff
        indexer = self.indexer_losses(indexer_cells)
        for a in indexer:
            objective = objective + a * self.spec.indexer_loss_coeff
        counts = tuple(c for _, c in moe)
        return objective, lm_loss, aux_losses, tuple(mtp_losses), counts, self.named_outputs(indexer)

    def construct(self, input_ids, labels, loss_mask=None, position_ids=None, attention_mask=None):
        batch = self.prepare(input_ids, labels, loss_mask, attention_mask)
        moe: list = []
        h = self.run_layers(self.decoder.layers, self.embed(batch.main.ids), batch, moe)
        return self.finish(h, batch, moe)

    def indexer_losses(self, cells: list | None = None) -> list:
        """This forward's indexer KL losses (DeepSeek-V4 CSA layers in training; α-free), layer order; of
        ``cells`` only when given."""
        cells = self.indexer_cells() if cells is None else cells
        return [c.indexer_loss for c in cells if c.indexer_loss is not None]

    def named_outputs(self, indexer_losses) -> dict:
        """The forward's logged outputs by name: ``indexer_loss`` (DeepSeek-V4) as the reference logs it, the
        mean over the indexer layers × its coefficient, of this forward's tensors (or, on a pipeline stage,
        of the per-layer float64 means, zero for the other stages' layers); none without indexer losses."""
        if not len(indexer_losses):
            return {}
        if isinstance(indexer_losses, np.ndarray):
            mean = float(np.mean(indexer_losses))
        else:
            mean = ops.stack([a.reshape(()) for a in indexer_losses]).mean()
        return {"indexer_loss": mean * self.spec.indexer_loss_coeff}

    def indexer_cells(self) -> list:
        """The cells that leave an indexer loss (`csa.indexer_cells`), decoder then MTP layers."""
        if self._indexer_cells is None:
            from mftk.engine.layers.csa import indexer_cells

            self._indexer_cells = indexer_cells(self)
        return self._indexer_cells

    def forward(self, batch: dict) -> ModelOutput:
        """Convenience: run ``construct`` on a dict batch and return numpy results."""
        keys = ("input_ids", "labels", "loss_mask", "position_ids", "attention_mask")
        return ModelOutput.from_tuple(self(*(batch.get(k) for k in keys)))

    def jit_blocks(self) -> None:
        """Compile every transformer layer with ``mindspore.jit`` (`TransformerLayer.compile`): dense layers
        whole, MoE layers (and layers with dropout) their attention only, DeepSeek-V4 layers their
        hyper-connection mixes (`hyper.HyperConnection.compile`). Forward and gradients unchanged; on CPU a dense layer's
        forward+backward is ~1.6× faster than op-by-op PyNative (bench/train_step.py)."""
        for layer in self.transformer_layers():
            layer.compile()

    def transformer_layers(self) -> list:
        return list(self.decoder.layers) + ([m.transformer_layer for m in self.mtp.layers] if self.mtp else [])

    # -- aux-loss-free balancing ---------------------------------------------------------------------
    def moe_layers(self) -> list:
        return [layer.mlp for layer in self.transformer_layers() if layer.is_moe]

    def reset_global_aux_stats(self) -> None:
        """Zero the ``global_aux_loss`` running counts (``router.global_tokens_per_expert``, ``ga_steps``);
        the reference resets them at every logged step."""
        for moe in self.moe_layers():
            if hasattr(moe.router, "ga_steps"):
                moe.router.global_tokens_per_expert.set_data(Tensor(np.zeros((moe.e,), np.float32)))
                moe.router.ga_steps.set_data(Tensor(np.zeros((1,), np.float32)))

    def update_expert_bias(self, tokens_per_expert=None) -> None:
        """After the optimizer step: ``bias += γ·sign(mean − counts)`` per MoE layer, then reset the counts.

        ``tokens_per_expert`` is ``(n_moe, E)`` summed over the step's micro-batches (and ranks); when
        omitted, each layer's own ``tokens_per_expert`` buffer is used.
        """
        for i, moe in enumerate(self.moe_layers()):
            counts = moe.tokens_per_expert.asnumpy() if tokens_per_expert is None else np.asarray(tokens_per_expert[i])
            moe.update_expert_bias(counts, self.spec.bias_update_rate)
