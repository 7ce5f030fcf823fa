"""The one answer to "is this parallel layout valid and does mftk's engine run it for this model?".

`layout_refusals` is pure (typed model fields + a `Layout` + the few settings that pick how a dimension is
applied); it imports nothing of the engine and nothing of MindSpore. `config.rules` runs it on every load
with the world size (so `validate-config`, `train`, `resume` and every worker refuse the same layouts, at
the YAML path, with the fix), and `plan.search` filters its candidate layouts with it (so `plan-parallel`
never recommends one that `train` refuses). Each refusal carries a rule name (plan-parallel's table of
rejections), the YAML path it is reported at, the message with the arithmetic, and a hint.

What the engine runs (`engine/parallel/parallelize.py`): every combination of DP/FSDP/HSDP, TP with
sequence parallel, EP, CP (colossal, ulysses, hybrid) and PP (1F1B, GPipe, interleaved 1F1B) over the
reference's mesh, for
GQA (Qwen3) and MLA (DeepSeek-V3) attention, dense MLP and MoE layers, MTP, tied embeddings. The
exceptions are refused here with their reason: DeepSeek-V4 takes TP and colossal CP with its own plan
(`_tensor_v4`, `_context_v4`: the attention whole on the gathered sequence; pipeline stages pass its residual
streams, `pipeline_model.StageModel.act_shape`) and Muon's QK-clip where it would rescale split rows (FSDP) or needs
split maxima (TP, CP, PP). Muon itself runs under every dimension: tensor-parallel and FSDP blocks are gathered
into whole matrices for the orthogonalisation (`engine.muon`). Qwen3-MoE is Qwen3's GQA attention
with the shared MoE parts, so it takes the GQA plan and every other dimension.
"""
from __future__ import annotations

import math
from typing import Any

import attrs

from mftk.derive import Layout, accumulation_steps, parse_layer_range, stage_chunks

# attention kinds with a tensor / context parallel plan (engine/parallel/parallelize.py); a family's kind is in
# its row of config/families.py, as are the dimensions besides TP and CP its plan does not cover (parallel_gaps)
PLANNED_ATTENTION = ("gqa", "mla", "csa")

# rule name -> (mesh dimension it constrains, what it says); plan-parallel explains its rejections with these
RULES: dict[str, tuple[str, str]] = {
    "product": ("world", "dp_replicate·dp_shard·cp·tp·pp equals the world size"),
    "batch": ("dp", "global_batch_size divisible by local_batch_size·dp"),
    "tp_needs_sp": ("tp", "tp > 1 needs parallelism.sequence_parallel: true"),
    "tp_family": ("tp", "the model family has a tensor-parallel plan"),
    "tp_heads": ("tp", "num_attention_heads divisible by tp"),
    "tp_kv_heads": ("tp", "num_key_value_heads divisible by tp (GQA)"),
    "tp_mla_q": ("tp", "tensor-parallel MLA needs q_lora_rank"),
    "tp_csa_q": ("tp", "DeepSeek-V4: the query up-projection's rows (heads·v_head_dim) divisible by tp"),
    "tp_ffn": ("tp", "MLP and shared-expert widths divisible by tp"),
    "tp_vocab": ("tp", "vocab_size divisible by tp (vocabulary-parallel embedding and head)"),
    "tp_seq": ("tp", "seq_length divisible by cp·tp (sequence parallel)"),
    "ep_dense": ("ep", "ep > 1 needs routed experts"),
    "ep_experts": ("ep", "n_routed_experts divisible by ep"),
    "ep_domain": ("ep", "ep divides dp_shard·cp·tp"),
    "cp_heads": ("cp", "heads divisible by tp·ulysses degree (ulysses / hybrid)"),
    "cp_family": ("cp", "the model family has a context-parallel plan"),
    "cp_seq": ("cp", "seq_length divisible by cp (2·cp for colossal's load-balanced causal split)"),
    "cp_csa": ("cp", "DeepSeek-V4: colossal context parallel, seq_length/cp divisible by every compress ratio"),
    "pp_layers": ("pp", "num_hidden_layers split over pp·interleave ('auto') or an explicit per-stage list"),
    "pp_order": ("pp", "pipeline stages hold the layers in order"),
    "pp_dropout": ("pp", "hidden_dropout and lora_dropout 0 (pipeline stages recompute their forward)"),
    "pp_interleave": ("pp", "interleaved 1F1B: pp > 1, a 1f1b schedule, micro-batches a multiple of pp"),
    "track_logits": ("tp", "max attention logit tracking only without TP, CP and PP"),
    "family_dims": ("world", "the model family has a plan for this parallel dimension"),
    "muon_qk_clip": ("dp", "Muon's QK-clip without FSDP (it rescales head rows of the fp32 masters)"),
    "device_update": ("world", "mftk.update_on_device: true without pipeline parallel and without Muon"),
}


