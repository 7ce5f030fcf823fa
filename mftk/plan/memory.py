"""Per-stage memory, FLOPs, bubble, communication and step time of one parallel layout.

The model follows the respected estimators collected in peers.md §4: model states as Megatron and
ZeRO count them (§4.1, bf16 → 18 bytes/param, fp32 → 16), parameters placed on stages the way
Megatron's `theoretical_memory_usage` does (§4.2), activations from Korthikanti et al. (§4.3) but
written as an explicit inventory of the tensors each of *our* layers keeps for backward (so GQA,
qk-norm, SwiGLU, MLA and top-k MoE are counted as built, not as a GPT-2 block), and in-flight
micro-batches per schedule (§4.4). Every number is a `Term` that can `explain()` its formula and
inputs, because a memory estimate nobody can audit is not trusted. Where frameworks keep different things
(Megatron's distributed optimizer vs FSDP2's fp32 shards, per-module vs per-op selective recompute, the loss
buffers, torch's allocator reserve) a named profile says so (`PRESETS`), measured on the published runs of
`plan/references.py`.
"""
from __future__ import annotations

from typing import Any

import attrs

from mftk.errors import InputError
from mftk.plan import flops as F
from mftk.derive import Layout, compiles_blocks, stage_layers

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2}
GiB = 1024 ** 3


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def human(n: float) -> str:
    """Bytes with a binary unit that keeps three significant figures (tiny models stay readable)."""
    for unit, size in (("GiB", GiB), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if abs(n) >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


@attrs.frozen
class Term:
    """One estimated quantity with the formula and inputs that produced it."""

    name: str
    value: float
    formula: str
    inputs: dict[str, Any] = attrs.field(factory=dict)
    unit: str = "B"

    def explain(self) -> str:
        shown = human(self.value) if self.unit == "B" else f"{self.value:.4g} {self.unit}"
        args = ", ".join(f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}"
                         for k, v in self.inputs.items())
        return f"{self.name} = {self.formula} = {shown}\n    inputs: {args}"


@attrs.frozen(kw_only=True)
class PlanInputs:
    """What the estimate reads from a config, apart from the layout itself."""

    model: Any
    local_batch_size: int
    global_batch_size: int
    schedule: str = "1f1b"              # 1f1b / gpipe / interleaved_1f1b
    recompute: str = "none"             # none / selective / full
    reshard_policy: str = "default"     # FSDP reshard_after_forward_policy
    layers_per_stage: Any = "auto"
    cp_method: str = "colossal"
    ulysses_degree: int | None = None   # parallelism.ulysses_degree_in_cp (hybrid CP)
    sequence_parallel: bool = False
    rampup: tuple[int, ...] | None = None  # training.rampup_batch_size
    track_max_logits: bool = False      # max attention logit tracking (refused with TP/CP/PP)
    muon: bool = False                  # optimizer.type: Muon
    qk_clip: bool = False               # Muon's QK-clip is active (refused with FSDP)
    update_on_device: bool | None = None  # mftk.update_on_device (true: refused with PP)


@attrs.frozen(kw_only=True)
class Assumptions:
    """Knobs of the model that are not in the YAML.

    The defaults are the `generic` accounting of the published estimators (peers.md §4):
    fp32 main grads only, Adam m/v (+ fp32 master for low-precision params), one kept copy of the
    fp32 logits plus its gradient, the Korthikanti tensor inventory. The calibrated profiles (`MEGATRON`, the
    default `ACCELERATOR`, `TORCHTITAN`) and `MFTK_CPU` (mftk's own CPU engine, `bench/plan_calibration.py`)
    replace some of them with what each framework holds.
    """

    fused_attention: bool | None = None  # None: model.use_flash_attention (CPU runs: False)
    attention_score_copies: float = 2    # unfused attention: S×S tensors per head kept (scores, probabilities)
    gather_buffers: int = 2              # FSDP: gathered layer + prefetched next layer (peers.md §4.1)
    moe_imbalance: float = 1.0           # routed tokens per rank relative to perfectly balanced
    overhead_bytes: float = 0.0          # constant per device (runtime, workspaces); measured, not guessed
    framework_grad_bytes: float = 0.0    # per param: gradients the framework returns beside the fp32 main grad
    always_master: bool = False          # the optimizer keeps its own fp32 master copy even for fp32 params
    optimizer_scratch_bytes: float = 0.0  # per param: the update's scratch buffer
    retained_bytes_per_param: float = 0.0  # per param: freed copies (init, replaced weights) the allocators keep
    activation_factor: float = 1.0       # kept bytes per inventory byte (eager autograd keeps more than the inventory)
    mla_activation_factor: float | None = None  # the same for MLA (DeepSeek-V3) layers; None: activation_factor
    norm_scratch_bytes: float = 0.0      # per param, for at most 2**22 params: a grad-norm scratch block
    logits_copies: float = 2.0           # fp32 (tokens × V) tensors live at the loss: kept logits + their gradient
    # several processes (all 0/False: the accelerator accounting of peers.md §4)
    fsdp_keeps_full: bool = False        # FSDP shards only the optimizer: full weights, framework grads, grad buffer
    fsdp_units: bool = False             # mftk's FSDP: units put their grads in the flat buffer, experts whole
    dist_master_shared: bool = False     # several processes: the fp32 weights are views of the optimizer's masters
    grad_sync_copies: float = 0.0        # fp32 copies of this rank's flat gradient the sync makes (×2 with dp·cp > 1)
    dist_norm_bytes: float = 0.0         # per local param: unblocked grad-norm scratch when sharded or TP/EP
    cut_build_bytes: float = 0.0         # per param cut away by TP/EP: the full build's footprint the allocators keep
    reduce_buffers: float = 0.0          # messages' worth of buffers the collective library keeps for an all-reduce
    reduce_message_bytes: float = 16 * 2 ** 20  # the largest all-reduce message (engine/parallel/comm.py REDUCE_CHUNK)
    # compiled layers (one process, derive.compiles_blocks): what MindSpore's graphs hold beside the eager terms
    compiled_overhead_bytes: float = 0.0   # once, when any layer is compiled
    compiled_layer_bytes: float = 0.0      # per compiled graph (one per layer)
    compiled_param_bytes: float = 0.0      # per parameter inside a compiled graph
    compiled_activation_factor: float = 0.0  # per inventory byte of the compiled part, per micro-batch token
    # (field, value) pairs that replace the above for a one-process layout (world 1): a process not started by
    # msrun runs without its workers' malloc settings (engine/launch.py MALLOC_ENV) and keeps more freed blocks
    one_process: tuple[tuple[str, float], ...] = ()
    # accelerator frameworks (the named sub-profiles `megatron` = the default `accelerator`, `torchtitan`; fitted on
    # mftk/plan/references.py)
    param_bytes: float | None = None     # bytes of a stored parameter; None: the compute dtype's (FSDP2 keeps fp32: 4)
    master_copy: bool | None = None      # an fp32 master beside the params; None: when params are below fp32
    zero1: bool = False                  # dp_shard·cp shards only the optimizer (Megatron's distributed optimizer)
    loss_bytes: float | None = None      # bytes per token and vocab entry live at the loss; None: 4·logits_copies
    op_sac: bool = False                 # selective recompute is torchtitan's per-op SAC (every other matmul kept)
    tp_keeps_gathered: bool = False      # TP saves the all-gathered input of its column-parallel matmuls (DTensor)
    experts_tp: bool = False             # routed experts are split by TP as well as EP (Megatron's default ETP = TP)
    reserve_fraction: float = 0.0        # the allocator's reserve over the allocated peak (torch: reserved/allocated − 1)
    # step time with a hardware preset (plan/hardware.py): sustained fractions of the preset's bf16 peak
    matmul_efficiency: float = 0.44      # model FLOPs outside attention, bf16 (torchtitan's fit; see TORCHTITAN)
    attention_efficiency: float = 0.14   # the attention core (S² part: flash/ring attention)
    float8_speedup: float = 1.0          # matmul rate with Float8 linears over bf16 (the spec's peak ratio is 2)
    compile_speedup: float = 1.0         # torch.compile'd blocks over eager
    selective_factor: float = 1.03       # compute with selective recompute over none (full: 4/3)
    name: str = "generic"

    def for_layout(self, layout: Layout) -> "Assumptions":
        """These assumptions as they apply to ``layout`` (`one_process` for a world of 1)."""
        return attrs.evolve(self, **dict(self.one_process)) if self.one_process and layout.world == 1 else self


