"""Muon (mindformers-2.1.md §4) over the same flat fp32 buffers as `optim.AdamW`, as NumPy on the host.

Per step, with ``lr = schedule(global_step)`` read before the counter increments and ``t = global_step + 1``
(muon.py:1185-1238, 2899-2971)::

    every parameter:       P ← P·(1 − lr·λ)                      (λ: its weight-decay group)
    Muon parameters:       M ← μ·M + G;   U ← G + μ·M (nesterov) or M
                           for each piece X of U (split rules, §4.5), a×b matrices (batched over experts):
                               X ← Xᵀ if a > b;  X ← X / max(‖X‖_F, eps)
                               k = 1..T:  A = X·Xᵀ;  X ← a_k·X + (b_k·A + c_k·A·A)·X
                               O_piece = sqrt(max(a, b)) · matched_adamw_rms · X (transposed back)
                           P ← P − lr·O
    AdamW fallback:        the non-fused AdamW of `optim.AdamW` with ``adamw_betas`` / ``adamw_eps``
    QK-clip (MLA layers):  masters of ``linear_qb`` (or the q rows of ``linear_qkv``) and ``linear_kvb``
                           rescaled per head by s_h = τ / max(m_h, τ) (√s_h on nope/k rows, s_h on rope rows)

Which parameters: 2-D and 3-D ones not matching an ``adamw_include`` glob (default ``*word_embeddings*``,
``*output_layer*``); 3-D ones must be grouped experts (``…experts.weight1``/``weight2``). The reference
runs the Newton–Schulz iterations in bf16 with an fp32 normalisation; mftk runs them in fp32 (CPU).
Checkpoint names are the reference's: ``muon_m.<p>`` (Muon), ``adam_m.<p>``/``adam_v.<p>`` (fallback),
``global_step``. ``comm_strategy`` ``allgather`` and ``allgather_deredundency`` run the same code: every
rank orthogonalises the full matrix (under tensor parallel and FSDP the blocks are gathered first and cut
back after, `attach_sharding`, so every layout makes the single-process update). Under
expert parallel a rank holds whole experts (FSDP leaves expert tensors whole) and Newton–Schulz acts per
expert, so each rank orthogonalises its own experts and the update is the single-process one.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Callable, Sequence

import numpy as np

from mftk.engine.optim import CHUNK, AdamW, DecayDecision

Piece = tuple  # a NumPy index into the parameter: rows (2-D) or (…, lanes) of the expert tensors


# ---------------------------------------------------------------------------------------------- split rules
def split_rules(cfg: Any) -> Callable[[str, tuple[int, ...]], list[Piece]]:
    """The reference's per-parameter split (gpt_model.py:798-867) for this model: name, shape → pieces,
    each orthogonalised on its own. Identity (one piece) for every name no rule matches."""
    mla = hasattr(cfg, "kv_lora_rank")
    nh = cfg.num_attention_heads

    def periodic(shape, sizes) -> list[Piece]:
        period = sum(sizes)
        rows = np.arange(shape[0]).reshape(-1, period)  # (repeats, period)
        out, start = [], 0
        for n in sizes:
            out.append((rows[:, start:start + n].reshape(-1),))
            start += n
        return out

    def blocks(sizes) -> list[Piece]:
        out, start = [], 0
        for n in sizes:
            out.append((np.arange(start, start + n),))
            start += n
        return out

    def rule(name: str, shape: tuple[int, ...]) -> list[Piece]:
        if fnmatch.fnmatchcase(name, "*mlp.experts.weight1*"):
            f = shape[-1] // 2
            return [(Ellipsis, slice(0, f)), (Ellipsis, slice(f, 2 * f))]
        if fnmatch.fnmatchcase(name, "*mlp.shared_experts.linear_fc1.weight*") or \
                fnmatch.fnmatchcase(name, "*mlp.linear_fc1.weight*"):
            return periodic(shape, (1, 1))  # gate rows even, up rows odd
        if mla and fnmatch.fnmatchcase(name, "*self_attention.linear_qb.weight*"):
            return periodic(shape, (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim))
        if mla and fnmatch.fnmatchcase(name, "*self_attention.linear_kvb.weight*"):
            return periodic(shape, (cfg.qk_nope_head_dim, cfg.v_head_dim))
        if fnmatch.fnmatchcase(name, "*self_attention.linear_qkv.weight*"):
            if not mla:  # mftk: GQA rows are [q of the group's heads | k | v] per group
                hd, ng = cfg.kv_channels(), cfg.num_query_groups()
                return periodic(shape, ((nh // ng) * hd, hd, hd))
            if cfg.q_lora_rank:
                return blocks((cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim))
            dq = nh * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim)
            q = [(p[0],) for p in periodic((dq,), (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim))]
            return q + [(r[0] + dq,) for r in blocks((cfg.kv_lora_rank, cfg.qk_rope_head_dim))]
        return [(Ellipsis,)]

    return rule


def orthogonalise(x: np.ndarray, schedule: Sequence[tuple[float, float, float]], eps: float) -> np.ndarray:
    """Newton–Schulz on the last two dims of ``x`` (fp32), scaled by ``sqrt(max(a, b))``: the matrix factor
    of Muon's update before ``lr · matched_adamw_rms``."""
    a, b = x.shape[-2:]
    t = a > b
    x = np.swapaxes(x, -1, -2) if t else x
    norm = np.sqrt((x.astype(np.float32) ** 2).sum(axis=(-2, -1), keepdims=True))
    x = (x / np.maximum(norm, np.float32(eps))).astype(np.float32)
    for ka, kb, kc in schedule:
        g = x @ np.swapaxes(x, -1, -2)
        x = np.float32(ka) * x + (np.float32(kb) * g + np.float32(kc) * (g @ g)) @ x
    x = np.swapaxes(x, -1, -2) if t else x
    return x * np.float32(np.sqrt(max(a, b)))