@attrs.frozen
class Refusal:
    rule: str  # short name, e.g. "tp_heads" (plan-parallel groups its rejections by it)
    path: str  # YAML path the problem is reported at
    message: str
    hint: str = ""


@attrs.frozen(kw_only=True)
class LayoutSettings:
    """The settings besides the degrees that decide whether a layout runs (from ``parallelism:``,
    ``training:`` and the callbacks)."""

    sequence_parallel: bool = True
    cp_method: str = "colossal"
    ulysses_degree: int | None = None  # parallelism.ulysses_degree_in_cp
    layers_per_stage: Any = "auto"
    schedule: str = "1f1b"
    global_batch_size: int = 1
    local_batch_size: int = 1
    rampup: tuple[int, ...] | None = None
    track_max_logits: bool = False
    muon: bool = False  # optimizer.type: Muon
    qk_clip: bool = False  # Muon's QK-clip is active (`optimizer_muon.qk_clip_active`)
    update_on_device: bool | None = None  # mftk.update_on_device (None: by device, `device_update_gaps` decides)
    lora_dropout: float = 0.0  # lora_config.lora_dropout (0 without lora_config)


def settings_of(config: Any, *, track_max_logits: bool = False) -> LayoutSettings:
    """The `LayoutSettings` of a structured config."""
    from mftk.config.optimizer_muon import qk_clip_active

    p, t = config.parallelism, config.training
    return LayoutSettings(sequence_parallel=bool(p.sequence_parallel), cp_method=p.context_parallel_method.lower(),
                          ulysses_degree=p.ulysses_degree_in_cp,
                          layers_per_stage=p.pipeline_parallel_layers_per_stage,
                          schedule=(p.pipeline_parallel_schedule or "1f1b").lower(),
                          global_batch_size=t.global_batch_size, local_batch_size=t.local_batch_size,
                          rampup=tuple(t.rampup_batch_size) if t.rampup_batch_size else None,
                          track_max_logits=track_max_logits, muon=config.optimizer.type == "Muon",
                          qk_clip=qk_clip_active(config), update_on_device=config.mftk.update_on_device,
                          lora_dropout=config.lora_config.lora_dropout if config.lora_config is not None else 0.0)


def ulysses_degree(method: str, cp: int, degree: int | None) -> int:
    """The all-to-all degree inside CP: 1 for colossal, cp for ulysses, ``ulysses_degree_in_cp`` for hybrid."""
    method = method.lower()
    if method == "ulysses":
        return cp
    if method == "hybrid":
        return int(degree or 1)
    return 1


def _family(model: Any) -> Any:
    from mftk.config.families import MODEL_TYPES

    return MODEL_TYPES.get(getattr(model, "model_type", None))


def family_name(model: Any) -> str | None:
    """The family table's name for the model's family (None: no family)."""
    family = _family(model)
    return family.name if family is not None else None