# mftk's CPU engine (PyNative, fp32, numpy AdamW), fitted to bench/plan_calibration.py's grid (one dimension
# at a time: layers, hidden, batch, seq, vocab; medians of 3 runs; refitted 2026-12-03 by least squares of the
# relative errors, after the backward kernels, the LM-head loss keeping P and MindSpore 2.10's allocator had
# moved the test points to the edge of ±15%):
# - states, from the code (optim.py, trainer.py): MindSpore weights 4 + the grads value_and_grad returns 4
#   + the flat fp32 accumulation buffer 4 + numpy master, m, v 4·3 = 24 B/param; the update works in place
#   (no scratch the allocator keeps at the peak);
# - retained: what the layer and hidden sweeps leave above 24 B/param (0.4: init arrays and replaced tensors
#   the pools keep);
# - activations, scores, logits: slopes of the batch, seq and vocab sweeps over the inventory's bytes
#   (eager autograd keeps 1.75× the GQA inventory, 3.7× for MLA layers, 2.2 score copies, 1.95 logits copies);
# - overhead: the fit's intercept (MindSpore's kernels, pools and autograd graph at first step), 39 MiB;
# - these five are `one_process`'s: a process msrun did not start has glibc's default malloc (a dynamic mmap
#   threshold: freed activation blocks stay in the heap; the batch-4 point measures 238 instead of 278 MiB
#   under MALLOC_ENV). The workers' values below (1.25, 3.85, 1.85, 2.75, 45 MiB: the `--multi` grid and
#   bench/memory.py's 220M runs) would put the grid's batch and seq points 6-11% under, DeepSeek-V3's 15% over;
# - compiled layers: a model of ≥ 10M parameters in one process runs its layers under ``mindspore.jit``
#   (derive.compiles_blocks); the graphs hold 57 MiB once, 27.4 MiB per compiled layer, 0.6 B per compiled
#   parameter and 1.23× the compiled part's inventory per token (`--compiled`: forced on − forced off, medians
#   of 3, on 8 points; the term is 0.94–1.08 of them). Before this term the grid's two such points (h512,
#   V32k) measured 20–35% above the estimate.
# Several workers (`--multi` grid and bench/memory.py's 220M model), from the code of engine/distributed.py,
# parallel/fsdp.py and state.py (issue 17):
# - the fp32 weights are views of the optimizer's masters (no second copy: dist_master_shared);
# - FSDP (parallel/fsdp.py): weights, the flat buffer and AdamW states all 1/F, and no framework grads beside
#   the buffer (the units put theirs in it: GradSink); units keep their activations unless recompute selects
#   their layer (a selected layer is replayed whole: "selective" counts as "full"); the largest unit's gathered
#   weights, gathered again in the backward, and its full gradients are the transient "fsdp gathered" term
#   ((2·4 + 4)·largest unit); expert weights are not FSDP-sharded. bench/memory.py's 220M runs (msrun workers
#   with MALLOC_ENV, engine/launch.py): dp2 1.07, fsdp2 0.95 at seq 256, 1.03 / 1.08 at seq 1024 without / with
#   full recompute. Under FSDP the row blocks share_masters replaces are freed at start-up (the 220M fsdp2
#   worker's RSS once the optimizer is built: baseline + weights + flat buffer + 35 MiB), yet its steps hold
#   about as much again above the other terms (linear_fc1's gate/up row copies, 22 MiB per kept layer, are 264
#   of its 419 MiB). Those row copies are now their own term ("gate/up rows": fc1's gathered rows, saved by
#   its matmuls, full size in every layer keeping its activations); the `--multi` fsdp2 point measured
#   13.9 MiB per layer against 11.3 estimated without it (L2/L8/L12 sweep, 2026-12), 12.8 with it;
#   "replaced weights" still stands for the rest;
# - gradient sync: the dp·cp all-reduce runs in place in 16 MiB chunks (no copy of the gradient), but
#   MindSpore's CPU collectives keep buffers once one ran: 1.4 messages (the `--multi` dp2 point's rank 0 measured
#   +22 MiB over the other terms on 2026-12-03, rank 1 none; 2.5 messages, +40 MiB, before); TP/EP pack the parts
#   they sum (1 copy);
# - grad norm: blocked in float64 (no scratch of note);
# - TP/EP cut: every rank builds the full model, then cuts its blocks; the cut-away part's build footprint
#   (6 B/param since malloc_trim runs after parallelizing: the `--multi` tp2/ep2 points give 3-4). FSDP's rows
#   are new Parameters (units.renew) and the built ones, in reference cycles, are collected before the trim
#   (memstat.release_freed_memory): no cut-build term for them (the 220M fsdp2 run kept its 838 MiB build before).
MFTK_CPU = Assumptions(fused_attention=False, attention_score_copies=1.85, overhead_bytes=45 * 2 ** 20,
                       framework_grad_bytes=4.0, always_master=True, optimizer_scratch_bytes=0.0,
                       retained_bytes_per_param=0.4, activation_factor=1.25,
                       mla_activation_factor=3.85, logits_copies=2.75, fsdp_units=True, dist_master_shared=True,
                       grad_sync_copies=1.0, cut_build_bytes=6.0, reduce_buffers=1.4,
                       one_process=(("attention_score_copies", 2.2), ("overhead_bytes", 39 * 2 ** 20),
                                    ("activation_factor", 1.75), ("mla_activation_factor", 3.7),
                                    ("logits_copies", 1.95)),
                       compiled_overhead_bytes=57 * 2 ** 20, compiled_layer_bytes=27.4 * 2 ** 20,
                       compiled_param_bytes=0.6, compiled_activation_factor=1.23, name="mftk-cpu")