# ---------------------------------------------------------------------------------------------- QK-clip
class QKClip:
    """Per-head QK-clip on the masters (gpt_model.py:892-910): ``max_logits() → {attention prefix: (nh,)}``
    gives each MLA layer's running max; ``s_h = τ / max(m_h, τ)``."""

    def __init__(self, cfg: Any, threshold: float, max_logits: Callable[[], dict[str, np.ndarray]]) -> None:
        self.threshold, self.max_logits = float(threshold), max_logits
        self.nh, self.nope, self.rope, self.v = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, \
            cfg.v_head_dim
        self.q_lora = bool(cfg.q_lora_rank)

    def apply(self, view: Callable[[str], np.ndarray | None]) -> None:
        """Rescale, through ``view(name)`` (the master of a parameter, or None when not owned here)."""
        for prefix, m in self.max_logits().items():
            s = (self.threshold / np.maximum(np.asarray(m, np.float64), self.threshold)).astype(np.float32)
            if (s >= 1).all():
                continue
            q = view(prefix + ("linear_qb.weight" if self.q_lora else "linear_qkv.weight"))
            if q is not None:
                dq = self.nope + self.rope
                heads = q[:self.nh * dq].reshape(self.nh, dq, -1)
                heads[:, :self.nope] *= np.sqrt(s)[:, None, None]
                heads[:, self.nope:] *= s[:, None, None]
            kvb = view(prefix + "linear_kvb.weight")
            if kvb is not None:
                kvb.reshape(self.nh, self.nope + self.v, -1)[:, :self.nope] *= np.sqrt(s)[:, None, None]