def attention_kind(model: Any) -> str | None:
    """The family's attention kind where a tensor / context parallel plan exists for it; None otherwise.
    DeepSeek-V4's legacy ``mla`` variant has DeepSeek-V3's MLA attention (`DeepseekV4ModelConfig.plain_mla`), so
    the MLA plan applies to it (the rest of its layers follow V4's plan:
    `engine.parallel.parallelize.tensor_parallel_layer`)."""
    family = _family(model)
    if family is None:
        return None
    kind = "mla" if family.attention == "csa" and model.plain_mla() else family.attention
    return kind if kind in PLANNED_ATTENTION else None


def layout_refusals(model: Any, layout: Layout, s: LayoutSettings) -> list[Refusal]:
    """Every reason ``layout`` cannot train ``model`` (empty: it can)."""
    out: list[Refusal] = []
    out += _mesh(layout, s)
    if model is not None:
        out += _tensor(model, layout, s)
        out += _expert(model, layout)
        out += _context(model, layout, s)
        out += _pipeline(model, layout, s)
        out += _family_gaps(model, layout)
    out += _muon(layout, s)
    if s.update_on_device:
        out += device_update_gaps(layout, s)
    if s.track_max_logits and (layout.tp > 1 or layout.cp > 1 or layout.pp > 1):
        found = _tracking_refusal(layout, s)
        if not any(f.path == found.path for f in out):  # QK-clip's FSDP refusal already names its fix
            out.append(found)
    return out


def _tracking_refusal(layout: Layout, s: LayoutSettings) -> Refusal:
    """Max-logit tracking under TP, CP or PP; reported at QK-clip's key when Muon's QK-clip is what asks for it
    (its default is on, so the user may never have asked for tracking)."""
    why = (f"max attention logit tracking with {layout.describe()} is not supported: the tracked maxima would be "
           "split over ranks (heads under TP, queries under CP, layers under PP)")
    if s.qk_clip:
        return Refusal("track_logits", "optimizer.qk_clip_enabled", f"Muon's QK-clip needs {why}",
                       "set optimizer.qk_clip_enabled: false, or tensor_parallel, context_parallel and "
                       "pipeline_parallel to 1")
    return Refusal("track_logits", "model.track_max_attention_logit", why,
                   "turn tracking off, or set tensor_parallel, context_parallel and pipeline_parallel to 1")


def _mesh(lay: Layout, s: LayoutSettings) -> list[Refusal]:
    out = []
    if lay.product != lay.world:
        out.append(Refusal("product", "parallelism",
                           f"dp_replicate·dp_shard·cp·tp·pp = {lay.dp_replicate}·{lay.dp_shard}·{lay.cp}·{lay.tp}·"
                           f"{lay.pp} = {lay.product} ≠ world size {lay.world}",
                           "choose degrees whose product is the world size"))
    block = lay.dp_shard * lay.cp * lay.tp
    if lay.ep > 1 and block % lay.ep:
        out.append(Refusal("ep_domain", "parallelism.expert_parallel",
                           f"expert_parallel must divide dp_shard·cp·tp = {lay.dp_shard}·{lay.cp}·{lay.tp} = {block}"
                           f" (the reference carves EP out of them), got {lay.ep}", "pick a divisor of it"))
    if lay.tp > 1 and not s.sequence_parallel:
        out.append(Refusal("tp_needs_sp", "parallelism.sequence_parallel",
                           f"tensor_parallel={lay.tp} requires sequence_parallel: true",
                           "set parallelism.sequence_parallel: true"))
    out += _batch(lay, s)
    return out


def _family_gaps(m: Any, lay: Layout) -> list[Refusal]:
    """The family's ``parallel_gaps``: the dimensions its parallel plan lacks (TP/CP: `_tensor`, `_context`)."""
    family = _family(m)
    gaps = family.parallel_gaps if family is not None else {}
    return [Refusal("family_dims", f"parallelism.{field}", f"{field}={degree} is not supported for model_type "
                    f"{m.model_type!r} yet: {gaps[dim]}", f"set parallelism.{field}: 1")
            for dim, field, degree in (("ep", "expert_parallel", lay.ep), ("pp", "pipeline_parallel", lay.pp))
            if degree > 1 and dim in gaps]