# Frameworks on accelerators, fitted on the published runs of mftk/plan/references.py (rows marked fit):
# - megatron (Megatron-LM / Megatron-Core; MindSpore Transformers keeps the same states): bf16 weights, an fp32
#   main-grad buffer, fp32 master + Adam m, v (distributed optimizer: data_parallel_shard shards only these,
#   megatron/core/optimizer/distrib_optimizer.py); unfused attention keeps Korthikanti's 5·a·s² bytes per layer
#   (softmax out, dropout mask, dropout out: 2.5 score copies); the vocab-parallel CE keeps the fp32 logits and
#   writes their gradient in place (megatron/core/tensor_parallel/cross_entropy.py: 4 B + the bf16 grad 2 B);
#   experts are split by TP too (expert_tensor_parallel_size defaults to tensor_model_parallel_size);
#   overhead: mem-allocated-bytes after the step minus the states of the fitted goldens (128 MB: cuBLAS
#   workspaces, RNG trackers, the data iterator's pinned buffers).
# - torchtitan (FSDP2): fp32 parameters sharded (4 B), fp32 grads sharded, Adam m, v sharded, no separate master;
#   bf16 gathered units; selective recompute is per-op SAC (memory.op_sac_bytes); DTensor TP keeps its gathered
#   inputs; the loss `cross_entropy(pred.float())` holds the bf16 logits' fp32 copy, log_softmax's output and
#   its gradient (12 B per token and vocab entry at the peak); memory is torch's max *reserved*: the caching
#   allocator's reserve over the allocated peak is fitted (reserve_fraction: 0.075);
#   step time (plan/hardware.py): least squares of log(estimate/published) over the four fitted rows gives 0.44 of
#   the bf16 peak for matmuls, 0.14 for the attention core (ring attention at 32k-256k included), Float8 linears 2.0×
#   (the bound: the datasheets' fp8/bf16 ratio), torch.compile 1.15× (bench/plan_references.py --fit); per-op SAC
#   replays about half the forward matmuls: 7/6 of the step's FLOPs. Megatron has no throughput row that is not
#   launch-bound (references.py): it uses these values.
MEGATRON = Assumptions(attention_score_copies=2.5, loss_bytes=6.0, param_bytes=2.0, master_copy=True, zero1=True,
                       experts_tp=True, overhead_bytes=128e6, name="megatron")
TORCHTITAN = Assumptions(fused_attention=True, param_bytes=4.0, master_copy=False, loss_bytes=12.0, op_sac=True,
                         tp_keeps_gathered=True, reserve_fraction=0.075, float8_speedup=2.0, compile_speedup=1.15,
                         selective_factor=7 / 6, name="torchtitan")
# The default `accelerator` profile is Megatron-core's accounting (the calibrated `megatron` sub-profile under its own
# name): MindSpore Transformers, the trainer mftk's users run on their clusters, keeps the same mixed-precision states
# (bf16 weights, an fp32 `main_grad` buffer, fp32 masters + Adam m, v: mindformers-pynative.md §2.1 step 12, §2.5)
# and Megatron's per-module selective recompute (`recompute.select_module`). It shards them differently: its
# `data_parallel_shard` is FSDP (weights and grads sharded too, §2.2), where this accounting shards only the
# optimizer, so for its FSDP layouts the states here are an upper bound. `generic` is the uncalibrated ZeRO/Korthikanti
# accounting of peers.md §4 (the estimate's default Assumptions()), kept for comparison with those estimators.
ACCELERATOR = attrs.evolve(MEGATRON, name="accelerator")
PRESETS = {"accelerator": ACCELERATOR, "megatron": MEGATRON, "torchtitan": TORCHTITAN, "generic": Assumptions(),
           "mftk-cpu": MFTK_CPU}


def preset(name: str) -> Assumptions:
    """The named assumption profile; InputError naming the known ones otherwise."""
    if name not in PRESETS:
        raise InputError(message=f"unknown memory profile {name!r}",
                         hint=f"use one of: {', '.join(PRESETS)}")
    return PRESETS[name]


@attrs.frozen
class StageMemory:
    stage: int
    layers: tuple[int, ...]
    terms: tuple[Term, ...]

    @property
    def total(self) -> float:
        return sum(t.value for t in self.terms)

    def term(self, name: str) -> Term:
        return next(t for t in self.terms if t.name == name)


@attrs.frozen
class LayoutEstimate:
    layout: Layout
    micro_batches: int
    stages: tuple[StageMemory, ...]
    flops: Term
    bubble: Term
    comm: tuple[Term, ...]
    step_time: Term | None

    @property
    def peak(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total)

    @property
    def peak_bytes(self) -> float:
        return self.peak.total

    @property
    def comm_bytes(self) -> float:
        return sum(t.value for t in self.comm)

    def explain(self) -> str:
        lines = [f"layout: {self.layout.describe()}  (micro-batches per step m = {self.micro_batches})"]
        for st in self.stages:
            lines.append(f"-- stage {st.stage}: layers {_ranges(st.layers)}; total {human(st.total)}")
            lines += ["  " + t.explain() for t in st.terms]
        lines.append("-- step")
        lines += ["  " + t.explain() for t in (self.flops, self.bubble, *self.comm)]
        if self.step_time is not None:
            lines.append("  " + self.step_time.explain())
        return "\n".join(lines)


def _ranges(ids: tuple[int, ...]) -> str:
    if not ids:
        return "none"
    out, start, prev = [], ids[0], ids[0]
    for i in ids[1:] + (None,):
        if i is not None and i == prev + 1:
            prev = i
            continue
        out.append(f"{start}-{prev}" if prev != start else str(start))
        if i is not None:
            start = prev = i
    return ",".join(out)


# ----------------------------------------------------------------------------- parameters

@attrs.frozen
class _LayerParams:
    tp_split: int      # divided by TP (attention heads, MLP, shared experts)
    replicated: int    # same on every TP rank (norms, router, MLA down-projection)
    experts: int       # all routed experts of the layer (divided by EP)
    buffers: int = 0   # of `replicated`: non-trainable tensors (router counts, expert bias): no grads or states


def _layer_params(cfg: Any, moe: bool) -> _LayerParams:
    H = cfg.hidden_size
    attn = F.attention_params(cfg)
    v4 = F._v4.is_v4(cfg)
    v4_mla = v4 and F._v4._plain_mla(cfg)  # DeepSeek-V4's legacy mla variant: DeepSeek-V3's MLA plan, both norms
    if v4 and not v4_mla:  # the attention whole on every TP rank but its query up-projection's rows (parallelize.py)
        attn_rep = attn - cfg.num_attention_heads * cfg.v_head_dim * cfg.q_lora_rank
    elif F._is_mla(cfg) or v4_mla:
        q_rank = cfg.q_lora_rank or 0
        down = (q_rank if q_rank else cfg.num_attention_heads * cfg.q_head_dim()) + cfg.kv_lora_rank + cfg.qk_rope_head_dim
        attn_rep = down * H + ((q_rank if q_rank else 0) + cfg.kv_lora_rank if cfg.qk_layernorm or v4_mla else 0)
    else:
        attn_rep = 2 * cfg.kv_channels() if F.has_qk_norm(cfg) else 0
    rep = attn_rep + 2 * H
    split = attn - attn_rep
    if not moe:
        return _LayerParams(split + F.dense_mlp_params(cfg, cfg.ffn_hidden_size()), rep, 0)
    total, _ = F.moe_params(cfg)
    Fm = cfg.moe_intermediate_size
    experts = cfg.n_routed_experts * ((2 * Fm if cfg.gated_linear_unit else Fm) * H + Fm * H)
    Fs = cfg.moe_shared_expert_intermediate_size_resolved()
    shared = F.dense_mlp_params(cfg, Fs) if Fs else 0
    if v4:  # DeepSeek-V4's shared experts stay whole on every TP rank (as MindSpore Transformers 2.1.0's plan)
        return _LayerParams(split, rep + total - experts, experts, F.router_buffers(cfg))
    return _LayerParams(split + shared, rep + total - experts - shared, experts, F.router_buffers(cfg))


