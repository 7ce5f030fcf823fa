"""Memory terms against hand arithmetic (a dense and an MoE case), plus pipeline and parsing rules."""
import attrs
import pytest

from mftk.config.model import Qwen3ModelConfig
from mftk.errors import InputError
from mftk.plan.flops import param_counts
from mftk.derive import Layout
from mftk.plan.memory import Assumptions, PlanInputs, activation_inventory, estimate, in_flight
from mftk.units import parse_bytes
from tests.helpers.sizes import tiny_dsv3
from tests.helpers.sizes import tiny_qwen3 as flops_tiny_qwen3

UNFUSED = Assumptions(fused_attention=False)


def tiny_qwen3(**kw):  # 376 params (tests/plan/test_flops.py): layer 146, embedding 40, output 40, final norm 4
    return flops_tiny_qwen3(**{"compute_dtype": "float32", "hidden_dropout": 0.0, **kw})


def inputs(model, lbs=1, gbs=1, **kw):
    return PlanInputs(model=model, local_batch_size=lbs, global_batch_size=gbs, **kw)


def test_dense_single_device_by_hand():
    est = estimate(Layout(world=1), inputs(tiny_qwen3()), UNFUSED)
    (st,) = est.stages
    # states, fp32 (no master copy): weights 4, grads 4, Adam 8 bytes per param
    assert st.term("weights").value == 376 * 4
    assert st.term("gradients").value == 376 * 4
    assert st.term("optimizer").value == 376 * 8
    assert st.term("fsdp gathered").value == 0
    # per token per layer (a=4, H=4, q=6, kv=3, F=5, S=8, nh=2):
    # norms 4H·a=64; q/k-norm inputs (6+3)·4=36; q,k,v (6+3+3)·4=48; attn out 6·4=24;
    # scores+probs 2·2·8·4=128; MLP 3·5·4=60  -> 360
    assert sum(activation_inventory(tiny_qwen3(), False, seq_per_rank=8, fused=False, selective=False).values()) == 360
    assert st.term("activations").value == 8 * 2 * 360           # 8 tokens, 2 layers, 1 micro-batch in flight
    assert st.term("embedding acts").value == 8 * 16
    assert st.term("logits + loss").value == 8 * ((2 * 4 * 4 + 4 * 10) + 4 * 10)
    assert st.total == 376 * 16 + 5760 + 128 + 8 * 112


def test_dense_fsdp_tp_and_recompute():
    model = tiny_qwen3(num_attention_heads=2, num_key_value_heads=2)  # kv heads divisible by tp=2
    one = estimate(Layout(world=1), inputs(model), UNFUSED).stages[0]
    fsdp = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2), UNFUSED).stages[0]
    assert fsdp.term("weights").value == pytest.approx(one.term("weights").value / 2)
    assert fsdp.term("optimizer").value == pytest.approx(one.term("optimizer").value / 2)
    layer = param_counts(model)[0] - 40 - 40 - 4                    # two equal layers
    assert fsdp.term("fsdp gathered").value == (2 * 4 + 4) * (layer / 2)  # 2 buffers·p + fp32 grad, largest unit
    tp = estimate(Layout(world=2, tp=2), inputs(model, sequence_parallel=True), UNFUSED).stages[0]
    assert tp.term("activations").value == pytest.approx(one.term("activations").value / 2)
    sel = estimate(Layout(world=2, tp=2), inputs(model, recompute="selective", sequence_parallel=True), UNFUSED)
    # kv=6 now: norms 64 + q/k-norm inputs (6+6)·4 + q,k,v (6+12)·4 + attn out 24 + MLP 60; scores dropped
    assert sel.stages[0].term("activations").value == pytest.approx(8 * 2 * (64 + 48 + 72 + 24 + 60) / 2)
    full = estimate(Layout(world=2, tp=2), inputs(model, recompute="full", sequence_parallel=True), UNFUSED)
    per_layer = sum(activation_inventory(model, False, seq_per_rank=8, fused=False, selective=False).values())
    assert full.stages[0].term("activations").value == pytest.approx(8 / 2 * (2 * 4 * 4 + per_layer))