def _muon(lay: Layout, s: LayoutSettings) -> list[Refusal]:
    """Muon orthogonalises each weight's whole matrix (tensor-parallel and FSDP blocks are gathered for it,
    `engine.muon`); QK-clip (it rescales head rows of the fp32 masters) is refused on FSDP row shards."""
    if s.muon and s.qk_clip and lay.dp_shard > 1:
        return [Refusal("muon_qk_clip", "optimizer.qk_clip_enabled", "Muon's QK-clip with FSDP (data_parallel_shard "
                        f"= {lay.dp_shard}) is not supported yet (it rescales head rows of the fp32 masters, which "
                        "FSDP splits)", "set parallelism.data_parallel_shard: 1 (plain data parallel), or "
                        "qk_clip_enabled: false")]
    return []


# What still crosses between host and device on the device-resident update (`engine.device_path`), per
# micro-batch unless said: no weight, gradient or moment does between saves. Counted by
# tests/engine/test_device_update.py::test_device_path_moves_no_weight_sized_tensor_between_saves, per step of
# 2 micro-batches: tiny Qwen3 7 reads and 16 writes (each at most one micro-batch's seq×seq mask); by the same
# spy, tiny DeepSeek-V3 13 and 42, tiny DeepSeek-V4 (AdamW) 78 and 115. The fused loss kernel reads nothing back.
DEVICE_HOST_TRAFFIC = (
    "the step's scalars: one read per step (losses, aux terms, expert counts, squared norm)",
    "the batch: its columns are written, and the model reads ids, labels and loss_mask back to build its "
    "targets, RoPE and mask on the host (written again)",
    "MoE: the dispatch sorts the tokens by expert on the host (token-sized index arrays each MoE layer)",
    "DeepSeek-V4: the hyper-connections' Sinkhorn and the CSA indexer's top-k run on host numpy (faster there on "
    "CPU), and each attention layer reads the mask back for its host-built bias",
    "FSDP: the unit gathers and gradient reduce-scatters go through host numpy buffers (several processes)",
)


def device_update_gaps(lay: Layout, s: LayoutSettings) -> list[Refusal]:
    """What the device-resident update (`engine.device_optim`) does not run: refused when
    ``mftk.update_on_device: true`` asks for it; with null, a device run takes the host update and logs why.
    What it runs but still moves across the host is `DEVICE_HOST_TRAFFIC` (a note of `validate-config`)."""
    out = []
    if lay.pp > 1:
        out.append(Refusal("device_update", "mftk.update_on_device", f"mftk.update_on_device: true with "
                           f"pipeline_parallel={lay.pp} is not supported yet (the pipeline schedule accumulates its "
                           "gradients on the host)", "set mftk.update_on_device: false (or null), or "
                           "parallelism.pipeline_parallel: 1"))
    if s.muon:
        out.append(Refusal("device_update", "mftk.update_on_device", "mftk.update_on_device: true with "
                           "optimizer.type: Muon is not supported yet (its orthogonalisation runs on the host)",
                           "set mftk.update_on_device: false (or null), or optimizer.type: AdamW"))
    return out


