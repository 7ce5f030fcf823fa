"""Published training runs on real accelerators, and how far the planner's profiles are from each.

Every row is a run whose peak memory per device (and, where published, its throughput) someone measured and
published, with the mftk YAML that describes it (`yaml`). Each framework sub-profile (`megatron`, `torchtitan`;
memory.PRESETS) is checked against its framework's rows, and the default `accelerator` profile, which is Megatron-core's
accounting (memory.ACCELERATOR), against the Megatron-core rows; a plan prints the measured error of the profile it
used beside its estimate (`profile_error`) instead of asking to be trusted.

What each source measured, which the estimate models:
- torchtitan's benchmark files: ``memory`` is torch's max *reserved* memory (the caching allocator's segments,
  torchtitan/components/metrics.py ``max_reserved_gib``), the maximum over all GPUs; TPS/GPU at one iteration.
- Megatron-LM's functional-test goldens: ``mem-max-allocated-bytes`` is torch's max *allocated* memory
  (``torch.cuda.memory_stats()['allocated_bytes.all.peak']``, megatron/training/training.py) written by the
  TensorBoard writer, the last rank (``args.rank == world_size - 1``): the last pipeline stage.
- mbridge's memory-estimator README (ISEEKYAN/mbridge, Megatron-core, a third publisher): the author's measured
  model states plus activations ("Real") of a 4-layer Mixtral-style MoE on one 8-GPU node; no PP, so every rank
  holds the same.

Rows marked ``fit`` set the profiles' fitted constants (the allocator reserve, Megatron's persistent overhead,
the compute efficiencies); the others are held out and reported separately (`profile_error(held_out=True)`).

Examined and left out, so the table is not read as the whole picture: torchtitan's Llama-3.1-405B runs (same
file, Tables 5 and 6: FSDP 8 · TP 8 · PP 8 over 126 layers, full AC, Float8). The torchtitan profile estimates
0.39-0.64 of their published memory (FSDP under pipeline parallelism keeps what it does not model: gradients
unsharded across micro-batches, the schedule's stage buffers; the published 1F1B peak is above the interleaved
one, the opposite of the warm-up arithmetic), while its tokens/s are 1.00-1.09 of the four CP runs' and
1.27-1.63 of the 1F1B / interleaved ones'. Trainy's and torchtitan's async-TP table is an image (no numbers).
NVIDIA-NeMo/Megatron-Bridge skills/nemo-mbridge-perf-memory-tuning/SKILL.md ("Measured Results": Llama-3 70B SFT on
32 H100, FP8 current scaling, seq 4096, MBS 1, GBS 32, interleaved PP, selective core_attn recompute; "Peak Mem (GB)"
58.8 / 53.2 / 50.2 / 60.2 for TP4·PP4·VP5 / TP4·PP8·VP5 / TP8·PP4·VP5 / TP4·PP4·VP10): the megatron profile estimates
1.31-1.37 of three and 1.07 of the TP 8 one. Left out: neither which quantity "Peak Mem" is (allocated or reserved,
which rank) nor the FP8 recipe's buffers (TE-scoped CUDA graphs, FP8 weight copies, packed SFT sequences) are stated,
so the rows cannot be written as an mftk YAML whose estimate means the same thing.
"""
from __future__ import annotations

from typing import Any

import attrs

from mftk.derive import Layout
from mftk.plan.memory import GiB, PlanInputs, estimate, preset

_TT = "pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md"
_TY = "pytorch/torchtitan benchmarks/llama3_8b_h200_2025-06_torchtitan.md (Trainy)"
_MG = "NVIDIA/Megatron-LM tests/functional_tests/test_cases/"
_MB = "ISEEKYAN/mbridge memory_estimator/README.md ('Some result comparison')"