def test_recompute_is_ignored_on_one_device():
    a = estimate(Layout(world=1), inputs(tiny_qwen3(), recompute="full"), UNFUSED)
    b = estimate(Layout(world=1), inputs(tiny_qwen3()), UNFUSED)
    assert a.peak_bytes == b.peak_bytes


def test_moe_by_hand_with_expert_parallel():
    model = tiny_dsv3()                                       # bf16 compute (a=2, p=2), fp32 embedding
    total, _ = param_counts(model)
    experts_per_layer = 4 * (2 * 2 * 4 + 2 * 4)               # E·(fc1 2Fm·H + fc2 Fm·H) = 96
    n_exp = 2 * experts_per_layer                             # layer 1 + the MTP layer are MoE
    emb = 2 * 10 * 4                                          # embedding + output, fp32
    dense = total - n_exp - emb
    est = estimate(Layout(world=2, dp_shard=2, ep=2), inputs(model, gbs=2), UNFUSED)
    st = est.stages[0]
    # dense params sharded over fsdp = dp_shard·cp = 2; experts split by ep=2, sharded over efsdp = 2·1·1/2 = 1
    assert st.term("weights").value == pytest.approx((dense * 2 + emb * 4) / 2 + (n_exp / 2) * 2)
    # no gradient or optimizer state for the router's buffers: tokens_per_expert and expert_bias (E = 4 each)
    # in layer 1 and in the MTP layer
    trained = dense - 2 * (4 + 4)
    assert st.term("gradients").value == pytest.approx(4 * ((trained + emb) / 2 + n_exp / 2))
    # Adam 8 on every trained param + fp32 master 4 on the bf16 (non-embedding) ones
    assert st.term("optimizer").value == pytest.approx(8 * ((trained + emb) / 2 + n_exp / 2)
                                                       + 4 * (trained / 2 + n_exp / 2))
    # per token (a=2): norms 32; MLA latents (2·3+2·2+2)·2=24; q,k,v 2·(2·4+3)·2=44; attn out 2·3·2=12;
    # scores 2·2·8·2=64 -> attention part 176; dense MLP 3·6·2=36 -> 212;
    # MoE: router 2·4·4=32, routed K·(2H+3Fm)·a = 2·(8+6)·2=56, shared 3·2·2=12 -> 176+100 = 276
    inv = lambda moe: sum(activation_inventory(model, moe, seq_per_rank=8, fused=False, selective=False).values())  # noqa: E731
    assert inv(False) == 212
    assert inv(True) == 276
    assert st.term("activations").value == 8 * (212 + 276)


def test_moe_imbalance_scales_routed_tokens():
    model = tiny_dsv3()
    base = activation_inventory(model, True, seq_per_rank=8, fused=False, selective=False)
    skew = activation_inventory(model, True, seq_per_rank=8, fused=False, selective=False, imbalance=2.0)
    key = "routed experts (K tokens: in, fc1, act, out)"
    assert skew[key] == 2 * base[key] == 112


def test_in_flight_and_bubble():
    assert in_flight("1f1b", 4, 0, 8, 1) == 4
    assert in_flight("1f1b", 4, 3, 8, 1) == 1
    assert in_flight("1f1b", 4, 0, 2, 1) == 2                 # m < pp
    assert in_flight("gpipe", 4, 3, 8, 1) == 8
    assert in_flight("1f1b", 4, 0, 8, 2) == pytest.approx(4 * (1 + 3 / 8))
    model = tiny_qwen3(num_hidden_layers=8)
    est = estimate(Layout(world=4, pp=4), inputs(model, gbs=8), UNFUSED)
    assert est.bubble.value == pytest.approx(3 / 8)
    assert [len(s.layers) for s in est.stages] == [2, 2, 2, 2]
    # stage 0 keeps 4 micro-batches, the last stage 1; only the first has the embedding, only the last the logits
    assert est.stages[0].term("activations").value == 4 * est.stages[3].term("activations").value
    assert "logits + loss" not in [t.name for t in est.stages[0].terms]
    inter = estimate(Layout(world=4, pp=4, interleave=2), inputs(model, gbs=8, schedule="1f1b"), UNFUSED)
    assert inter.bubble.value == pytest.approx(3 / 16)