def _batch(lay: Layout, s: LayoutSettings) -> list[Refusal]:
    """Whole accumulation steps ≥ 1 (MindSpore Transformers 2.1.0 refuses a fraction too; earlier releases
    floored it silently); with a ramp-up, its start and its end both divide by dp·local_batch_size."""
    base = lay.dp * s.local_batch_size
    if s.local_batch_size <= 0 or s.global_batch_size <= 0:
        return []
    if s.rampup and len(s.rampup) == 3:
        return [Refusal("batch", "training.rampup_batch_size", f"{name} {value} is not divisible by "
                        f"dp·local_batch_size = {lay.dp}·{s.local_batch_size} = {base}", f"use multiples of {base}")
                for name, value in (("start", s.rampup[0]), ("global_batch_size", s.global_batch_size))
                if value % base]
    steps, text = accumulation_steps(s.global_batch_size, s.local_batch_size, lay.dp)
    if steps is None:
        return [Refusal("batch", "training.global_batch_size", f"num_accumulation_steps = {text}",
                        f"use a multiple of dp·local_batch_size = {base} (MindSpore Transformers 2.1.0 refuses it "
                        "too; earlier releases floored it silently)")]
    return []


def _batch_sizes(s: LayoutSettings) -> list[int]:
    """Every global batch size the run uses: the static one, or each level of a ramp-up."""
    if not s.rampup or len(s.rampup) != 3 or s.rampup[1] <= 0:
        return [s.global_batch_size]
    start, inc = s.rampup[0], s.rampup[1]
    return list(range(start, s.global_batch_size, inc)) + [s.global_batch_size]


def _tensor(m: Any, lay: Layout, s: LayoutSettings) -> list[Refusal]:
    tp = lay.tp
    if tp <= 1:
        return []
    path = "parallelism.tensor_parallel"
    kind = attention_kind(m)
    if kind is None:
        return [Refusal("tp_family", path, f"tensor parallel is not implemented for model_type {m.model_type!r}",
                        "set parallelism.tensor_parallel: 1")]
    out = []

    def need(rule: str, what: str, n: int) -> None:
        if n % tp:
            out.append(Refusal(rule, path, f"{what} % tp = {n} % {tp} = {n % tp}, must be 0",
                               f"pick a tensor_parallel that divides {what} ({n})"))

    if kind == "csa":  # only the query up-projection is split (engine/parallel/parallelize.py, as MF 2.1.0)
        return out + _tensor_v4(m, lay)
    need("tp_heads", "num_attention_heads", m.num_attention_heads)
    if kind == "gqa":
        need("tp_kv_heads", "num_key_value_heads", m.num_query_groups())
    elif not getattr(m, "q_lora_rank", None):
        out.append(Refusal("tp_mla_q", path, "tensor parallel MLA needs q_lora_rank (without it q is projected "
                           "together with the latent kv in one weight, which TP cannot split by heads)",
                           "set model.q_lora_rank, or tensor_parallel: 1"))
    if family_name(m) == "deepseek_v4":  # the mla variant: its MoE as V4's plan (shared experts whole)
        return out + _tensor_common(m, lay)
    pattern = m.moe_layer_pattern()
    if not all(pattern) or not pattern:
        need("tp_ffn", "ffn_hidden_size (intermediate_size)", m.ffn_hidden_size())
    shared = m.moe_shared_expert_intermediate_size_resolved() if m.is_moe() else 0
    if shared:
        need("tp_ffn", "the shared experts' ffn size", shared)
    return out + _tensor_common(m, lay)


def _tensor_v4(m: Any, lay: Layout) -> list[Refusal]:
    """DeepSeek-V4: the attention runs whole on every TP rank but its query up-projection, split by rows
    (mindformers 2.1.0 pynative/base_models/gpt/parallelize.py ``_dsv4_attention_layer_plan`` checks only
    ``query_projection_size`` % tp); the MoE's shared experts stay whole."""
    rows, tp = m.num_attention_heads * m.v_head_dim, lay.tp
    out = []
    if rows % tp:
        out.append(Refusal("tp_csa_q", "parallelism.tensor_parallel", f"DeepSeek-V4 splits its query up-projection's "
                           f"rows over tp: num_attention_heads·v_head_dim % tp = {m.num_attention_heads}·"
                           f"{m.v_head_dim} % {tp} = {rows % tp}, must be 0",
                           f"pick a tensor_parallel that divides {rows}"))
    return out + _tensor_common(m, lay)


