"""Hardware presets (vendors' published peaks) and the step time / tokens per second they give a layout.

The time model: the model FLOPs of a step (flops.py, Megatron's formula) split into the attention core (the S²
part) and the rest, each at a sustained fraction of the device's bf16 peak that the framework's profile holds
(memory.Assumptions: fitted on mftk/plan/references.py), times the recompute factor and the pipeline bubble,
plus the communication that sits on the critical path (TP, CP and PP inside a node over its links; FSDP/DP
only the part that compute does not hide).
"""
from __future__ import annotations

from typing import Any

import attrs

from mftk.errors import InputError


@attrs.frozen(kw_only=True)
class Hardware:
    """Published peaks of one device (dense, without sparsity) and its links."""

    name: str
    bf16_tflops: float
    intra_gbps: float          # device-to-device inside a node, one direction, Gbit/s
    inter_gbps: float          # per device across nodes, Gbit/s
    per_node: int = 8
    memory: str = ""
    source: str = ""


PRESETS: dict[str, Hardware] = {
    # NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity (989.5 dense), NVLink 900 GB/s
    # (450 GB/s each way); DGX H100: one 400 Gb/s ConnectX-7 port per GPU
    "h100-sxm": Hardware(name="h100-sxm", bf16_tflops=989.5, intra_gbps=3600, inter_gbps=400, memory="80GB",
                         source="NVIDIA H100 datasheet; DGX H100 user guide"),
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16 1,979 TFLOPS with sparsity, 141 GB, NVLink 900 GB/s
    "h200-sxm": Hardware(name="h200-sxm", bf16_tflops=989.5, intra_gbps=3600, inter_gbps=400, memory="141GB",
                         source="NVIDIA H200 datasheet"),
    # NVIDIA A100 Tensor Core GPU datasheet (SXM): BF16 312 TFLOPS dense, NVLink 600 GB/s; DGX A100: 200 Gb/s HDR
    "a100-sxm": Hardware(name="a100-sxm", bf16_tflops=312.0, intra_gbps=2400, inter_gbps=200, memory="80GB",
                         source="NVIDIA A100 datasheet; DGX A100 user guide"),
    # Huawei Ascend 910 (Atlas 300T training card model 9000 white paper; Atlas 900 launch, 2019): 256 TFLOPS FP16;
    # the Atlas 900 cluster's 100G Ethernet per port (intra-node HCCS has no published figure: the same is assumed)
    "ascend-910": Hardware(name="ascend-910", bf16_tflops=256.0, intra_gbps=100, inter_gbps=100, memory="32GB",
                           source="Huawei Atlas 300T (model 9000) white paper; Atlas 900 launch"),
}


def preset(name: str) -> Hardware:
    if name not in PRESETS:
        raise InputError(message=f"unknown hardware preset {name!r}", hint=f"use one of: {', '.join(PRESETS)}")
    return PRESETS[name]


def attention_flops(cfg: Any, tokens: float) -> float:
    """The S² part of the model FLOPs (flops.py `_attention_flops_per_token`'s q·S term, 6·nh·hd·S per token per
    layer): it runs in the attention kernel, at its own rate."""
    from mftk.plan import flops as F

    if F._is_mla(cfg) or F._v4.is_v4(cfg):  # DeepSeek-V4's sparse attention: counted with the matmuls (width 0)
        nh = cfg.num_attention_heads
        width = nh * ((cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) + cfg.v_head_dim) / 2 if F._is_mla(cfg) else 0
    else:
        width = cfg.num_attention_heads * cfg.kv_channels()
    layers = cfg.num_hidden_layers + cfg.mtp_num_layers()
    return 6.0 * width * cfg.seq_length * layers * tokens


def step_time(est: Any, inputs: Any, hw: Hardware, asm: Any, *, float8: bool = False,
              compiled: bool = False) -> dict[str, float]:
    """Seconds of one step on ``hw`` under the profile ``asm``: compute, exposed communication and their sum."""
    lay, cfg = est.layout, inputs.model
    tokens = inputs.global_batch_size * cfg.seq_length
    total = est.flops.value
    attn = min(attention_flops(cfg, tokens), total)
    recompute = {"full": 4 / 3, "selective": asm.selective_factor}.get(inputs.recompute if lay.world > 1 else "none",
                                                                       1.0)
    peak = hw.bf16_tflops * 1e12 * (asm.compile_speedup if compiled else 1.0)
    mm_rate = peak * asm.matmul_efficiency * (asm.float8_speedup if float8 else 1.0)
    compute = recompute * ((total - attn) / mm_rate + attn / (peak * asm.attention_efficiency))
    compute = compute / lay.world * (1 + est.bubble.value)
    comm = {t.name.removeprefix("comm "): t.value for t in est.comm}
    nodes = max(lay.world // hw.per_node, 1)
    inside = (comm["tp"] + comm["cp"]) * (4 / 3 if recompute > 1.2 else 1.0)   # full recompute repeats the forward's
    pp_link = hw.intra_gbps if lay.pp == 1 or nodes == 1 else hw.inter_gbps
    critical = inside / (hw.intra_gbps * 1e9 / 8) + comm["pp"] / (pp_link * 1e9 / 8)
    ep_link = hw.intra_gbps if lay.ep * lay.tp <= hw.per_node else hw.inter_gbps
    critical += comm["ep"] / (ep_link * 1e9 / 8)
    data_link = hw.inter_gbps if nodes > 1 else hw.intra_gbps
    hidden = (comm["fsdp"] + comm["dp_replicate"]) / (data_link * 1e9 / 8)       # overlapped with compute
    return {"compute_s": compute, "exposed_comm_s": critical + max(hidden - compute, 0.0),
            "step_s": compute + critical + max(hidden - compute, 0.0)}


def step_term(est: Any, inputs: Any, hw: Hardware, asm: Any) -> Any:
    """`step_time` as the estimate's explainable "step time" term (a plan's ranking key)."""
    from mftk.plan.memory import Term

    t = step_time(est, inputs, hw, asm)
    return Term("step time", t["step_s"],
                "recompute·(F_mm/(P·e_mm) + F_attn/(P·e_attn))/world·(1 + bubble) + exposed comm  "
                f"[{hw.name}: P = {hw.bf16_tflops:g} TFLOP/s bf16 ({hw.source}); e from --profile {asm.name}]",
                {"e_mm": asm.matmul_efficiency, "e_attn": asm.attention_efficiency,
                 "intra_gbps": hw.intra_gbps, "inter_gbps": hw.inter_gbps,
                 "compute_s": round(t["compute_s"], 4), "exposed_comm_s": round(t["exposed_comm_s"], 4),
                 "tokens_per_s_per_device": round(inputs.global_batch_size * inputs.model.seq_length
                                                  / est.layout.world / t["step_s"], 1)}, unit="s")


def tokens_per_s(est: Any, inputs: Any, hw: Hardware, asm: Any, *, float8: bool = False,
                 compiled: bool = False) -> float:
    """Tokens per second per device of the step `step_time` estimates."""
    t = step_time(est, inputs, hw, asm, float8=float8, compiled=compiled)["step_s"]
    return inputs.global_batch_size * inputs.model.seq_length / est.layout.world / t