def _bytes(dtype: str) -> int:
    return DTYPE_BYTES.get(str(dtype).lower(), 4)


# ----------------------------------------------------------------------------- activations

_SCORES = "attention scores/probs (S per head)"
_NORM_BLOCK = 1 << 22  # the largest grad-norm scratch block a profile may declare (mftk's norm needs none)


def _fused(cfg: Any, asm: Assumptions) -> bool:
    """Whether attention keeps scores (unfused) or only its output and logsumexp: the profile's say, else the
    model's ``use_flash_attention``."""
    return cfg.use_flash_attention if asm.fused_attention is None else asm.fused_attention


def _act_factor(cfg: Any, asm: Assumptions) -> float:
    """Kept bytes per inventory byte for this model's layers (MLA layers have their own measured factor)."""
    if F._is_mla(cfg) and asm.mla_activation_factor is not None:
        return asm.mla_activation_factor
    return asm.activation_factor


def activation_inventory(cfg: Any, moe: bool, *, seq_per_rank: int, fused: bool, selective: bool,
                         score_copies: int = 2, imbalance: float = 1.0) -> dict[str, float]:
    """Bytes kept for backward per token of one layer, before TP/SP division (Korthikanti-style).

    Each entry is a tensor the layer saves: norm inputs and outputs (the next matmul's input), the
    projections' outputs as the following op needs them, the attention core, the MLP or the routed
    experts (K copies of each token), dropout masks (1 byte).
    """
    a = _bytes(cfg.compute_dtype)
    H, nh = cfg.hidden_size, cfg.num_attention_heads
    inv: dict[str, float] = {"norms (2 inputs + 2 outputs)": 4 * H * a}
    if F._is_mla(cfg):
        ql, kl, r = (cfg.q_lora_rank or 0), cfg.kv_lora_rank, cfg.qk_rope_head_dim
        dq, dv = cfg.q_head_dim(), cfg.v_head_dim
        inv["MLA latents (norm in/out)"] = (2 * ql + 2 * kl + r) * a
        inv["q, k, v for attention"] = nh * (2 * dq + dv) * a
        out_dim = nh * dv
    else:
        hd, ng = cfg.kv_channels(), cfg.num_query_groups()
        q, kv = nh * hd, ng * hd
        if F.has_qk_norm(cfg):
            inv["q/k-norm inputs"] = (q + kv) * a
        inv["q, k, v for attention"] = (q + 2 * kv) * a
        out_dim = q
    if fused:
        inv["attention output + logsumexp"] = out_dim * a + nh * 4
    else:
        inv["attention output"] = out_dim * a
        if not selective:
            inv[_SCORES] = score_copies * nh * seq_per_rank * a
    g = 3 if cfg.gated_linear_unit else 2   # fc1 out (2F gated, F plain) + act out (F)
    if moe:
        E, K, Fm = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        Fs = cfg.moe_shared_expert_intermediate_size_resolved()
        inv["router logits + scores (fp32)"] = 2 * E * 4
        inv["routed experts (K tokens: in, fc1, act, out)"] = imbalance * K * (2 * H + g * Fm) * a
        if Fs:
            inv["shared expert (fc1, act)"] = g * Fs * a
    else:
        inv["MLP (fc1 out, act out)"] = g * cfg.ffn_hidden_size() * a
    if cfg.hidden_dropout > 0:
        inv["dropout masks"] = 2 * H
    return inv


# the attention's entries of `activation_inventory` (what DeepSeek-V4 keeps for the whole sequence, `_whole_attention`)
_ATTENTION = ("MLA latents (norm in/out)", "q/k-norm inputs", "q, k, v for attention", "attention output",
              "attention output + logsumexp", _SCORES)


def _v4_whole_attention(cfg: Any) -> bool:
    """DeepSeek-V4's hybrid attention runs whole on the gathered sequence on every TP and CP rank
    (engine/parallel/parallelize.py ``whole_sequence_v4_attention``; its legacy ``mla`` variant takes MLA's TP)."""
    return F._v4.is_v4(cfg) and not F._v4._plain_mla(cfg)


def _whole_attention(cfg: Any, inv: dict[str, float], whole: int) -> dict[str, float]:
    """``inv`` with DeepSeek-V4's attention entries × ``whole`` (cp·sp: the tokens of the gathered sequence per
    token this rank holds outside the attention); other models' unchanged."""
    if whole <= 1 or not _v4_whole_attention(cfg):
        return inv
    return {name: v * whole if name in _ATTENTION else v for name, v in inv.items()}


def op_sac_bytes(cfg: Any) -> float:
    """Bytes per token one dense layer keeps under torchtitan's per-op selective AC (`_apply_op_sac`,
    pytorch/torchtitan torchtitan/models/llama3/infra/parallelize.py): the layer's input, the attention
    kernel's output and logsumexp, and the output of every other matmul in call order (q, k, v, o, w1, [w3,] w2:
    the 1st, 3rd, ... are saved, the rest recomputed with the norms and activations)."""
    a, H, nh = _bytes(cfg.compute_dtype), cfg.hidden_size, cfg.num_attention_heads
    hd, ng, Fw = cfg.kv_channels(), cfg.num_query_groups(), cfg.ffn_hidden_size()
    outs = [nh * hd, ng * hd, ng * hd, H, Fw] + ([Fw] if cfg.gated_linear_unit else []) + [H]
    return (H + nh * hd + sum(outs[0::2])) * a + nh * 4


# ----------------------------------------------------------------------------- the estimate

def in_flight(schedule: str, pp: int, stage: int, m: int, interleave: int) -> float:
    """Micro-batches whose activations a pipeline rank holds at its peak (peers.md §4.4)."""
    if pp == 1:
        return 1.0
    if schedule == "gpipe":
        return float(m)
    base = float(min(pp - stage, m))
    if interleave > 1:
        base *= 1 + (pp - 1) / (pp * interleave)
    return base