def _tensor_common(m: Any, lay: Layout) -> list[Refusal]:
    """Every family under TP: the vocabulary-parallel embedding and head, sequence parallel's blocks."""
    tp, cp, path, out = lay.tp, lay.cp, "parallelism.tensor_parallel", []
    if m.vocab_size % tp:
        out.append(Refusal("tp_vocab", path, f"vocab_size % tp = {m.vocab_size} % {tp} = {m.vocab_size % tp}, "
                           "must be 0", f"pick a tensor_parallel that divides vocab_size ({m.vocab_size})"))
    if m.seq_length % (cp * tp):
        out.append(Refusal("tp_seq", path, f"sequence parallel splits each rank's {m.seq_length // max(cp, 1)} "
                           f"positions over tp: seq_length % (cp·tp) = {m.seq_length} % {cp * tp} = "
                           f"{m.seq_length % (cp * tp)}, must be 0", "pick a tensor_parallel that divides it"))
    return out


def _expert(m: Any, lay: Layout) -> list[Refusal]:
    ep = lay.ep
    if ep <= 1:
        return []
    path = "parallelism.expert_parallel"
    experts = getattr(m, "n_routed_experts", 0) if m.is_moe() else 0
    if not experts:
        return [Refusal("ep_dense", path, f"expert_parallel={ep} but the model has no routed experts",
                        "set parallelism.expert_parallel: 1")]
    if experts % ep:
        return [Refusal("ep_experts", path, f"n_routed_experts % ep = {experts} % {ep} = {experts % ep}, must be 0",
                        "pick an expert_parallel that divides n_routed_experts")]
    return []


def _context(m: Any, lay: Layout, s: LayoutSettings) -> list[Refusal]:
    cp = lay.cp
    if cp <= 1:
        return []
    path = "parallelism.context_parallel"
    out = []
    kind = attention_kind(m)
    if kind is None:
        out.append(Refusal("cp_family", path, f"context parallel is not implemented for model_type {m.model_type!r}",
                           "set parallelism.context_parallel: 1"))
    elif kind == "mla" and family_name(m) == "deepseek_v4":
        return [Refusal("cp_family", path, "context parallel is not implemented for DeepSeek-V4's legacy mla "
                        "variant: its MLA attention would take DeepSeek-V3's plan, but the rest of the V4 layer (the "
                        "hyper-connection streams, the hash-routed MoE's token ids, the MTP layer) has no "
                        "context-parallel plan", "set parallelism.context_parallel: 1")]
    elif kind == "csa":
        return _context_v4(m, lay, s)
    u = ulysses_degree(s.cp_method, cp, s.ulysses_degree)
    factor = cp if u == cp else 2 * cp  # ulysses: contiguous S/cp; colossal and hybrid: 2·cp balanced chunks
    if m.seq_length % factor:
        what = "2·cp (load-balanced causal split)" if factor != cp else "cp"
        out.append(Refusal("cp_seq", path, f"seq_length % {what} = {m.seq_length} % {factor} = "
                           f"{m.seq_length % factor}, must be 0", f"pick a context_parallel with {what} dividing "
                           "seq_length"))
    if u > 1 and cp % u == 0:
        heads = [("num_attention_heads", m.num_attention_heads)]
        if kind == "gqa":
            heads.append(("num_key_value_heads", m.num_query_groups()))
        for what, n in heads:
            if n % (lay.tp * u):
                out.append(Refusal("cp_heads", path, f"{s.cp_method} context parallel splits the heads of each "
                                   f"tensor-parallel rank {u} ways: {what} % (tp·{u}) = {n} % {lay.tp * u} = "
                                   f"{n % (lay.tp * u)}, must be 0", "use context_parallel_method: colossal, or "
                                   "other degrees"))
    return out


