"""Tokens/s of one training step (forward + backward + clip + AdamW): mftk (MindSpore PyNative, CPU)
vs the same architecture in PyTorch eager, side by side in one run.

Model (mindspore-cpu.md §2): Qwen3-like, 4 layers, hidden 512, 8 heads × 64 (GQA off), FFN 1408,
vocab 32000, tied embeddings, seq 512, batch 2, fp32 → 29.2 M parameters.

Each variant runs in its own process (``launch_blocking`` cannot be undone in-process); the step
time is the median of the timed steps after warm-up. ``--rounds N`` runs every variant N times,
interleaved, and reports per-variant medians; ``tok/CPU-s`` (tokens per process CPU-second) is less
sensitive than wall time to other load on a shared machine. Variants:

- ``mftk``            mftk's real step, ``Trainer.train_step``: value_and_grad → fp32 flat gradient buffer →
  global norm → clip → chunked, threaded numpy AdamW over fp32 masters → weights (phase times printed
  below); with its defaults (here: every dense layer compiled whole by ``GPTModel.jit_blocks``, see
  ``trainer_build.auto_jit_blocks``; the step dispatched from an idle-class thread,
  ``trainer_build.auto_low_priority_dispatch``;
  the hand-written backward kernels of ``layers/kernels.py`` in all mftk variants);
- ``mftk_spin``       the same with ``build_path(low_priority_dispatch=False)``: the step dispatched from the calling
  thread at normal priority, whose busy-wait (and MindSpore's relay thread's) competes with the kernels;
- ``mftk_eager``      the same with ``build_path(jit_blocks=False)`` (every op in PyNative);
- ``ms_default``      MindSpore PyNative, default async dispatch;
- ``ms_blocking``     + ``mindspore.runtime.launch_blocking()`` (mftk's default on CPU);
- ``ms_ops_ce``       blocking, but the logits + ``ops.cross_entropy`` instead of mftk's fused LM-head loss;
- ``ms_jit_blocks``   blocking + ``mindspore.jit`` on every dense layer (``GPTModel.jit_blocks``);
- (the ``ms_*`` variants use MindSpore's fused ``nn.Adam`` + decoupled decay instead of mftk's trainer;)
- ``torch_fp32`` / ``torch_bf16`` the same architecture in plain torch eager (SDPA, ``nn.RMSNorm``,
  qk-norm, RoPE, SwiGLU, tied head), fp32 / bf16 autocast; AdamW + clip like the MindSpore side.

``--arch deepseek_v4``: a DeepSeek-V4 small enough for CPU but bound by its kernels (4 layers: sliding,
CSA, HCA, CSA; hidden 512, 8 heads × 64 (48 + 16 rotary), q rank 256, 4 output groups × 128, 4 mHC
streams, 8 experts top-2 of width 512 + a shared one, the first layer hash-routed, window 128, indexer
8 × 32 top-16, vocab 32000, seq 512, batch 2, no MTP — transformers builds none): ``mftk`` (its real
step with AdamW, as above) and ``mftk_spin`` (without the idle-class dispatch, which a loaded machine
starves; and on request ``mftk_eager``, nothing compiled) against ``torch_fp32``, transformers' ``DeepseekV4ForCausalLM`` in eager fp32 with torch
AdamW, called with ``use_cache=False`` as a training step is (its default builds a ``DynamicCache`` every
forward, which only slows torch down) — both sides the same architecture, each with its own random init.

Usage: ``.venv/bin/python bench/train_step.py [--arch qwen3|deepseek_v4] [--rounds 3] [--steps 5] [--warmup 2]
[--variants a,b,...]``
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ARCH = dict(vocab_size=32000, hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8,
            num_key_value_heads=8, head_dim=64, rope_theta=1e6, tie_word_embeddings=True)
VARIANTS = ("torch_fp32", "torch_bf16", "mftk", "mftk_spin", "mftk_eager", "ms_default", "ms_blocking", "ms_ops_ce",
            "ms_jit_blocks")
ARCH_V4 = dict(vocab_size=32000, hidden_size=512, num_hidden_layers=4, num_attention_heads=8, q_lora_rank=256,
               qk_nope_head_dim=48, qk_rope_head_dim=16, v_head_dim=64, o_groups=4, o_lora_rank=128,
               compress_ratios=[0, 4, 128, 4], csa_window_size=128, index_n_heads=8, index_head_dim=32, index_topk=16,
               num_residual_streams=4, moe_intermediate_size=512, moe_shared_expert_intermediate_size=512,
               n_routed_experts=8, num_experts_per_tok=2, num_hash_layers=1, num_nextn_predict_layers=0,
               apply_dsa_kernel_fusion=False, dsa_indexer_loss_coeff=0.0, moe_router_enable_expert_bias=False,
               original_max_position_embeddings=512, max_position_embeddings=4096, initializer_range=0.02)
VARIANTS_V4 = ("torch_fp32", "mftk", "mftk_spin")
EXTRA_V4 = ("mftk_eager",)  # on request: the same step with nothing compiled (the hyper-connection mixes eager)
LR, WD, CLIP = 1e-4, 0.1, 1.0


def _v4_config(args):
    from mftk.config.model import DeepseekV4ModelConfig

    return DeepseekV4ModelConfig(**ARCH_V4, seq_length=args.seq)


def _mftk_model(args):
    from mftk.config.model import Qwen3ModelConfig
    from mftk.engine import build_model

    if args.arch == "deepseek_v4":
        return build_model(_v4_config(args), seed=0)
    return build_model(Qwen3ModelConfig(**ARCH, hidden_dropout=0.0, pad_token_id=-1, initializer_range=0.02), seed=0)


def _hf_v4_model(args):
    """transformers' DeepseekV4ForCausalLM with the same architecture (its config from mftk's HF export)."""
    import transformers

    from mftk.config.hf import hf_config_from_model_section

    cj = hf_config_from_model_section(_v4_config(args))
    cfg = transformers.DeepseekV4Config(**{k: v for k, v in cj.items() if k not in ("architectures", "model_type")})
    cfg._attn_implementation = "eager"
    return transformers.DeepseekV4ForCausalLM(cfg)


def _batch(args):
    import numpy as np

    rng = np.random.default_rng(0)
    vocab = ARCH_V4["vocab_size"] if args.arch == "deepseek_v4" else ARCH["vocab_size"]
    ids = rng.integers(1, vocab, (args.batch, args.seq)).astype(np.int32)
    labels = np.roll(ids, -1, 1).astype(np.int32)
    mask = (rng.random((args.batch, args.seq)) > 1 / 16).astype(np.float32)  # 1/16 of targets ignored
    return ids, labels, mask


def _time_steps(step, args) -> dict:
    times, cpus, losses = [], [], []
    for _ in range(args.warmup + args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        losses.append(step())
        times.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    med = statistics.median(times[args.warmup:])
    cpu = statistics.median(cpus[args.warmup:])
    best = min(times[args.warmup:])  # least disturbed by other load on a shared machine
    return {"step_s": med, "best_step_s": best, "first_step_s": times[0], "tokens_per_s": args.batch * args.seq / med,
            "best_tokens_per_s": args.batch * args.seq / best, "cpu_s": cpu,
            "tokens_per_cpu_s": args.batch * args.seq / cpu,
            "loss_first": losses[0], "loss_last": losses[-1]}


def _torch_model():
    """The same Qwen3 architecture in plain torch (SDPA, ``nn.RMSNorm``), as the reference measured it."""
    import torch
    from torch import nn

    h, nh, hd, f, v = (ARCH[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "intermediate_size",
                                           "vocab_size"))

    def rope(x, cos, sin):  # x (B, nh, S, hd), NeoX rotate-half
        x1, x2 = x.chunk(2, -1)
        return x * cos + torch.cat((-x2, x1), -1) * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(h, eps=1e-6), nn.RMSNorm(h, eps=1e-6)
            self.qn, self.kn = nn.RMSNorm(hd, eps=1e-6), nn.RMSNorm(hd, eps=1e-6)
            self.qkv, self.o = nn.Linear(h, 3 * nh * hd, bias=False), nn.Linear(nh * hd, h, bias=False)
            self.fc1, self.fc2 = nn.Linear(h, 2 * f, bias=False), nn.Linear(f, h, bias=False)

        def forward(self, x, cos, sin):
            b, s, _ = x.shape
            q, k, val = self.qkv(self.n1(x)).view(b, s, 3, nh, hd).unbind(2)  # (B, S, nh, hd) each
            q, k = (rope(self.qn(t).transpose(1, 2), cos, sin) for t in (q, k))
            a = nn.functional.scaled_dot_product_attention(q, k, val.transpose(1, 2), is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(b, s, nh * hd))
            g, u = self.fc1(self.n2(x)).chunk(2, -1)
            return x + self.fc2(nn.functional.silu(g) * u)

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(v, h)
            self.blocks = nn.ModuleList(Block() for _ in range(ARCH["num_hidden_layers"]))
            self.norm = nn.RMSNorm(h, eps=1e-6)
            for p in self.parameters():
                if p.ndim >= 2:
                    nn.init.normal_(p, std=0.02)

        def forward(self, ids):
            s = ids.shape[1]
            inv = 1.0 / ARCH["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
            ang = torch.outer(torch.arange(s).float(), inv)
            cos, sin = torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin()
            x = self.emb(ids)
            for blk in self.blocks:
                x = blk(x, cos, sin)
            return self.norm(x) @ self.emb.weight.T  # tied LM head

    return GPT()


def run_torch(args, bf16: bool) -> dict:
    import torch

    torch.manual_seed(0)
    model = (_hf_v4_model(args) if args.arch == "deepseek_v4" else _torch_model()).train()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WD)
    ids, labels, mask = (torch.tensor(a) for a in _batch(args))
    ids, labels = ids.long(), labels.long()

    def step() -> float:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            # a training step builds no KV cache (transformers' use_cache defaults on)
            logits = model(ids, use_cache=False).logits if args.arch == "deepseek_v4" else model(ids)
        ce = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                                               reduction="none")
        loss = (ce * mask.reshape(-1)).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        return float(loss)

    return _time_steps(step, args)


def _ops_cross_entropy_head(self, h, labels, weights):
    """``GPTModel.head_loss`` the plain way: materialised logits, then ``ops.cross_entropy``."""
    from mindspore import Tensor, ops

    logits = self.lm_head(h)
    ce = ops.cross_entropy(logits.reshape(-1, logits.shape[-1]), Tensor(labels.reshape(-1)), reduction="none",
                           ignore_index=-100)
    return (ce * Tensor(weights.reshape(-1))).sum()


def run_mindspore(args, variant: str) -> dict:
    import mindspore as ms
    from mindspore import nn, ops

    if variant != "ms_default":
        ms.runtime.launch_blocking()
    from mftk.config.model import Qwen3ModelConfig
    from mftk.engine import build_model
    import mftk.engine.models.gpt as gpt

    if variant == "ms_ops_ce":
        gpt.GPTModel.head_loss = _ops_cross_entropy_head
    model = build_model(Qwen3ModelConfig(**ARCH, hidden_dropout=0.0, pad_token_id=-1, initializer_range=0.02), seed=0)
    if variant == "ms_jit_blocks":
        model.jit_blocks()
    params = model.trainable_params()
    decay = [p for p in params if p.ndim >= 2]
    opt = nn.Adam(params, learning_rate=LR, beta1=0.9, beta2=0.999, eps=1e-8)  # + decoupled decay = torch AdamW
    grad_fn = ms.value_and_grad(model, None, params, has_aux=True)
    ids, labels, mask = _batch(args)

    def step() -> float:
        out, grads = grad_fn(ids, labels, mask)
        norm = ops.sqrt(ops.addn([(g * g).sum() for g in grads]))
        scale = ops.minimum(CLIP / (norm + 1e-6), 1.0)
        grads = tuple(g * scale for g in grads)
        for p in decay:
            ops.assign(p, p * (1 - LR * WD))
        opt(grads)
        return float(out[1].asnumpy())

    return _time_steps(step, args)


def run_mftk(args, variant: str) -> dict:
    """mftk's own training step: ``Trainer.train_step`` (grads → fp32 flat buffer → norm → clip → AdamW →
    weights), exactly what ``mftk train`` runs per step, with the batch held in memory."""
    import itertools

    import mindspore as ms

    ms.runtime.launch_blocking()  # as mftk.engine.run does
    from mftk.engine.optim import AdamW, decide_weight_decay
    from mftk.engine.state import TrainState
    from mftk.engine.step import BatchSchedule, StepPlan
    from mftk.engine.trainer import Trainer
    from mftk.engine.trainer_build import TrainerParts, build_path

    model = _mftk_model(args)
    params = list(model.trainable_params())
    decisions = decide_weight_decay([(p.name, tuple(p.shape)) for p in params], WD)
    opt = AdamW([p.name for p in params], [p.asnumpy() for p in params], decisions, betas=(0.9, 0.999), eps=1e-8)
    ids, labels, mask = _batch(args)
    batch = {"input_ids": ids, "labels": labels, "loss_mask": mask}
    path = build_path(model, opt, itertools.repeat(batch), columns=("input_ids", "labels", "loss_mask"),
                      jit_blocks=False if variant == "mftk_eager" else None,
                      low_priority_dispatch=False if variant == "mftk_spin" else None)
    trainer = Trainer(TrainerParts(path=path, schedule=lambda step: LR,
                                   plan=StepPlan(BatchSchedule(args.batch, args.batch), total_steps=10 ** 9,
                                                 max_norm=CLIP)))
    state, phases = TrainState(), []

    def step() -> float:
        m = trainer.train_step(state)
        phases.append({k[5:-3]: round(v) for k, v in m.items() if k.startswith("time_")})
        return m["loss"]

    res = _time_steps(step, args)
    res["phases_ms"] = phases[-1]
    return res


def _child(args) -> None:
    v = args.variant
    if v.startswith("torch"):
        res = run_torch(args, v == "torch_bf16")
    else:
        res = run_mftk(args, v) if v.startswith("mftk") else run_mindspore(args, v)
    print("RESULT " + json.dumps(res), flush=True)


def _has_native_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return True
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _run_variant(v: str, args) -> dict:
    if v == "torch_bf16" and not _has_native_bf16():
        return {"error": "skipped: this CPU has no AVX512_BF16/AMX, torch emulates bf16 (~10x slower)"}
    cmd = [sys.executable, __file__, "--variant", v, "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--seq", str(args.seq), "--batch", str(args.batch), "--arch", args.arch]
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return json.loads(line[-1][7:]) if line else {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}


def _median_of_rounds(runs: list[dict]) -> dict:
    """Per-variant medians over the interleaved rounds (each round ran every variant once, in turn)."""
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[-1]
    out = dict(ok[len(ok) // 2])
    for k in ("step_s", "best_step_s", "first_step_s", "tokens_per_s", "best_tokens_per_s", "tokens_per_cpu_s"):
        out[k] = statistics.median(r[k] for r in ok)
    out["per_round_tokens_per_s"] = [round(r["tokens_per_s"]) for r in ok]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile, allocator warm-up)")
    ap.add_argument("--rounds", type=int, default=1, help="run every variant this many times, interleaved; "
                    "report medians (use >= 3 on a shared machine)")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--arch", choices=("qwen3", "deepseek_v4"), default="qwen3")
    ap.add_argument("--variants", default=None, help=f"default: {','.join(VARIANTS)}; with --arch deepseek_v4: "
                    f"{','.join(VARIANTS_V4)} (also {','.join(EXTRA_V4)})")
    ap.add_argument("--variant", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        return _child(args)
    names = (args.variants or ",".join(VARIANTS_V4 if args.arch == "deepseek_v4" else VARIANTS)).split(",")
    if args.arch == "deepseek_v4" and not set(names) <= set(VARIANTS_V4 + EXTRA_V4):
        ap.error(f"--arch deepseek_v4 runs the variants {', '.join(VARIANTS_V4 + EXTRA_V4)}")
    runs: dict[str, list[dict]] = {v: [] for v in names}
    for _ in range(args.rounds):
        for v in names:
            runs[v].append(_run_variant(v, args))
    results = {v: _median_of_rounds(r) for v, r in runs.items()}
    base = results.get("torch_fp32", {}).get("tokens_per_s")
    best_base = results.get("torch_fp32", {}).get("best_tokens_per_s")
    cpu_base = results.get("torch_fp32", {}).get("tokens_per_cpu_s")
    print(f"{'variant':<16}{'step s':>9}{'tokens/s':>10}{'vs torch fp32':>15}{'best tok/s':>12}{'best vs torch':>15}"
          f"{'tok/CPU-s':>11}{'vs torch':>10}{'first step s':>14}  loss first→last")
    for v, r in results.items():
        if "error" in r:
            print(f"{v:<16}  FAILED: {r['error'][:100]}")
            continue
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        best = f"{r['best_tokens_per_s'] / best_base:.2f}x" if best_base else "-"
        cpu = f"{r['tokens_per_cpu_s'] / cpu_base:.2f}x" if cpu_base else "-"
        print(f"{v:<16}{r['step_s']:>9.2f}{r['tokens_per_s']:>10.0f}{ratio:>15}{r['best_tokens_per_s']:>12.0f}"
              f"{best:>15}{r['tokens_per_cpu_s']:>11.0f}{cpu:>10}{r['first_step_s']:>14.2f}"
              f"  {r['loss_first']:.4f}→{r['loss_last']:.4f}")
    for v, r in results.items():
        extra = [f"rounds tok/s {r['per_round_tokens_per_s']}"] if len(r.get("per_round_tokens_per_s", [])) > 1 else []
        if "phases_ms" in r:
            extra.append("phases ms " + ", ".join(f"{k} {x}" for k, x in r["phases_ms"].items()))
        if extra:
            print(f"  {v}: " + "; ".join(extra))


if __name__ == "__main__":
    main()