@attrs.frozen(kw_only=True)
class Reference:
    """One published run: its mftk YAML, its hardware and what was measured."""

    key: str
    source: str                     # repository + file (+ table / row)
    kind: str                       # dense / MoE
    framework: str                  # the sub-profile that models it
    hardware: str | None            # a key of hardware.PRESETS; None: the source does not name the GPU (memory only)
    world: int
    yaml: dict[str, Any]            # model / training / parallelism / recompute sections, as mftk reads them
    measured_gib: float             # peak memory per device, GiB (what `measures` says)
    measures: str                   # which quantity the source published
    stage: str = "max"              # "max": the largest stage; "last": the last pipeline stage (Megatron's writer)
    resident_bytes: float | None = None  # Megatron's mem-allocated-bytes after a step (states + persistent buffers)
    tokens_per_s: float | None = None  # per device, as published
    float8: bool = False            # torchao Float8 linears (matmul rate; memory as bf16)
    compiled: bool = False          # torch.compile on the blocks
    compiled_loss: bool = False     # the loss compiled too (torchtitan's `training.compile` in 2025: loss.py)
    qk_norm: bool = False           # the model normalises q/k (Llama and GPT do not; mftk's qwen3 family does)
    speed_note: str = ""            # why a published time is not compared (when it is not)
    fit: bool = False               # used to fit the profiles' constants (else held out)


def _llama(size: str, seq: int) -> dict[str, Any]:
    """Llama 3.1 shapes (meta-llama/Llama-3.1-8B / -70B config.json), as an mftk qwen3 `model:` section."""
    shapes = {"8B": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, intermediate_size=14336),
              "70B": dict(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, intermediate_size=28672)}
    return dict(model_type="qwen3", vocab_size=128256, num_key_value_heads=8, head_dim=128, seq_length=seq,
                rope_theta=500000.0, hidden_dropout=0.0, tie_word_embeddings=False, compute_dtype="bfloat16",
                use_flash_attention=True, **shapes[size])


def _gpt345m(vocab: int, *, moe: bool, flash: bool) -> dict[str, Any]:
    """Megatron-LM's functional-test GPT (model_config.yaml: 12 layers, hidden 512, 8 heads, seq 1024, GeLU MLP of
    4·H, LayerNorm, tied embeddings, dropout 0.1); the vocabulary is GPT-2's 50257 padded to 128·tp."""
    base = dict(vocab_size=vocab, hidden_size=512, num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=8,
                head_dim=64, seq_length=1024, hidden_act="gelu", gated_linear_unit=False, tie_word_embeddings=True,
                hidden_dropout=0.1, attention_dropout=0.1, compute_dtype="bfloat16",
                embedding_params_dtype="bfloat16", use_flash_attention=flash)
    if moe:  # --num-experts 4 --moe-router-topk 1 --disable-bias-linear: every layer's MLP is 4 experts of 4·H
        return dict(model_type="qwen3_moe", num_experts=4, num_experts_per_tok=1, moe_intermediate_size=2048,
                    intermediate_size=2048, add_bias_linear=False, **base)
    return dict(model_type="qwen3", intermediate_size=2048, add_bias_linear=True, **base)


def _mixtral_small() -> dict[str, Any]:
    """The "Mixtral-8x2B with reduced layers" of mbridge's memory-estimator README, read from the module tree it
    prints (TP 1): 4 layers, hidden 2048, word embeddings 65,536,000 = 32000 × 2048 and an untied output layer,
    linear_qkv 2048 → 4096 (16 query heads of 128, 8 KV heads), 8 experts whose linear_fc1 is 2048 × 2·5440
    (SwiGLU), RMSNorm, TEDotProductAttention (fused); top-2 routing is Mixtral's (the tree does not print it)."""
    return dict(model_type="qwen3_moe", vocab_size=32000, hidden_size=2048, num_hidden_layers=4, num_attention_heads=16,
                num_key_value_heads=8, head_dim=128, seq_length=4096, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=5440, intermediate_size=5440, tie_word_embeddings=False, hidden_dropout=0.0,
                compute_dtype="bfloat16", use_flash_attention=True)


def _yaml(model: dict, *, lbs: int, gbs: int, recompute: str | None, **par: Any) -> dict[str, Any]:
    out = {"model": model, "training": {"local_batch_size": lbs, "global_batch_size": gbs},
           "parallelism": {"data_parallel_shard": -1, "tensor_parallel": 1, "context_parallel": 1,
                           "pipeline_parallel": 1, "expert_parallel": 1, **par}}
    out["parallelism"]["sequence_parallel"] = out["parallelism"]["tensor_parallel"] > 1
    if recompute == "full":  # every layer (MindSpore Transformers' full_recompute_layer list)
        out["recompute"] = {"mode": "full", "full_recompute_layer": [f"0-{model['num_hidden_layers'] - 1}"]}
    elif recompute == "select":  # the nearest MF selection: the attention core (torchtitan's per-op SAC: the profile)
        out["recompute"] = {"mode": "select",
                            "select_module": {"*core_attention": [f"0-{model['num_hidden_layers'] - 1}"]}}
    return out