def _context_v4(m: Any, lay: Layout, s: LayoutSettings) -> list[Refusal]:
    """DeepSeek-V4 under CP (`engine/parallel/parallelize.whole_sequence_v4_attention`): colossal's positions
    outside the attention, the attention whole on the gathered sequence on every CP rank. MindSpore
    Transformers 2.1.0's CSA context parallel (pynative/distributed/csa_context_parallel.py) splits the
    attention's work instead (each rank's queries, a window halo, the gathered compressed entries cut to its
    causal prefix), and requires each rank's ``S/cp`` positions divisible by the compress ratio
    (``_compressed_prefix_len``, ``two_stage_cp_naive_attention``): the same rule here, so a layout runs in both."""
    cp, path, out = lay.cp, "parallelism.context_parallel", []
    if ulysses_degree(s.cp_method, cp, s.ulysses_degree) > 1:
        out.append(Refusal("cp_csa", "parallelism.context_parallel_method", f"DeepSeek-V4's context parallel "
                           f"runs the attention whole on the gathered sequence on every CP rank: the "
                           f"{s.cp_method} method's head all-to-all does not apply",
                           "use context_parallel_method: colossal"))
    if m.seq_length % (2 * cp):
        out.append(Refusal("cp_seq", path, f"seq_length % 2·cp (load-balanced causal split) = {m.seq_length} % "
                           f"{2 * cp} = {m.seq_length % (2 * cp)}, must be 0",
                           "pick a context_parallel with 2·cp dividing seq_length"))
    layers = m.num_hidden_layers + m.mtp_num_layers()
    ratios = sorted({m.compress_ratio(i) for i in range(layers)} - {0, 1})
    local = m.seq_length // cp
    bad = [r for r in ratios if local % r]
    if bad:
        out.append(Refusal("cp_csa", path, f"each CP rank's seq_length/cp = {m.seq_length}/{cp} = {local} positions "
                           f"must be divisible by every compress ratio ({', '.join(map(str, bad))} does not divide "
                           "it; MindSpore Transformers 2.1.0's CSA context parallel requires it)",
                           "pick a context_parallel (or seq_length) with seq_length/cp a multiple of "
                           f"{math.lcm(*ratios)}"))
    return out


def _pipeline(m: Any, lay: Layout, s: LayoutSettings) -> list[Refusal]:
    pp, v = lay.pp, lay.interleave
    lps = "parallelism.pipeline_parallel_layers_per_stage"
    if pp <= 1:
        if v > 1:
            return [Refusal("pp_interleave", "parallelism.pipeline_parallel_interleave_num",
                            f"pipeline_parallel_interleave_num={v} needs pipeline_parallel > 1",
                            "set pipeline_parallel_interleave_num: 1")]
        return []
    out = []
    layers = m.num_hidden_layers
    split = _stage_split(layers, pp, v, s.layers_per_stage, lps)
    out += split
    chunks = None if split else stage_chunks(layers, pp, v, s.layers_per_stage)
    if chunks is not None and not _in_order(chunks, pp):
        out.append(Refusal("pp_order", lps, f"virtual stage k (chunk c of rank r, k = c·pp + r) must hold the "
                           f"layers after those of stage k−1; {s.layers_per_stage} does not",
                           "list the layers of each stage in pipeline order"))
    if getattr(m, "hidden_dropout", 0.0):
        from mftk.config.support import NOT_IN_ENGINE

        out.append(Refusal("pp_dropout", "model.hidden_dropout", "pipeline parallel recomputes each stage's forward "
                           "in its backward, so hidden_dropout must be 0 (the masks would differ): dropout under "
                           f"pipeline parallel {NOT_IN_ENGINE}",
                           "set model.hidden_dropout: 0.0, or pipeline_parallel: 1"))
    if s.lora_dropout:
        out.append(Refusal("pp_dropout", "lora_config.lora_dropout", "pipeline parallel recomputes each stage's "
                           "forward in its backward, so lora_dropout must be 0 (the masks would differ)",
                           "set lora_config.lora_dropout: 0.0, or pipeline_parallel: 1"))
    if v > 1:
        if s.schedule == "gpipe":
            out.append(Refusal("pp_interleave", "parallelism.pipeline_parallel_schedule",
                               "gpipe does not interleave chunks (pipeline_parallel_interleave_num > 1)",
                               "use interleaved_1f1b (or 1f1b, upgraded to it)"))
        for gbs in _batch_sizes(s):
            steps, _ = accumulation_steps(gbs, s.local_batch_size, lay.dp)
            if steps is not None and steps % pp:
                out.append(Refusal("pp_interleave", "training.global_batch_size",
                                   f"interleaved 1F1B needs the micro-batches per step (global_batch_size / "
                                   f"(dp·local_batch_size) = {steps}) to be a multiple of pipeline_parallel={pp}",
                                   f"use a global_batch_size that is a multiple of "
                                   f"{lay.dp * s.local_batch_size * pp}"))
                break
    return out