def test_explain_names_formula_and_inputs():
    text = estimate(Layout(world=2, dp_shard=2), inputs(tiny_qwen3(), gbs=2), UNFUSED).explain()
    for part in ("weights = ", "inputs:", "fsdp = dp_shard·cp=2", "bubble = (pp − 1)/(v·m)", "comm fsdp"):
        assert part in text


def test_step_time_needs_tflops():
    est = estimate(Layout(world=1), inputs(tiny_qwen3()), UNFUSED)
    assert est.step_time is None
    timed = estimate(Layout(world=1), inputs(tiny_qwen3()), UNFUSED, device_tflops=1.0)
    assert timed.step_time.value == pytest.approx(est.flops.value / 1e12)


# Issue 35: "80G" was read as 80·10^9 bytes while the output calls its unit GiB. Every suffix is binary now
# (as the output prints sizes, and as MindSpore reads "58GB": 1024 << 20 bytes per GB).
@pytest.mark.parametrize("text,value", [("64GiB", 64 * 2**30), ("80GB", 80 * 2**30), ("80G", 80 * 2**30),
                                        ("24576 MiB", 24576 * 2**20), ("512K", 512 * 1024),
                                        ("1.5TiB", int(1.5 * 2**40)), ("1000", 1000), ("1000B", 1000)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "lots", "64 GiBs", "-1GB", "0GiB", "GiB", "64iB", "64Gb/s", "8PB"])
def test_parse_bytes_rejects(text):
    with pytest.raises(InputError, match="cannot read device memory"):
        parse_bytes(text)


def test_llama3_8b_fsdp8_states_match_zero3_accounting():
    """peers.md §4.5: ~18 B/param over 8 ranks for the model states (18.1 GB for Llama-3-8B)."""
    model = Qwen3ModelConfig(vocab_size=128256, seq_length=8192, hidden_size=4096, intermediate_size=14336,
                             num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                             compute_dtype="bfloat16")
    st = estimate(Layout(world=8, dp_shard=8), inputs(model, lbs=2, gbs=16, recompute="selective")).stages[0]
    states = sum(st.term(n).value for n in ("weights", "gradients", "optimizer"))
    assert states / 1e9 == pytest.approx(18.1, rel=0.05)


def test_cpu_profile_terms_by_hand():
    """mftk-cpu: 24 B/param from the engine's code + measured retention, float64 norm block, scaled activations."""
    from mftk.plan.memory import MFTK_CPU

    st = estimate(Layout(world=1), inputs(tiny_qwen3()), MFTK_CPU).stages[0]
    assert st.term("weights").value == 376 * 4                      # MindSpore parameters
    assert st.term("gradients").value == 376 * (4 + 4)              # value_and_grad's grads + flat fp32 buffer
    assert st.term("optimizer").value == 376 * (8 + 4)              # m, v + numpy master (in-place update)
    assert st.term("allocator retained").value == pytest.approx(376 * 0.4)
    assert "grad-norm scratch" not in [t.name for t in st.terms]    # float32 dot on views: no copy
    # inventory 360 B/token/layer of which scores 2·2·8·4 = 128: scaled 1.75·232 + 2.2 copies·64 = 546.8
    assert st.term("activations").value == pytest.approx(8 * 2 * (1.75 * 232 + 2.2 * 64))
    assert st.term("logits + loss").value == pytest.approx(8 * ((2 * 4 * 4 + 0.95 * 4 * 10) + 4 * 10))
    assert st.term("overhead").value == 39 * 2 ** 20
    assert "compiled layers" not in [t.name for t in st.terms]      # 376 params: the layers run eagerly
    # msrun workers (malloc settings of engine/launch.py) keep less: the profile's several-process values
    two = estimate(Layout(world=2, dp_shard=2), inputs(tiny_qwen3(), gbs=2), MFTK_CPU).stages[0]
    assert two.term("activations").value == pytest.approx(8 * 2 * (1.25 * 232 + 1.85 * 64))
    assert two.term("logits + loss").value == pytest.approx(8 * ((2 * 4 * 4 + 1.75 * 4 * 10) + 4 * 10))
    assert two.term("overhead").value == 45 * 2 ** 20