_MB_MEM = ("the author's measured 'Real' = 'Real Model' (weights + grads + optimizer) + 'Real act.', in the "
           "estimator's GB (MiB/1024); the table's 'Allocated/GB' is not the peak (7.96 < Real 8.0 at TP 2, MBS 2)")
_MB_NOTE = "8 GPUs of one node (model not stated); distributed optimizer (the README's 6 + 12/dp bytes per param)"
_MG_SPEED = ("--deterministic-mode and --timing-log-level 2 on a 12-layer H512 model: the iteration time is "
             "launch- and sync-bound, not a throughput of the hardware")
_TT_MEM = "torch max reserved, max over GPUs"
_MG_MEM = "torch max allocated (mem-max-allocated-bytes), last rank"

REFERENCES: tuple[Reference, ...] = (
    # torchtitan, end of 2024, Grand Teton H100 (96 GB HBM2e, 500 W), Llama 3.1, selective AC = per-op SAC
    Reference(key="tt-8b-fsdp8", source=_TT + " Table 1 (FSDP)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=8, yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=16, recompute="select"),
              measured_gib=82.4, measures=_TT_MEM, tokens_per_s=5762, fit=True),
    Reference(key="tt-8b-fsdp8-compile", source=_TT + " Table 1 (FSDP + torch.compile)", kind="dense",
              framework="torchtitan", hardware="h100-sxm", world=8,
              yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=16, recompute="select"),
              measured_gib=77.0, measures=_TT_MEM, tokens_per_s=6667, compiled=True),
    Reference(key="tt-8b-fsdp128", source=_TT + " Table 3 (FSDP)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=128, yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=256, recompute="select"),
              measured_gib=67.0, measures=_TT_MEM, tokens_per_s=5605),
    Reference(key="tt-8b-fsdp128-compile", source=_TT + " Table 3 (FSDP + torch.compile)", kind="dense",
              framework="torchtitan", hardware="h100-sxm", world=128,
              yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=256, recompute="select"),
              measured_gib=62.0, measures=_TT_MEM, tokens_per_s=6514, compiled=True, fit=True),
    Reference(key="tt-8b-cp1-32k", source=_TT + " Table 2 (FSDP 8, CP 1)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=8, yaml=_yaml(_llama("8B", 32768), lbs=1, gbs=8, recompute="full"),
              measured_gib=83.9, measures=_TT_MEM, tokens_per_s=3890, float8=True, compiled=True, fit=True),
    Reference(key="tt-8b-cp2-64k", source=_TT + " Table 2 (FSDP 4, CP 2)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=8,
              yaml=_yaml(_llama("8B", 65536), lbs=1, gbs=4, recompute="full", context_parallel=2),
              measured_gib=84.2, measures=_TT_MEM, tokens_per_s=2540, float8=True, compiled=True),
    Reference(key="tt-8b-cp4-128k", source=_TT + " Table 2 (FSDP 2, CP 4)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=8,
              yaml=_yaml(_llama("8B", 131072), lbs=1, gbs=2, recompute="full", context_parallel=4),
              measured_gib=84.0, measures=_TT_MEM, tokens_per_s=1071, float8=True, compiled=True),
    Reference(key="tt-8b-cp8-256k", source=_TT + " Table 2 (FSDP 1, CP 8)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=8,
              yaml=_yaml(_llama("8B", 262144), lbs=1, gbs=1, recompute="full", context_parallel=8),
              measured_gib=84.5, measures=_TT_MEM, tokens_per_s=548, float8=True, compiled=True, fit=True),
    Reference(key="tt-70b-fsdp32-tp8", source=_TT + " Table 4 (2D)", kind="dense", framework="torchtitan",
              hardware="h100-sxm", world=256,
              yaml=_yaml(_llama("70B", 8192), lbs=16, gbs=512, recompute="full", tensor_parallel=8),
              measured_gib=71.9, measures=_TT_MEM, tokens_per_s=829, float8=True, compiled=True),
    # Trainy, June 2025, H200 (141 GB), llama3_8b.toml (selective op SAC) + --training.local_batch_size=2,
    # --training.compile, --model.converters=float8 with float8 FSDP all-gather
    Reference(key="ty-8b-h200-fsdp32", source=_TY + " (NUM_NODES 4)", kind="dense", framework="torchtitan",
              hardware="h200-sxm", world=32, yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=64, recompute="select"),
              measured_gib=47.96, measures=_TT_MEM, tokens_per_s=10938, float8=True, compiled=True,
              compiled_loss=True),
    Reference(key="ty-8b-h200-fsdp64", source=_TY + " (NUM_NODES 8)", kind="dense", framework="torchtitan",
              hardware="h200-sxm", world=64, yaml=_yaml(_llama("8B", 8192), lbs=2, gbs=128, recompute="select"),
              measured_gib=46.97, measures=_TT_MEM, tokens_per_s=10753, float8=True, compiled=True,
              compiled_loss=True),
    # Megatron-LM functional tests (8 GPUs, one node), bf16, Adam, GPT-3-style 12-layer model
    Reference(key="mg-gpt-tp1-pp4", kind="dense", framework="megatron", hardware="h100-sxm", world=8,
              source=_MG + "gpt/gpt3_345m_nightly_dgx_a100_1N8G_mcore_tp1_pp4/golden_values_dev_dgx_h100.json",
              yaml=_yaml(_gpt345m(50304, moe=False, flash=False), lbs=4, gbs=32, recompute=None,
                         data_parallel_shard=1, pipeline_parallel=4, pipeline_parallel_schedule="1f1b"),
              measured_gib=2744478720 / GiB, resident_bytes=777900032, measures=_MG_MEM,
              stage="last", speed_note=_MG_SPEED, fit=True),
    Reference(key="mg-gpt-dp8-distopt", kind="dense", framework="megatron", hardware="a100-sxm", world=8,
              source=_MG + "gpt/gpt3_345m_nightly_dgx_a100_1N8G_mcore_tp1_pp1_dist_optimizer_overlap_grad_reduce_"
                           "param_gather/golden_values_dev.json",
              yaml=_yaml(_gpt345m(50304, moe=False, flash=False), lbs=4, gbs=32, recompute=None),
              measured_gib=4735983616 / GiB, resident_bytes=615042560, measures=_MG_MEM,
              stage="last", speed_note=_MG_SPEED),
    Reference(key="mg-moe-tp2-pp2-ep2", kind="MoE", framework="megatron", hardware="h100-sxm", world=8,
              source=_MG + "moe/gpt3_345m_nightly_dgx_a100_1N8G_mcore_tp2_pp2_ep2_te_4experts2parallel/"
                           "golden_values_dev_dgx_h100.json",
              yaml=_yaml(_gpt345m(50432, moe=True, flash=False), lbs=4, gbs=32, recompute=None,
                         data_parallel_shard=1, tensor_parallel=2, pipeline_parallel=2, expert_parallel=2,
                         pipeline_parallel_schedule="1f1b"),
              measured_gib=2085503488 / GiB, resident_bytes=659346432, measures=_MG_MEM,
              stage="last", speed_note=_MG_SPEED),
    Reference(key="mg-moe-tp2-cp2-pp2-ep2", kind="MoE", framework="megatron", hardware="h100-sxm", world=8,
              source=_MG + "moe/gpt3_345m_nightly_dgx_a100_1N8G_mcore_tp2_cp2_pp2_ep2_te_4experts2parallel/"
                           "golden_values_dev_dgx_h100.json",
              yaml=_yaml(_gpt345m(50432, moe=True, flash=True), lbs=4, gbs=32, recompute=None,
                         data_parallel_shard=1, tensor_parallel=2, context_parallel=2, pipeline_parallel=2,
                         expert_parallel=2, pipeline_parallel_schedule="1f1b"),
              measured_gib=1103012352 / GiB, resident_bytes=627718144, measures=_MG_MEM,
              stage="last", speed_note=_MG_SPEED, fit=True),
    # mbridge's memory estimator (Megatron-core), a third publisher: 8 GPUs, seq 4096, no recompute, distributed
    # optimizer over dp = 8/tp, EP 1 (the TP 1 tree holds all 8 experts); held out (nothing is fitted on them);
    # the global batch is not stated (one micro-batch here: without PP it does not change the peak)
    *(Reference(key=f"mb-mixtral-4l-tp{tp}-mbs{mbs}", source=f"{_MB} row TP {tp}, MBS {mbs}", kind="MoE",
                framework="megatron", hardware=None, world=8,
                yaml=_yaml(_mixtral_small(), lbs=mbs, gbs=mbs * 8 // tp, recompute=None, tensor_parallel=tp),
                measured_gib=real, measures=_MB_MEM, speed_note=_MB_NOTE)
      for tp, mbs, real in ((2, 1, 6.6), (2, 2, 8.0), (1, 1, 11.2), (1, 2, 13.8))),
)