def _stage_split(layers: int, pp: int, v: int, spec: Any, path: str) -> list[Refusal]:
    """``pipeline_parallel_layers_per_stage``: 'auto' (even split) or one string per stage of ``v`` chunks."""
    if spec is None:
        return [Refusal("pp_layers", path, f"must be 'auto' or a list of {pp} strings when pipeline_parallel > 1")]
    if isinstance(spec, str):
        if spec != "auto":
            return [Refusal("pp_layers", path, f"must be 'auto' or a list of {pp} strings, got {spec!r}")]
        if layers % (pp * v):
            return [Refusal("pp_layers", path, f"'auto' needs num_hidden_layers % (pp·interleave) = {layers} % "
                            f"({pp}·{v}) = {layers % (pp * v)} to be 0", "give an explicit per-stage list instead")]
        return []
    if len(spec) != pp:
        return [Refusal("pp_layers", path, f"needs one string per stage: {len(spec)} given, pipeline_parallel = {pp}")]
    covered: list[int] = []
    for i, stage in enumerate(spec):
        chunks = str(stage).split(",")
        if len(chunks) != v:
            return [Refusal("pp_layers", f"{path}[{i}]", f"needs {v} chunk(s) (pipeline_parallel_interleave_num), "
                            f"got {len(chunks)}")]
        for chunk in chunks:
            ids = parse_layer_range(chunk)
            if ids is None:
                return [Refusal("pp_layers", f"{path}[{i}]", f"chunk {chunk!r} is not 'n' or 'a-b'")]
            covered += ids
    if sorted(covered) != list(range(layers)):
        return [Refusal("pp_layers", path, f"stages must cover layers 0..{layers - 1} exactly once")]
    return []


def _in_order(chunks: list[list[list[int]]], pp: int) -> bool:
    """The layers of virtual stages 0, 1, … (chunk c of rank r is stage c·pp + r) are 0..L−1 in order."""
    v = len(chunks[0])
    flat = [i for c in range(v) for r in range(pp) for i in chunks[r][c]]
    return flat == sorted(flat) and len(flat) == len(set(flat)) and all(chunks[r][c] for r in range(pp)
                                                                         for c in range(v))




def runnable_layout(loaded: Any, world_size: int) -> Layout:
    """The layout ``loaded`` (a `config.load.LoadedConfig`) trains on ``world_size`` ranks; a `ConfigError`
    with every refusal when it cannot (the loader reports them already when it ran at this world size)."""
    from mftk.config.sections import tracking_requested
    from mftk.derive import layout_from_config
    from mftk.errors import ConfigError, Problem

    if world_size <= 1:
        return Layout(world=1)
    config = loaded.config
    layout = layout_from_config(config.parallelism, world_size)
    found = layout_refusals(config.model, layout, settings_of(config, track_max_logits=tracking_requested(config)))
    if found:
        raise ConfigError(message=f"{loaded.source}: " + "; ".join(f.message for f in found), source=loaded.source,
                          problems=[Problem(path=f.path, message=f.message, hint=f.hint) for f in found])
    return layout