@pytest.mark.parametrize("dropout, params, inventory", [
    # dense, no dropout: both layers whole (146 params each); inventory 360 with 2.2 score copies (64·2.2 for 128)
    (0.0, 2 * 146, 2 * (360 - 128 + 2.2 * 64)),
    # dropout: attention only, its 78 params + the input norm's 4; inventory + masks 2H = 8, less the MLP's 60
    # and the post-attention norm's 2H·a = 32 of the 64
    (0.1, 2 * (78 + 4), 2 * (360 - 128 + 2.2 * 64 + 8 - 60 - 32))])
def test_cpu_profile_counts_compiled_layers_in_one_process(monkeypatch, dropout, params, inventory):
    """`derive.compiles_blocks` (one process, ≥ JIT_MIN_PARAMS): c0 + layers·c_layer + c_p·N + c_a·tokens·B."""
    from mftk import derive
    from mftk.plan.memory import MFTK_CPU

    monkeypatch.setattr(derive, "JIT_MIN_PARAMS", 300)              # the tiny model's 376 params compile
    model = tiny_qwen3(hidden_dropout=dropout)
    st = estimate(Layout(world=1), inputs(model), MFTK_CPU).stages[0]
    want = 57 * 2 ** 20 + 2 * 27.4 * 2 ** 20 + 0.6 * params + 1.23 * 8 * inventory
    assert st.term("compiled layers").value == pytest.approx(want)
    assert st.total == pytest.approx(sum(t.value for t in st.terms))
    two = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2), MFTK_CPU).stages[0]
    assert "compiled layers" not in [t.name for t in two.terms]     # msrun workers stay eager
    assert "compiled layers" not in [t.name for t in estimate(Layout(world=1), inputs(model)).stages[0].terms]
    monkeypatch.setattr(derive, "JIT_MIN_PARAMS", 377)
    assert "compiled layers" not in [t.name for t in estimate(Layout(world=1), inputs(model), MFTK_CPU).stages[0].terms]
    blocked = attrs.evolve(MFTK_CPU, norm_scratch_bytes=8.0)        # a profile declaring a norm block
    assert estimate(Layout(world=1), inputs(tiny_qwen3()), blocked).stages[0].term("grad-norm scratch").value == 376 * 8
    big = estimate(Layout(world=1), inputs(tiny_qwen3(vocab_size=3_000_000)), blocked).stages[0]
    assert big.term("grad-norm scratch").value == 8 * 2 ** 22      # one block at most


def test_presets():
    from mftk.plan.memory import MFTK_CPU, preset

    assert preset("mftk-cpu") is MFTK_CPU
    assert preset("generic") == Assumptions()
    # the default accelerator profile is Megatron-core's calibrated accounting under its own name
    assert attrs.evolve(preset("accelerator"), name="megatron") == preset("megatron")
    with pytest.raises(InputError, match="unknown memory profile 'gpu'"):
        preset("gpu")


@pytest.mark.engine
@pytest.mark.parametrize("template", ["qwen3_tiny.yaml", "qwen3_moe_tiny.yaml", "deepseek_v3_tiny.yaml"])
def test_state_terms_are_the_bytes_of_the_built_model_and_optimizer(template):
    """The profile's state terms against the tensors the engine really allocates: the built model's Parameters
    (weights; the gradients' flat buffer and the framework's gradients) and the AdamW's m, v and master arrays.
    Deterministic: nothing here reads the process's memory, which moves with the machine's load; how close the
    whole estimate comes to the measured peak is `bench/plan_calibration.py`'s job (ratios, medians)."""
    from mftk.config.load import load_config
    from mftk.derive import Layout
    from mftk.engine.builders import build_model, build_optimizer
    from mftk.plan.memory import MFTK_CPU
    from mftk.plan.report import plan_inputs
    from mftk.config.templates import TEMPLATES_DIR

    cfg = load_config(TEMPLATES_DIR / template, check_files=False).config
    model = build_model(cfg)
    opt = build_optimizer(cfg, model)
    weights = sum(p.asnumpy().nbytes for p in model.get_parameters())
    trainable = sum(p.asnumpy().nbytes for p in model.trainable_params())
    stage = estimate(Layout(world=1), plan_inputs(cfg, cfg.parallelism), MFTK_CPU).stages[0]
    assert stage.term("weights").value == weights
    # the fp32 flat buffer the step accumulates into, plus the framework's own gradient per trainable
    # Parameter (fp32 on CPU, the Parameter's shape) that value_and_grad hands back before it is copied in
    assert opt.grad_buffer().nbytes == trainable
    assert stage.term("gradients").value == opt.grad_buffer().nbytes + trainable
    assert not opt.shares_weights  # one process: the masters are their own fp32 copy
    assert stage.term("optimizer").value == opt.m.nbytes + opt.v.nbytes + opt.master.nbytes