# ----------------------------------------------------------------------------- building a row's estimate

COMPILED_LOSS_BYTES = 4.0  # torch.compile'd cross_entropy(pred.float()): the saved bf16 logits + their bf16 grad


def model_config(ref: Reference) -> Any:
    """The row's `model:` section as the planner's config object (built without the engine's support checks:
    planning covers models mftk's engine does not train, e.g. GeLU or non-gated MLPs)."""
    from mftk.config.model import Qwen3ModelConfig, Qwen3MoeModelConfig

    data = dict(ref.yaml["model"])
    cls = Qwen3MoeModelConfig if data["model_type"] == "qwen3_moe" else Qwen3ModelConfig
    names = {f.name for f in attrs.fields(cls)}
    cfg = cls(**{k: v for k, v in data.items() if k in names})
    if not ref.qk_norm:
        cfg = _NoQkNorm(cfg)
    return cfg


class _NoQkNorm:
    """A model config seen without q/k norms (Llama, GPT): every other attribute is the wrapped config's."""

    def __init__(self, cfg: Any) -> None:
        self._cfg = cfg

    def qk_layernorm(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cfg, name)


def layout(ref: Reference) -> Layout:
    """The row's layout (data_parallel_shard −1: every data-parallel rank shards, as in the reference's §2.2)."""
    par = ref.yaml["parallelism"]
    tp, pp, cp = par["tensor_parallel"], par["pipeline_parallel"], par["context_parallel"]
    dp = ref.world // (tp * pp * cp)
    shard = dp if par["data_parallel_shard"] == -1 else par["data_parallel_shard"]
    return Layout(world=ref.world, tp=tp, pp=pp, cp=cp, ep=par["expert_parallel"], dp_replicate=dp // shard,
                  dp_shard=shard, interleave=par.get("pipeline_parallel_interleave_num", 1))