# ---------------------------------------------------------------------------------------------- the optimizer
class Muon(AdamW):
    """Muon for 2-D/3-D weights, AdamW for the rest, over `AdamW`'s flat layout (``m`` holds Muon's momentum
    for Muon parameters, Adam's first moment for the others; ``v`` is used by the fallback only)."""

    def __init__(self, names: Sequence[str], arrays: Sequence[np.ndarray], decisions: Sequence[DecayDecision], *,
                 schedule: Sequence[tuple[float, float, float]], momentum: float = 0.95, nesterov: bool = True,
                 matched_adamw_rms: float = 0.2, eps: float = 1e-8, adamw_betas: Sequence[float] = (0.95, 0.95),
                 adamw_eps: float = 1e-8, adamw_include: Sequence[str] = ("*word_embeddings*", "*output_layer*"),
                 splits: Callable[[str, tuple[int, ...]], list[Piece]] | None = None, qk_clip: QKClip | None = None,
                 full_shapes: Sequence[tuple[int, ...]] | None = None) -> None:
        super().__init__(names, arrays, decisions, betas=adamw_betas, eps=adamw_eps)
        self.schedule, self.momentum, self.nesterov = list(schedule), float(momentum), bool(nesterov)
        self.rms, self.ns_eps, self.qk_clip = float(matched_adamw_rms), float(eps), qk_clip
        self.splits = splits or (lambda name, shape: [(Ellipsis,)])
        self.decay = {i: d.weight_decay for i, d in enumerate(self._decisions(decisions))}
        self.full_shapes = [tuple(s) for s in (full_shapes or self.shapes)]
        self.adamw_include = tuple(adamw_include)
        self.is_muon = [self._orthogonalised(n, s) for n, s in zip(self.names, self.full_shapes)]
        for n, s, mu in zip(self.names, self.full_shapes, self.is_muon):
            if mu and len(s) == 3 and not n.endswith(("experts.weight1", "experts.weight2")):
                raise ValueError(f"Muon only supports 3-D weights of grouped experts, got {n} {s}")
        self._gather = self._scatter = None  # FSDP: `attach_sharding`

    def _orthogonalised(self, name: str, shape: tuple[int, ...]) -> bool:
        return len(shape) in (2, 3) and not any(fnmatch.fnmatchcase(name, g) for g in self.adamw_include)

    def state_kinds(self, name: str, shape: tuple[int, ...]) -> tuple[str, ...]:
        return ("muon_m",) if self._orthogonalised(name, tuple(shape)) else super().state_kinds(name, shape)

    def _decisions(self, decisions: Sequence[DecayDecision]) -> list[DecayDecision]:
        by_name = {d.name: d for d in decisions}
        return [by_name[n] for n in self.names]

    def attach_sharding(self, gather: Callable[[int, np.ndarray], np.ndarray],
                        scatter: Callable[[int, np.ndarray], np.ndarray]) -> None:
        """TP / FSDP: ``gather(i, local block) → full``, ``scatter(i, full) → this rank's block`` (the allgather
        strategy, `_matrix_gatherers`)."""
        self._gather, self._scatter = gather, scatter

    def muon_names(self) -> list[str]:
        return [n for n, mu in zip(self.names, self.is_muon) if mu]

    # ---------------------------------------------------------------------------------- update
    def step(self, g: np.ndarray, lr: float) -> None:
        self.global_step += 1
        t = self.global_step
        for i, wd in self.decay.items():
            if wd > 0:
                self.master[self.slices[i]] *= np.float32(1.0 - lr * wd)
        c = (np.float32(self.beta1), np.float32(1.0 - self.beta1), np.float32(self.beta2), np.float32(1.0 - self.beta2),
             np.float32(1.0 / (1.0 - self.beta2 ** t)), np.float32(self.eps), np.float32(lr / (1.0 - self.beta1 ** t)))
        for i, mu in enumerate(self.is_muon):
            if mu:
                self._muon(i, g, lr)
            else:
                for start in range(self.slices[i].start, self.slices[i].stop, CHUNK):
                    stop = min(start + CHUNK, self.slices[i].stop)
                    self._update(slice(start, stop), g[start:stop], c, self._scratch[0])
        if self.qk_clip is not None:
            index = {n: i for i, n in enumerate(self.names)}
            self.qk_clip.apply(lambda name: self.view(self.master, index[name]) if name in index else None)

    def _muon(self, i: int, g: np.ndarray, lr: float) -> None:
        grad, m = self.view(g, i), self.view(self.m, i)
        m *= np.float32(self.momentum)
        m += grad
        u = grad + np.float32(self.momentum) * m if self.nesterov else m.copy()
        if self._gather is not None:
            u = self._gather(i, u)
        out = np.empty_like(u)
        for piece in self.splits(self.names[i], u.shape):
            out[piece] = orthogonalise(u[piece], self.schedule, self.ns_eps)
        if self._scatter is not None:
            out = self._scatter(i, out)
        self.view(self.master, i)[...] -= np.float32(lr * self.rms) * out

    # ---------------------------------------------------------------------------------- state
    def state_buffers(self, i: int) -> dict[str, np.ndarray]:
        """The reference's names: ``muon_m.<p>`` for Muon parameters, ``adam_m.<p>``/``adam_v.<p>`` for the rest."""
        return {"muon_m": self.m} if self.is_muon[i] else super().state_buffers(i)

    def _foreign_states(self, tensors: dict[str, np.ndarray]) -> str:
        adam = any(k.startswith("adam_m.") for k in tensors) and not any(k.startswith("muon_m.") for k in tensors)
        return "; it holds AdamW states only (adam_m.*, adam_v.*), which Muon cannot continue" if adam else ""


# ---------------------------------------------------------------------------------------------- from the config
def build_muon(config: Any, model: Any, names: list[str], arrays: list[np.ndarray], decisions: list[DecayDecision],
               full_shapes: list[tuple[int, ...]], dist: Any = None) -> Muon:
    """The ``optimizer: {type: Muon}`` of a run: schedule, splits and QK-clip from the config; under tensor
    parallel and FSDP the split Muon weights are gathered for the orthogonalisation (every rank, the allgather
    strategy, `_matrix_gatherers`)
    and under data parallel the max logits are MAX-reduced over dp × cp, as the reference does."""
    from mftk.config.optimizer_muon import adamw_globs, ns_schedule, qk_clip_active

    o = config.optimizer
    qk = QKClip(config.model, o.qk_clip_threshold, _max_logits_reader(model, dist)) if qk_clip_active(config) else None
    opt = Muon(names, arrays, decisions, schedule=ns_schedule(o.ns_coefficients, o.ns_steps), momentum=o.momentum,
               nesterov=o.nesterov, matched_adamw_rms=o.matched_adamw_rms, eps=o.eps, adamw_betas=o.adamw_betas,
               adamw_eps=o.adamw_eps, adamw_include=adamw_globs(o.adamw_include), splits=split_rules(config.model),
               qk_clip=qk, full_shapes=full_shapes)
    gatherers = _matrix_gatherers(dist) if dist is not None else None
    if gatherers is not None:
        opt.attach_sharding(*gatherers)
    return opt