def test_cpu_profile_multiprocess_terms_by_hand():
    """mftk-cpu under FSDP2 / DP2 / TP2 on a tiny untied model (two layers, embedding, output layer, norm)."""
    from mftk.plan.memory import MFTK_CPU

    model = tiny_qwen3(num_attention_heads=2, num_key_value_heads=2)
    N = param_counts(model)[0]
    fsdp = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2), MFTK_CPU).stages[0]
    assert fsdp.term("weights").value == N * 4 / 2                  # the Parameters hold their rows
    assert fsdp.term("gradients").value == N * 4 / 2                # the flat buffer's rows (the framework's are views)
    assert fsdp.term("optimizer").value == 8 * N / 2                # m, v; the masters are the weights
    assert fsdp.term("allocator retained").value == pytest.approx(0.4 * N / 2)
    assert fsdp.term("replaced weights").value == 4 * N / 2         # the built weights, before they became views
    assert "cut build" not in [t.name for t in fsdp.terms]          # the cut rows are freed (new Parameters)
    layer = (N - 2 * model.vocab_size * model.hidden_size - model.hidden_size) / model.num_hidden_layers
    assert layer > model.vocab_size * model.hidden_size              # the largest unit is a layer
    assert fsdp.term("fsdp gathered").value == (2 * 4 + 4) * layer  # gathered weights, gathered again, their grads
    assert "gradient sync" not in [t.name for t in fsdp.terms]      # the units reduce; dp reduces in place
    assert "grad-norm scratch" not in [t.name for t in fsdp.terms]  # blocked norm
    acts = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2, recompute="none"), MFTK_CPU).stages[0]
    full = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2, recompute="full"), MFTK_CPU).stages[0]
    sel = estimate(Layout(world=2, dp_shard=2), inputs(model, gbs=2, recompute="selective"), MFTK_CPU).stages[0]
    assert acts.term("activations").value > full.term("activations").value  # units keep activations unless recompute
    assert sel.term("activations").value == full.term("activations").value  # a selected layer is replayed whole
    fc1 = 2 * model.intermediate_size * model.hidden_size           # gate and up rows of one layer
    assert acts.term("gate/up rows").value == 4 * fc1 * 2            # both layers keep their fc1 row copies
    assert full.term("gate/up rows").value == 4 * fc1                # one layer replays at a time
    assert sel.term("gate/up rows").value == 4 * fc1
    dp = estimate(Layout(world=2, dp_replicate=2), inputs(model, gbs=2), MFTK_CPU).stages[0]
    assert dp.term("weights").value == 4 * N and dp.term("optimizer").value == 8 * N
    assert dp.term("replaced weights").value == 4 * N
    assert "gradient sync" not in [t.name for t in dp.terms] and "cut build" not in [t.name for t in dp.terms]
    assert dp.term("fsdp gathered").value == 0
    assert "gate/up rows" not in [t.name for t in dp.terms]          # the dp fit holds them
    assert dp.term("collective buffers").value == 1.4 * 4 * N          # 1.4 messages, the gradient < 16 MiB
    assert "collective buffers" not in [t.name for t in fsdp.terms]    # the units reduce-scatter
    big = estimate(Layout(world=2, dp_replicate=2), inputs(tiny_qwen3(vocab_size=3_000_000), gbs=2), MFTK_CPU)
    assert big.stages[0].term("collective buffers").value == 1.4 * 16 * 2 ** 20  # one 16 MiB message at most
    tp = estimate(Layout(world=2, tp=2), inputs(model, sequence_parallel=True), MFTK_CPU).stages[0]
    local = tp.term("weights").value / 4                            # this rank's TP block
    assert local < N
    assert tp.term("cut build").inputs["N_model"] == N
    assert tp.term("cut build").value == pytest.approx(6 * (N - local))
    assert tp.term("gradient sync").value == pytest.approx(4 * local)  # one copy, no dp
    assert tp.term("fsdp gathered").value == 0                      # dense model: TP shards no experts
    one = estimate(Layout(world=1), inputs(model), MFTK_CPU).stages[0]
    assert "gradient sync" not in [t.name for t in one.terms]