def plan_inputs(ref: Reference) -> PlanInputs:
    t, par = ref.yaml["training"], ref.yaml["parallelism"]
    mode = str((ref.yaml.get("recompute") or {}).get("mode", "none")).lower()
    return PlanInputs(model=model_config(ref), local_batch_size=t["local_batch_size"],
                      global_batch_size=t["global_batch_size"],
                      schedule=par.get("pipeline_parallel_schedule", "1f1b"),
                      recompute={"select": "selective"}.get(mode, mode),
                      sequence_parallel=par["sequence_parallel"],
                      layers_per_stage=par.get("pipeline_parallel_layers_per_stage", "auto"))


@attrs.frozen
class RowResult:
    ref: Reference
    estimated_gib: float
    estimated_tokens_per_s: float | None

    @property
    def memory_ratio(self) -> float:
        return self.estimated_gib / self.ref.measured_gib

    @property
    def speed_ratio(self) -> float | None:
        if self.estimated_tokens_per_s is None or not self.ref.tokens_per_s:
            return None
        return self.estimated_tokens_per_s / self.ref.tokens_per_s


def evaluate(ref: Reference, profile: str | None = None) -> RowResult:
    """The planner's estimate of one published run (memory of the stage that was measured; tokens/s per device)
    under ``profile`` (default: the row's own framework sub-profile)."""
    from mftk.plan import hardware as HW

    asm = preset(profile or ref.framework)
    if ref.compiled_loss:  # inductor saves the bf16 logits and recomputes the softmax: bf16 input + bf16 grad
        asm = attrs.evolve(asm, loss_bytes=COMPILED_LOSS_BYTES)
    lay, inputs = layout(ref), plan_inputs(ref)
    est = estimate(lay, inputs, asm)
    stage = est.stages[-1] if ref.stage == "last" else est.peak
    speed = None
    if ref.tokens_per_s and not ref.speed_note:
        speed = HW.tokens_per_s(est, inputs, HW.preset(ref.hardware), asm, float8=ref.float8,
                                compiled=ref.compiled)
    return RowResult(ref, stage.total / GiB, speed)