def _max_logits_reader(model: Any, dist: Any) -> Callable[[], dict[str, np.ndarray]]:
    from mftk.engine.monitor import max_logits_cells

    cells = max_logits_cells(model)

    def read() -> dict[str, np.ndarray]:
        values = {c.max_logits_val.name[:-len("core_attention.max_logits_val")]: c.max_logits_val.asnumpy().copy()
                  for c in cells}
        if dist is not None and dist.groups.dp_cp.size > 1 and values:
            from mindspore import Tensor

            from mftk.engine.parallel import comm

            keys = sorted(values)
            packed = comm.all_reduce(Tensor(np.concatenate([values[k] for k in keys])), dist.groups.dp_cp, "max")
            parts = np.split(packed.asnumpy(), np.cumsum([values[k].size for k in keys])[:-1])
            values = dict(zip(keys, parts))
        return values

    return read


def _matrix_gatherers(dist: Any) -> tuple[Callable, Callable] | None:
    """The whole matrix of every Muon weight a rank holds a block of, and that block back: the optimizer holds
    each Parameter's block (tensor-parallel rows or columns, FSDP rows inside them: the placement table's
    splits, outermost first), so ``gather`` undoes the splits innermost first with all-gathers over their
    mesh axes and ``scatter`` cuts the orthogonalised matrix as the table does. Newton–Schulz then acts on the
    matrix one process holds, its pieces split by the same rules and scaled by ``sqrt(max(a, b))`` of the full
    piece, so every layout makes the single-process update. MindSpore Transformers 2.1.0 does the same in
    PyNative: a 2-D DTensor's ``full_tensor()`` before the split/NS/merge and ``distribute_tensor(…).to_local()``
    after (mindformers/pynative/optimizer/muon.py, ``_apply_muon_update`` and ``_apply_muon_ns``). Expert-parallel
    splits stay: a rank holds whole experts and Newton–Schulz acts per expert. None when nothing is split."""
    splits = {i: gathered_splits(dist.table[n].splits) for i, n in enumerate(dist.names) if n in dist.table}
    splits = {i: s for i, s in splits.items() if any(getattr(dist.groups, axis).size > 1 for _, axis in s)}
    if not splits:
        return None
    groups = dist.groups

    def gather(i: int, local: np.ndarray) -> np.ndarray:
        return gather_blocks(local, splits.get(i, ()), groups)

    def scatter(i: int, full: np.ndarray) -> np.ndarray:
        return cut_blocks(full, splits.get(i, ()), groups)

    return gather, scatter


def gathered_splits(splits: Sequence[tuple[int, str]]) -> tuple[tuple[int, str], ...]:
    """The splits (outermost first) Muon undoes: all but expert parallel's, which must come first (it splits
    the expert dimension, over which Newton–Schulz is batched, so each rank orthogonalises its own experts)."""
    lead = 0
    while lead < len(splits) and splits[lead][1] == "ep":
        lead += 1
    rest = tuple(splits[lead:])
    if any(axis == "ep" for _, axis in rest):
        raise ValueError(f"Muon cannot gather a block split over expert parallel inside other splits: {splits}")
    return rest


def gather_blocks(local: np.ndarray, splits: Sequence[tuple[int, str]], groups: Any) -> np.ndarray:
    """``local`` (this rank's block of ``splits``, outermost first) → the whole tensor, each split undone by an
    all-gather over its axis (innermost first); the inverse of `cut_blocks`."""
    from mftk.engine.parallel import comm

    out = local
    for dim, axis in reversed(tuple(splits)):
        group = getattr(groups, axis)
        if group.size > 1:
            out = np.swapaxes(comm.all_gather_rows(np.swapaxes(out, 0, dim), group), 0, dim)
    return np.ascontiguousarray(out)


def cut_blocks(full: np.ndarray, splits: Sequence[tuple[int, str]], groups: Any) -> np.ndarray:
    """This rank's block of ``full`` under ``splits`` (outermost first), as `placement.Placement.cut` cuts."""
    out = full
    for dim, axis in splits:
        group = getattr(groups, axis)
        if group.size > 1:
            out = np.split(out, group.size, axis=dim)[group.rank]
    return np.ascontiguousarray(out)