def test_deepseek_v4_tp_splits_only_the_query_up_projection():
    """Under TP, DeepSeek-V4's layer divides only its query up-projection by tp (MindSpore Transformers 2.1.0's
    plan, `parallel.parallelize.tensor_parallel_v4_attention`): the tiny template's 4 heads × 32 × q_lora_rank 32
    = 4096 parameters; attention, hyper-connections and shared experts stay whole."""
    from mftk.plan.memory import _layer_params
    from tests.helpers.config import load_dict, template_dict

    cfg = load_dict(template_dict("deepseek_v4_tiny")).config.model
    assert _layer_params(cfg, moe=True).tp_split == 4 * 32 * 32


def test_deepseek_v4_mla_variant_tp_splits_the_mla_heads():
    """DeepSeek-V4's legacy mla variant takes DeepSeek-V3's MLA plan under TP (`parallelize.tensor_parallel_layer`):
    ``linear_qb`` 4·(24+8)·32, ``linear_kvb`` 4·(24+16)·16 and ``linear_proj`` 64·4·16 divided by tp (by hand:
    4096 + 2560 + 4096); the latent down-projection, its norms and V4's shared experts whole."""
    from mftk.plan.memory import _layer_params
    from tests.helpers.config import load_dict, template_dict

    raw = template_dict("deepseek_v4_tiny")
    raw["model"].update({"experimental_attention_variant": "mla", "kv_lora_rank": 16, "v_head_dim": 16})
    assert _layer_params(load_dict(raw).config.model, moe=True).tp_split == 4096 + 2560 + 4096
def test_deepseek_v4_context_parallel_keeps_the_attention_of_the_whole_sequence():
    """Under CP each DeepSeek-V4 rank holds S/cp tokens outside the attention but runs the attention on the
    whole gathered sequence (`parallel.parallelize.whole_sequence_v4_attention`): its entries of the layer
    inventory (q, kv, the output, the scores over S keys) count for all S tokens, the rest for S/cp. Checked
    against the one-process inventory split by hand: A (attention) and N (the rest) per token."""
    from tests.helpers.config import load_dict, template_dict

    cfg = attrs.evolve(load_dict(template_dict("deepseek_v4_tiny")).config.model, num_nextn_predict_layers=0,
                       compress_ratios=[0, 4, 16], compute_dtype="float32")
    asm = Assumptions(fused_attention=False)
    S = cfg.seq_length
    inv = activation_inventory(cfg, True, seq_per_rank=S, fused=False, selective=False)
    attention = {"q/k-norm inputs", "q, k, v for attention", "attention output", "attention scores/probs (S per head)"}
    assert attention <= inv.keys()
    A = sum(v for k, v in inv.items() if k in attention)
    N = sum(v for k, v in inv.items() if k not in attention)
    scores = inv["attention scores/probs (S per head)"]
    act = {cp: estimate(Layout(world=cp, cp=cp), inputs(cfg), asm).stages[0].term("activations") for cp in (1, 2)}
    f, L = act[1].inputs["activation_factor"], cfg.num_hidden_layers
    per_token = lambda whole: f * (N + whole * (A - scores)) + whole * scores  # noqa: E731
    assert act[1].value == pytest.approx(S * L * per_token(1))
    assert act[2].value == pytest.approx(S / 2 * L * per_token(2))   # = S·L·(f·N/2 + f·(A − scores) + scores)