FRAMEWORKS = ("megatron", "torchtitan")  # the sub-profiles the rows are measured with
ALIASES = {"accelerator": "megatron"}    # the default profile is Megatron-core's accounting (memory.ACCELERATOR)


def rows_for(profile: str) -> tuple[Reference, ...]:
    """The rows a profile is measured on: a framework sub-profile (or the default `accelerator`, Megatron-core's
    accounting) its own framework's runs, `generic` every row, the CPU profile none."""
    if profile == "generic":
        return REFERENCES
    return tuple(r for r in REFERENCES if r.framework == ALIASES.get(profile, profile))


def results(profile: str | None = None) -> list[RowResult]:
    """Every row under its own sub-profile; or the rows of ``profile``, each estimated under ``profile``."""
    if profile is None:
        return [evaluate(r) for r in REFERENCES]
    return [evaluate(r, profile) for r in rows_for(profile)]


@attrs.frozen
class ProfileError:
    """The measured error of a profile on the reference rows (estimate / published − 1)."""

    profile: str
    runs: int
    low: float
    high: float
    speed_runs: int
    speed_low: float | None
    speed_high: float | None
    publishers: tuple[str, ...] = ()  # the repositories whose runs these are

    def line(self) -> str:
        if not self.runs:
            return (f"{self.profile} profile: not measured on published accelerator runs (mftk's CPU engine: "
                    "bench/plan_calibration.py)")
        text = (f"{self.profile} profile: peak memory within {_span(self.low, self.high)} of {self.runs} "
                f"published runs ({', '.join(self.publishers)})")
        if self.speed_runs:
            text += f"; tokens/s within {_span(self.speed_low, self.speed_high)} of {self.speed_runs}"
        else:
            text += "; tokens/s not measured (none of these runs published a usable throughput)"
        return text

    def to_dict(self) -> dict:
        return attrs.asdict(self)


def error_lines(profile: str) -> tuple[str, ...]:
    """What a plan prints under its table: the measured error of the profile it used, on the rows that profile
    applies to; under the default `accelerator` (Megatron-core's accounting) also the torchtitan sub-profile's,
    the one to pick for an FSDP2 cluster."""
    own = profile_error(profile)
    if not own.runs:
        return (own.line(),)
    if profile != "accelerator":
        return (own.line() + " (mftk/plan/references.py)",)
    head = own.line().replace("accelerator profile:", "accelerator profile (Megatron-core accounting, = megatron):")
    return (head + " (mftk/plan/references.py)",
            "  an FSDP2 cluster: --profile " + profile_error("torchtitan").line().replace(" profile:", ":"))


def _span(low: float, high: float) -> str:
    """An error range, "−4% to +1%" (words, not an ellipsis: a narrow terminal's truncation mark is "…")."""
    return f"{_pct(low)} to {_pct(high)}"


def _pct(x: float) -> str:
    return "0%" if round(x * 100) == 0 else f"{x:+.0%}".replace("-", "−")


def profile_error(profile: str = "accelerator", *, held_out: bool | None = None,
                  rows: list[RowResult] | None = None) -> ProfileError:
    """``profile``'s error range on the rows it applies to (`rows_for`; computed, never stored); held_out=False only
    the fitted rows, True only the held-out ones."""
    if rows is None:
        rows = results(profile)
    if held_out is not None:
        rows = [r for r in rows if r.ref.fit != held_out]
    mem = [r.memory_ratio - 1 for r in rows]
    speed = [r.speed_ratio - 1 for r in rows if r.speed_ratio is not None]
    publishers = tuple(dict.fromkeys(r.ref.source.split(" ")[0] for r in rows))
    return ProfileError(profile, len(mem), min(mem, default=0.0), max(mem, default=0.0), len(speed),
                        min(speed) if speed else None, max(speed) if speed else None, publishers)