def estimate(layout: Layout, inputs: PlanInputs, assumptions: Assumptions = Assumptions(), *,
             device_tflops: float | None = None, link_gbps: float | None = None) -> LayoutEstimate:
    """Memory per pipeline stage plus FLOPs, bubble, communication and step time for one valid layout."""
    cfg, lay = inputs.model, layout
    assumptions = assumptions.for_layout(lay)
    m = max(inputs.global_batch_size // (lay.dp * inputs.local_batch_size), 1)
    stages = stage_layers(cfg.num_hidden_layers, lay.pp, lay.interleave, inputs.layers_per_stage)
    if stages is None:
        raise ValueError(f"layers cannot be split over pp={lay.pp}, interleave={lay.interleave}")
    recompute = inputs.recompute if lay.world > 1 else "none"  # the reference applies recompute only when world > 1
    if assumptions.fsdp_units and lay.dp_shard * lay.cp > 1 and recompute == "selective":
        # FSDP replays a layer recompute selects whole (engine/recompute.replayed_layers; one exclude_op lists
        # keeps its selection: plan/report.py notes exclude_op as outside the estimate)
        recompute = "full"
    out = tuple(_stage(cfg, lay, inputs, assumptions, i, ids, m, recompute) for i, ids in enumerate(stages))
    flops = _flops_term(cfg, inputs)
    bubble = _bubble_term(inputs.schedule, lay, m)
    comm = _comm_terms(cfg, lay, inputs, out, m, assumptions)
    step = _step_time(flops, bubble, comm, lay, recompute, device_tflops, link_gbps)
    return LayoutEstimate(layout=lay, micro_batches=m, stages=out, flops=flops, bubble=bubble, comm=comm,
                          step_time=step)


def _stage_param_counts(cfg: Any, lay: Layout, ids: list[int], first: bool, last: bool,
                        experts_tp: bool = False) -> dict[str, float]:
    pattern = cfg.moe_layer_pattern()
    tp, ep = lay.tp, lay.ep * (lay.tp if experts_tp else 1)  # experts_tp: each expert is split by TP as well
    dense = rep = experts = buffers = 0.0
    largest = 0.0
    for i in ids:
        lp = _layer_params(cfg, pattern[i])
        dense += lp.tp_split / tp
        rep += lp.replicated
        buffers += lp.buffers
        experts += lp.experts / ep
        largest = max(largest, lp.tp_split / tp + lp.replicated + lp.experts / ep)
    emb = cfg.vocab_size * cfg.hidden_size / tp
    embedding = emb if first else 0.0
    tied = bool(cfg.tie_word_embeddings) and not F._is_mla(cfg)
    output = emb if last and not (tied and first) else 0.0
    if last:
        rep += cfg.hidden_size  # final norm
        D = cfg.mtp_num_layers()
        if D:
            mtp = _layer_params(cfg, F.mtp_is_moe(cfg))
            dense += D * (mtp.tp_split / tp + 2 * cfg.hidden_size * cfg.hidden_size / tp)
            rep += D * (mtp.replicated + 3 * cfg.hidden_size)
            buffers += D * mtp.buffers
            experts += D * mtp.experts / ep
    largest = max(largest, embedding, output)
    return {"dense": dense + rep, "experts": experts, "embedding": embedding, "output": output, "largest": largest,
            "buffers": buffers}


def _expert_shards(lay: Layout, experts_tp: bool) -> int:
    """Ranks that shard one expert's parameters: dp_shard·cp·tp/ep (mftk, MindSpore Transformers: the sparse mesh
    `efsdp`); with experts split by TP as well (Megatron's ETP = TP) the tp ranks already hold different parts, so
    dp_shard·cp/ep (megatron/core/parallel_state.py: expert data parallel = world / (ETP·EP·PP))."""
    split = lay.ep * (lay.tp if experts_tp else 1)
    return max(lay.dp_shard * lay.cp * lay.tp // split, 1)


def _stage(cfg, lay: Layout, inputs: PlanInputs, asm: Assumptions, stage: int, ids: list[int], m: int,
           recompute: str) -> StageMemory:
    first, last = stage == 0, stage == lay.pp - 1
    n = _stage_param_counts(cfg, lay, ids, first, last, asm.experts_tp)
    p, e = _bytes(cfg.compute_dtype), _bytes(cfg.embedding_params_dtype)
    fsdp, efsdp = lay.dp_shard * lay.cp, _expert_shards(lay, asm.experts_tp)
    if asm.zero1 and lay.dp_shard == 1:
        fsdp = efsdp = 1  # data_parallel_shard 1: plain DDP, no distributed optimizer (CP ranks do not shard alone)
    if asm.fsdp_units:
        efsdp = 1  # mftk's FSDP leaves expert weights whole on their EP rank
    body, experts = n["dense"], n["experts"]
    table = n["embedding"] + n["output"]
    ins = {"dense_params": int(body), "expert_params": int(experts), "embedding_output_params": int(table),
           "fsdp = dp_shard·cp": fsdp, "efsdp = dp_shard·cp·tp/ep": efsdp}
    shard = (body + table) / fsdp + experts / efsdp                      # params of this rank's shard
    local = body + table + experts                                       # after TP/EP, before FSDP
    full = (asm.fsdp_keeps_full or asm.zero1) and shard < local
    pw, ew = (asm.param_bytes, asm.param_bytes) if asm.param_bytes else (p, e)  # stored parameter bytes
    if full:
        why = "distributed optimizer" if asm.zero1 else "FSDP"
        terms = [Term("weights", body * pw + table * ew + experts * pw,
                      f"dense·p + emb·p_emb + experts·p  [{why} shards only the optimizer: full weights kept]",
                      {**ins, "p": pw, "p_emb": ew})]
    else:
        terms = [Term("weights", (body * pw + table * ew) / fsdp + experts * pw / efsdp,
                      "(dense·p + emb·p_emb)/fsdp + experts·p/efsdp", {**ins, "p": pw, "p_emb": ew})]
    g = asm.framework_grad_bytes
    # gradients and optimizer states: trainable parameters only (the router's buffers get neither)
    t_body = body - n["buffers"]
    t_ins = {**ins, "dense_params": int(t_body), "buffers (not trained)": int(n["buffers"])}
    t_shard, t_local = (t_body + table) / fsdp + experts / efsdp, t_body + table + experts
    if full:
        terms.append(Term("gradients", (4 + g) * t_local,
                          "(4 + g_fw)·(dense + emb + experts)  [full framework grads + full fp32 flat buffer]",
                          {**t_ins, "g_fw": g}))
    elif asm.fsdp_units and fsdp > 1:
        terms.append(Term("gradients", 4 * t_shard + g * experts / efsdp,
                          "4·((dense + emb)/fsdp + experts/efsdp) + g_fw·experts/efsdp  [fp32 main grads, "
                          "reduce-scattered; the units put theirs in the buffer, the framework returns views of it]",
                          {**t_ins, "g_fw": g}))
    else:
        terms.append(Term("gradients", (4 + g) * t_shard,
                          "(4 + g_fw)·((dense + emb)/fsdp + experts/efsdp)  [fp32 main grads, reduce-scattered"
                          + (" + the framework's own grads]" if g else "]"), {**t_ins, "g_fw": g}))
    master = 4 if pw < 4 or asm.always_master else 0
    if asm.dist_master_shared and lay.world > 1 and p == 4 and e == 4:
        master = 0  # the model's fp32 parameters are the masters (engine/state.py share_masters)
    if asm.master_copy is not None:
        master = 4 if asm.master_copy else 0
    low = t_body + table * (ew < 4 or asm.always_master or bool(asm.master_copy))
    scratch = asm.optimizer_scratch_bytes
    terms.append(Term("optimizer", (8 + scratch) * t_shard + master * (low / fsdp + experts / efsdp),
                      "(Adam m,v 8 + scratch)·N/shard + fp32 master 4·N_master/shard"
                      + (" (a separate master for every param)" if asm.always_master else
                         " (only when params are not fp32)"),
                      {**t_ins, "master_bytes": master, "scratch": scratch}))
    if asm.retained_bytes_per_param:
        kept = local if full else shard                                  # FSDP here builds the full model
        terms.append(Term("allocator retained", asm.retained_bytes_per_param * kept,
                          "r·N_built  [freed init/replaced weight copies the allocators keep; measured]",
                          {"r": asm.retained_bytes_per_param, "N_built": int(kept)}))
    spread = shard < local or lay.tp > 1 or lay.ep > 1                   # sharded or model parallel
    if asm.dist_norm_bytes and spread:
        terms.append(Term("grad-norm scratch", asm.dist_norm_bytes * shard,
                          "s·N/shard  [sharded/TP/EP norm: float64 grads and their weighted product, unblocked]",
                          {"s": asm.dist_norm_bytes, "N/shard": int(shard)}))
    elif asm.norm_scratch_bytes:
        terms.append(Term("grad-norm scratch", asm.norm_scratch_bytes * min(shard, _NORM_BLOCK),
                          "s·min(N/shard, 2^22)  [one block of grads copied for the norm]",
                          {"s": asm.norm_scratch_bytes, "N/shard": int(shard)}))
    terms += _multiprocess_terms(cfg, lay, asm, local, (ids, first, last), shard if asm.fsdp_units else local)
    if full and asm.zero1:
        terms.append(Term("fsdp gathered", 0.0, "0 (the distributed optimizer all-gathers into the param buffer)", {}))
    elif full:
        terms.append(Term("fsdp gathered", 4 * local * (fsdp - 1) / fsdp,
                          "4·N·(F−1)/F  [the post-step all-gather's rows from the other shards]",
                          {"N": int(local), "F": fsdp}))
    else:
        terms.append(_gathered_term(n, lay, inputs, asm, p, fsdp, efsdp))
        if asm.fsdp_units and fsdp > 1:
            terms.append(_gate_up_rows_term(cfg, lay, ids, p, recompute))
    terms += _activation_terms(cfg, lay, inputs, asm, stage, ids, m, recompute, first, last)
    if asm.compiled_layer_bytes and compiles_blocks(F.param_counts(cfg)[0], one_process=lay.world == 1):
        terms.append(_compiled_term(cfg, inputs, asm, ids, last))
    if asm.overhead_bytes:
        terms.append(Term("overhead", asm.overhead_bytes, "constant per process (measured runtime baseline)",
                          {"profile": asm.name}))
    if asm.reserve_fraction:
        held = sum(t.value for t in terms)
        terms.append(Term("allocator reserve", asm.reserve_fraction * held,
                          "f·(sum of the terms above)  [cached blocks the allocator reserves beyond the allocated peak]",
                          {"f": asm.reserve_fraction, "profile": asm.name}))
    return StageMemory(stage=stage, layers=tuple(ids), terms=tuple(terms))


def _multiprocess_terms(cfg, lay: Layout, asm: Assumptions, local: float, where: tuple, held: float) -> list[Term]:
    """What a process of a multi-process job holds beside its states (profiles that model it: mftk-cpu).
    ``local``: this rank's parameters after TP/EP; ``held``: after FSDP too (mftk's FSDP cuts the Parameters)."""
    out = []
    dp_cp, model_parallel = lay.dp * lay.cp, lay.tp > 1 or lay.ep > 1
    copies = asm.grad_sync_copies * (1 if model_parallel else 0)  # the dp·cp all-reduce runs in place, in chunks
    if copies:
        out.append(Term("gradient sync", 4 * copies * local,
                        "4·copies·N  [TP/EP pack the parts of the flat fp32 gradient they sum; dp·cp reduces in place]",
                        {"copies": copies, "N": int(local), "dp·cp": dp_cp}))
    all_reduced = lay.dp_replicate > 1 or (dp_cp > 1 and not asm.fsdp_units)  # FSDP units reduce-scatter
    if asm.reduce_buffers and all_reduced:
        message = min(asm.reduce_message_bytes, 4 * held)
        out.append(Term("collective buffers", asm.reduce_buffers * message,
                        "b·min(message, 4·N_held)  [buffers the collective library keeps after the gradient all-reduce]",
                        {"b": asm.reduce_buffers, "message": int(asm.reduce_message_bytes), "N_held": int(held)}))
    if asm.dist_master_shared and lay.world > 1:
        out.append(Term("replaced weights", 4 * held, "4·N_held  [the built fp32 weights, freed when the parameters "
                        "became views of the optimizer's masters; the allocators keep them]", {"N_held": int(held)}))
    if asm.cut_build_bytes and model_parallel:  # FSDP's rows are new Parameters: the cut part is freed (run.py)
        ids, first, last = where
        whole = _stage_param_counts(cfg, attrs.evolve(lay, tp=1, ep=1), list(ids), first, last)
        n_full = whole["dense"] + whole["experts"] + whole["embedding"] + whole["output"]
        out.append(Term("cut build", asm.cut_build_bytes * max(n_full - local, 0.0),
                        "c·(N_model − N_local)  [the full model is built on every rank, then cut to its TP/EP blocks; "
                        "the allocators keep the cut-away part's build footprint]",
                        {"c": asm.cut_build_bytes, "N_model": int(n_full), "N_local": int(local)}))
    return out


def _gathered_term(n, lay: Layout, inputs: PlanInputs, asm: Assumptions, p: int, fsdp: int, efsdp: int) -> Term:
    if fsdp == 1 and (efsdp == 1 or not n["experts"]):  # dense models: efsdp (tp/ep) shards nothing
        return Term("fsdp gathered", 0.0, "0 (no FSDP sharding: parameters are resident)", {})
    policy = inputs.reshard_policy
    keeps_all = policy == "never" or (policy == "default" and lay.pp > 1)
    if keeps_all:
        total = n["dense"] + n["experts"] + n["embedding"] + n["output"]
        return Term("fsdp gathered", total * p, "p·N_stage (reshard_after_forward off: unsharded params stay)",
                    {"N_stage": int(total), "p": p, "reshard_after_forward_policy": policy, "pp": lay.pp})
    largest = n["largest"]
    return Term("fsdp gathered", (asm.gather_buffers * p + 4) * largest,
                "(buffers·p + 4)·largest_unit  [gathered + prefetched unit, its unsharded fp32 grad]",
                {"largest_unit": int(largest), "buffers": asm.gather_buffers, "p": p})


def _gate_up_rows_term(cfg, lay: Layout, ids: list[int], p: int, recompute: str) -> Term:
    """The gate and up row blocks `GateUpLinear` gathers from ``linear_fc1``'s weight are saved by its two
    matmuls for the backward, so every layer that keeps its activations holds a full-size copy of its fc1
    weight even when FSDP shards the Parameter (the units' handles cover the Parameters only). Without FSDP
    the fitted terms already hold them (the dp2 and single-process fits were measured with them), so the
    term is FSDP's only (the `--multi` sweep's fsdp2 slope per layer; see MFTK_CPU's notes)."""
    pattern = cfg.moe_layer_pattern()
    H, gated = cfg.hidden_size, 2 if cfg.gated_linear_unit else 1
    widths = [cfg.moe_shared_expert_intermediate_size_resolved() or 0 if pattern[i] else cfg.ffn_hidden_size()
              for i in ids]
    kept = max(widths, default=0) if recompute == "full" else sum(widths)   # full: one layer replays at a time
    return Term("gate/up rows", p * gated * kept * H / lay.tp,
                "p·(2F·H)/tp per layer keeping its activations  [fc1's gathered rows, saved by its matmuls]",
                {"F_kept": int(kept), "H": H, "p": p, "recompute": recompute})


_MLP_KEYS = ("MLP", "router", "routed", "shared")  # activation_inventory's entries of the MLP / MoE half


def _compiled_term(cfg, inputs: PlanInputs, asm: Assumptions, ids: list[int], last: bool) -> Term:
    """What the graphs of `GPTModel.jit_blocks` hold (one process, ≥ derive.JIT_MIN_PARAMS): a dense layer is
    compiled whole, a MoE layer or one with dropout its attention only (`TransformerLayer.compile`); each graph
    keeps a fixed part, a copy-sized part of its parameters and its own activations beside the eager ones
    (measured with the blocks forced on and off, bench/plan_calibration.py --compiled)."""
    pattern, H, a = cfg.moe_layer_pattern(), cfg.hidden_size, _bytes(cfg.compute_dtype)
    tokens = inputs.local_batch_size * cfg.seq_length
    fused = _fused(cfg, asm)
    layers = [bool(pattern[i]) for i in ids] + ([F.mtp_is_moe(cfg)] * cfg.mtp_num_layers() if last else [])
    params = inventory = 0.0
    for moe in layers:
        inv = activation_inventory(cfg, moe, seq_per_rank=cfg.seq_length, fused=fused, selective=False,
                                   score_copies=asm.attention_score_copies)
        if moe or cfg.hidden_dropout > 0:  # attention only: its projections, input norm and half the norm entry
            params += F.attention_params(cfg) + H
            inventory += sum(v for k, v in inv.items() if not k.startswith(_MLP_KEYS)) - 2 * H * a
        else:
            lp = _layer_params(cfg, False)
            params += lp.tp_split + lp.replicated
            inventory += sum(inv.values())
    value = (asm.compiled_overhead_bytes + len(layers) * asm.compiled_layer_bytes + asm.compiled_param_bytes * params
             + asm.compiled_activation_factor * tokens * inventory)
    return Term("compiled layers", value, "c0 + layers·c_layer + c_p·N_compiled + c_a·tokens·B_compiled  "
                "[MindSpore's graphs of the layers `mftk train` compiles in one process]",
                {"c0": int(asm.compiled_overhead_bytes), "layers": len(layers),
                 "c_layer": int(asm.compiled_layer_bytes), "c_p": asm.compiled_param_bytes, "N_compiled": int(params),
                 "c_a": asm.compiled_activation_factor, "tokens": tokens, "B_compiled": round(inventory)})


def _activation_terms(cfg, lay: Layout, inputs: PlanInputs, asm: Assumptions, stage: int, ids: list[int], m: int,
                      recompute: str, first: bool, last: bool) -> list[Term]:
    a = _bytes(cfg.compute_dtype)
    S = cfg.seq_length
    tokens = inputs.local_batch_size * S / lay.cp          # tokens of one micro-batch on one rank (before SP)
    sp = lay.tp if inputs.sequence_parallel or lay.tp > 1 else 1
    fused = _fused(cfg, asm)
    pattern = cfg.moe_layer_pattern()
    k = in_flight(inputs.schedule, lay.pp, stage, m, lay.interleave)
    per_layer = {}
    gathered = 2 * cfg.hidden_size * a * sp if asm.tp_keeps_gathered and lay.tp > 1 else 0.0  # ×sp: not split
    whole = lay.cp * sp if _v4_whole_attention(cfg) else 1  # V4: its attention on the gathered sequence
    for moe in {bool(pattern[i]) for i in ids}:
        inv = activation_inventory(cfg, moe, seq_per_rank=S // lay.cp * (lay.cp if whole > 1 else 1), fused=fused,
                                   selective=recompute == "selective", score_copies=asm.attention_score_copies,
                                   imbalance=asm.moe_imbalance)
        inv = _whole_attention(cfg, inv, whole)
        scores = inv.get(_SCORES, 0.0)
        per_layer[moe] = _act_factor(cfg, asm) * (sum(inv.values()) - scores) + scores + gathered
        if recompute == "selective" and asm.op_sac and not moe and not F._is_mla(cfg):
            per_layer[moe] = op_sac_bytes(cfg) + gathered
    n_moe = sum(1 for i in ids if pattern[i])
    n_dense = len(ids) - n_moe
    ins = {"tokens = b·S/cp": tokens, "sp_div": sp, "activation_factor": _act_factor(cfg, asm),
           "in_flight": round(k, 3), "layers": len(ids),
           "moe_layers": n_moe, "recompute": recompute + (" (per-op SAC)" if asm.op_sac and recompute == "selective"
                                                         else ""), "fused_attention": fused}
    if whole > 1:
        ins["whole_attention (cp·sp: DeepSeek-V4's attention on the gathered sequence)"] = whole
    if gathered:
        ins["tp_gathered_inputs (2H·a·tp)"] = gathered
    terms = []
    if recompute == "full":
        keep = len(ids) * cfg.hidden_size * a
        one = max(per_layer.values(), default=0)
        value = tokens / sp * (k * keep + one)
        terms.append(Term("activations", value, "tokens/sp·(in_flight·layers·H·a + one layer's inventory)",
                          {**ins, "H": cfg.hidden_size, "a": a, "layer_bytes_per_token": one}))
    else:
        per_mb = n_dense * per_layer.get(False, 0) + n_moe * per_layer.get(True, 0)
        formula = "in_flight·tokens/sp·(dense_layers·B_dense + moe_layers·B_moe)"
        terms.append(Term("activations", k * tokens / sp * per_mb, formula,
                          {**ins, "B_dense": per_layer.get(False, 0), "B_moe": per_layer.get(True, 0)}))
    if first:
        drop = cfg.hidden_size / sp if cfg.hidden_dropout > 0 else 0
        terms.append(Term("embedding acts", k * tokens * (16 + drop), "in_flight·tokens·(16 ids/labels + dropout mask)",
                          {"tokens": tokens, "in_flight": k}))
    if last:
        terms.append(_logits_term(cfg, lay, inputs, asm, tokens, sp, k, fused, recompute))
    return terms


def _logits_term(cfg, lay: Layout, inputs: PlanInputs, asm: Assumptions, tokens: float, sp: int, k: float,
                 fused: bool, recompute: str) -> Term:
    a, H, V = _bytes(cfg.compute_dtype), cfg.hidden_size, cfg.vocab_size
    heads = 1 + cfg.mtp_num_layers()
    live = asm.loss_bytes if asm.loss_bytes is not None else 4 * asm.logits_copies  # bytes per token·vocab entry
    kept = (live - 4) / 4                                   # fp32 logits kept by the CE (1 on accelerators)
    per_token = heads * (2 * H * a / sp + kept * V * 4 / lay.tp)   # final-norm in/out; kept logits
    grad = V * 4 / lay.tp
    value = tokens * (k_last(inputs, lay, k) * per_token + grad)
    extra = 0.0
    if cfg.mtp_num_layers():
        moe = F.mtp_is_moe(cfg)
        whole = lay.cp * sp if _v4_whole_attention(cfg) else 1
        inv = activation_inventory(cfg, moe, seq_per_rank=cfg.seq_length // (1 if whole > 1 else lay.cp),
                                   fused=fused, selective=recompute == "selective",
                                   score_copies=asm.attention_score_copies)
        inv = _whole_attention(cfg, inv, whole)
        scores = inv.get(_SCORES, 0.0)
        layer = _act_factor(cfg, asm) * (sum(inv.values()) - scores + 4 * H * a) + scores
        extra = tokens / sp * cfg.mtp_num_layers() * layer
        value += k_last(inputs, lay, k) * extra
    return Term("logits + loss", value,
                "tokens·(in_flight·heads·(2H·a/sp + (L−4)·V/tp) + 4V/tp [logit grad]) + MTP layer acts",
                {"tokens": tokens, "L (bytes per token·V at the loss)": live, "heads (1+MTP)": heads, "H": H, "V": V, "a": a,
                 "tp": lay.tp,
                 "mtp_layer_bytes": round(extra)})


def k_last(inputs: PlanInputs, lay: Layout, k: float) -> float:
    """Micro-batches with live logits on the last stage: 1 under 1F1B (fwd is followed by its bwd)."""
    return k if inputs.schedule == "gpipe" else 1.0


def _flops_term(cfg, inputs: PlanInputs) -> Term:
    value = F.flops_per_step(cfg, global_batch_size=inputs.global_batch_size)
    return Term("flops per step", value, "Megatron-LM's model FLOPs (the formula behind the log's throughput)",
                {"global_batch_size": inputs.global_batch_size, "seq_length": cfg.seq_length}, unit="FLOP")


def _bubble_term(schedule: str, lay: Layout, m: int) -> Term:
    v = lay.interleave if schedule != "gpipe" else 1
    value = (lay.pp - 1) / (v * m)
    return Term("bubble", value, "(pp − 1)/(v·m)", {"pp": lay.pp, "v": v, "m": m}, unit="of ideal time")


def _comm_terms(cfg, lay: Layout, inputs: PlanInputs, stages, m: int,
                asm: Assumptions = Assumptions()) -> tuple[Term, ...]:
    """Bytes sent per rank per step, by mesh dimension (ring collectives: (n−1)/n of the buffer)."""
    a, p = _bytes(cfg.compute_dtype), _bytes(cfg.compute_dtype)
    H, S, b = cfg.hidden_size, cfg.seq_length, inputs.local_batch_size
    peak = max(stages, key=lambda s: s.total)
    n = _stage_param_counts(cfg, lay, list(peak.layers), peak.stage == 0, peak.stage == lay.pp - 1)
    dense, experts = n["dense"] + n["embedding"] + n["output"], n["experts"]
    fsdp, efsdp = lay.dp_shard * lay.cp, _expert_shards(lay, asm.experts_tp)
    ring = lambda k: (k - 1) / k if k > 1 else 0.0  # noqa: E731
    if asm.zero1:  # the distributed optimizer: fp32 grads reduce-scattered and bf16 params all-gathered once a step
        fsdp, efsdp = (1, 1) if lay.dp_shard == 1 else (fsdp, efsdp)
        fs = (4 + p) * (dense * ring(fsdp) + experts * ring(efsdp))
        out = [Term("comm fsdp", fs, "(4 + p)·(N_dense·(F−1)/F + N_exp·(Fe−1)/Fe)  [distributed optimizer: once a "
                    "step, not per micro-batch]", {"N_dense": int(dense), "N_exp": int(experts), "F": fsdp, "Fe": efsdp})]
    else:
        gathers = 1 if inputs.reshard_policy == "never" or (inputs.reshard_policy == "default" and lay.pp > 1) else 2
        fs = m * (gathers * p + 4) * (dense * ring(fsdp) + experts * ring(efsdp))
        out = [Term("comm fsdp", fs, "m·(gathers·p + 4)·(N_dense·(F−1)/F + N_exp·(Fe−1)/Fe)",
                    {"m": m, "gathers": gathers, "N_dense": int(dense), "N_exp": int(experts), "F": fsdp, "Fe": efsdp})]
    R = lay.dp_replicate
    out.append(Term("comm dp_replicate", 2 * ring(R) * 4 * (dense / fsdp + experts / efsdp),
                    "2·(R−1)/R·4·(N_dense/F + N_exp/Fe)  [all-reduce of fp32 grad shards]", {"R": R}))
    tokens = b * S / lay.cp
    L_stage = len(peak.layers)
    out.append(Term("comm tp", m * L_stage * 8 * ring(lay.tp) * tokens * H * a,
                    "m·layers·8·(tp−1)/tp·tokens·H·a  [SP all-gather/reduce-scatter ×2, fwd+bwd]",
                    {"m": m, "layers": L_stage, "tp": lay.tp, "tokens": tokens, "H": H, "a": a}))
    kv = 2 * (cfg.kv_lora_rank + cfg.qk_rope_head_dim if F._is_mla(cfg) else cfg.num_query_groups() * cfg.kv_channels())
    out.append(Term("comm cp", m * L_stage * 3 * (lay.cp - 1) * tokens * kv * a / lay.tp,
                    "m·layers·3·(cp−1)·tokens·kv_width·a/tp  [ring K/V pass fwd, K/V + grads bwd]",
                    {"cp": lay.cp, "kv_width": kv}))
    out.append(Term("comm pp", (2 * m * lay.interleave * tokens * H * a / lay.tp) if lay.pp > 1 else 0.0,
                    "2·m·v·tokens·H·a/tp  [activation send fwd, grad send bwd]", {"pp": lay.pp, "v": lay.interleave}))
    n_moe = sum(1 for i in peak.layers if cfg.moe_layer_pattern()[i])
    K = getattr(cfg, "num_experts_per_tok", 0)
    out.append(Term("comm ep", m * n_moe * 4 * ring(lay.ep) * tokens / lay.tp * K * H * a,
                    "m·moe_layers·4·(ep−1)/ep·tokens/tp·K·H·a  [all-to-all dispatch+combine, fwd+bwd]",
                    {"ep": lay.ep, "moe_layers": n_moe, "K": K}))
    return tuple(out)


def _step_time(flops: Term, bubble: Term, comm, lay: Layout, recompute: str, tflops: float | None,
               gbps: float | None) -> Term | None:
    if not tflops:
        return None
    factor = {"full": 4 / 3, "selective": 1.03}.get(recompute, 1.0)
    compute = flops.value * factor / (lay.world * tflops * 1e12) * (1 + bubble.value)
    comm_bytes = sum(t.value for t in comm)
    comm_s = comm_bytes / (gbps * 1e9 / 8) if gbps else 0.0
    return Term("step time", compute + comm_s,
                "flops·recompute/(world·TFLOPs)·(1 + bubble) + comm_bytes/(Gbps/8)  [no overlap: upper bound]",
                {"recompute_factor": round(factor, 3), "device_tflops": tflops, "link_gbps": gbps,
                 "compute_s": round(compute, 4), "comm_s": round(comm_s, 4)}, unit="s")
