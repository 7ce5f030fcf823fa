"""Forward (+ backward) time of in-model host round trips done in MindSpore ops against their host (NumPy)
versions, interleaved in one process; prints per-case medians and the device/host ratio.

Cases (bench/train_step.py's shapes):

- ``head_ce``: the fused LM head + cross-entropy (`kernels.HeadCrossEntropyFn`), N tokens × V = 32000,
  H = 512. Host: reads ``P[y]`` and the weights back, takes ``−log`` in NumPy, writes the losses back
  (the previous kernel). Device: the same loss from ops (the underflow fallback by one arg-max pass).
- ``csa_select``: the CSA indexer's top-k and the compressed entries' mask (B = 2, S = 512, n = 128,
  top-16; forward only, the selection has no gradient). Host (what the model runs): read the scores,
  stable ``np.argsort``, build the mask in NumPy and write it. Device: a candidate in ops (`csa_select_cases`),
  kept out of the model while it is slower on CPU.
- ``sinkhorn``: DeepSeek-V4 hyper-connections' Sinkhorn, forward + backward, on ``(N, n, n)`` with n = 4
  streams and 20 iterations (`--sinkhorn-tokens` N = B·S: the tiny V4 template's micro-batch 128,
  bench/train_step.py's 1024). Host: `kernels_v4.SinkhornFn` (what the model runs). Device:
  `kernels_v4.sinkhorn_ops`, autodiff for the backward; ``device_jit``: the same under ``mindspore.jit``.
- ``moe_dispatch``: the padded MoE dispatch layout from ``idx (T, K)``, T tokens, top-K of E experts
  (`--moe-shape T,K,E`). Host (what the model runs): read ``idx`` back, `grouped.padded_layout` (stable
  ``np.argsort``), write the slot→token and slot→pair indices. Device: `grouped.padded_layout_ops`, a
  candidate not used by the model; it still reads back one scalar, the padded width ``n_max`` (a tensor shape).

A ratio below 1 means the device version is faster. The step-level effect is the difference over the
step time of bench/train_step.py. Usage: ``.venv/bin/python bench/host_roundtrips.py [--rounds 15] [--tokens 256]
[--cases head_ce,csa_select,sinkhorn,moe_dispatch] [--sinkhorn-tokens 128] [--moe-shape 128,2,8]``
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _host_head_ce():
    """The previous `HeadCrossEntropyFn.construct` (host NumPy loss), same backward."""
    from mindspore import Tensor, mint, ops

    from mftk.engine.layers.kernels import HeadCrossEntropyFn, _mm_nt

    class HostHeadCrossEntropyFn(HeadCrossEntropyFn):
        def construct(self, h, weight, labels, wts):
            z = _mm_nt(h, weight)
            p = mint.softmax(z, -1)
            py = ops.gather_elements(p, 1, labels.reshape(-1, 1)).reshape(-1).asnumpy()
            live = wts.asnumpy() != 0
            ce = np.zeros(py.shape, np.float32)
            with np.errstate(divide="ignore"):
                ce[live] = -np.log(py[live])
            low = np.nonzero(live & (py < self.UNDERFLOW))[0].astype(np.int32)
            if low.size:
                zr = ops.gather(z, Tensor(low), 0)
                zy = ops.gather_elements(zr, 1, ops.gather(labels, Tensor(low), 0).reshape(-1, 1)).reshape(-1)
                ce[low] = (ops.logsumexp(zr, -1) - zy).asnumpy()
            return (Tensor(ce) * wts).sum(), p

    return HostHeadCrossEntropyFn()


def head_ce_cases(tokens: int, rng) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from mftk.engine.layers.kernels import HeadCrossEntropyFn

    n, hdim, vocab = tokens, 512, 32000
    h = Tensor(rng.normal(0, 1, (n, hdim)).astype(np.float32))
    w = Tensor(rng.normal(0, 0.02, (vocab, hdim)).astype(np.float32))
    labels = Tensor(rng.integers(0, vocab, n).astype(np.int32))
    wts = Tensor(np.full(n, 1.0 / n, np.float32))
    out = {}
    for name, fn in (("host", _host_head_ce()), ("device", HeadCrossEntropyFn())):
        grad = ms.value_and_grad(lambda a, b, f=fn: f(a, b, labels, wts)[0], (0, 1))
        out[name] = lambda g=grad: g(h, w)[0].asnumpy()
    return out


def csa_select_cases(rng) -> dict:
    """Host: `csa.Indexer.select` (read the scores, stable ``np.argsort``) and the NumPy mask written back, as
    `CompressedSparseAttention._compressed_mask` and `_bias` do. Device (a candidate, not used by the model):
    a stable ``ops.sort`` of the negated scores (``ops.topk`` picks arbitrary entries among ties, which ReLU
    makes common) and ``tensor_scatter_elements`` (``one_hot`` + sum was 8× the host here)."""
    from mindspore import Tensor, ops

    from mftk.engine.layers.csa import Indexer, causal_compressed

    b, s, n, k, ratio = 2, 512, 128, 16, 4
    ind = Indexer(512, 256, 8, 32, k, ratio, 16, 1e-6)
    scores = Tensor(rng.normal(0, 1, (b, s, n)).astype(np.float32))
    hidden = causal_compressed(s, n, ratio)[None].repeat(b, 0)
    hidden_t, zeros, ones = Tensor(hidden), Tensor(np.zeros((b, s, n + 1), np.float32)), Tensor(np.ones((b, s, k), np.float32))

    def host():
        idx = ind.select(scores, s)
        keep = np.zeros((b, s, n + 1), bool)
        np.put_along_axis(keep, np.where(idx < 0, n, idx), True, -1)
        return Tensor(np.where(keep[..., :n], 0.0, -1e30).astype(np.float32)).sum().asnumpy()

    def device():
        ordered, order = ops.sort(ops.masked_fill(-scores, hidden_t, float("inf")), -1)
        idx = ops.masked_fill(order[..., :k], ordered[..., :k] == float("inf"), n)
        kept = ops.tensor_scatter_elements(zeros, idx, ones, axis=2)[..., :n]
        return ((1.0 - kept) * -1e30).sum().asnumpy()

    return {"host": host, "device": device}


def sinkhorn_cases(tokens: int, rng) -> dict:
    import mindspore as ms
    from mindspore import Tensor

    from mftk.engine.layers.kernels_v4 import SinkhornFn, sinkhorn_ops

    n, iters, eps = 4, 20, 1e-6
    logits = Tensor(rng.normal(0, 1, (tokens, n, n)).astype(np.float32))
    g = Tensor(rng.normal(0, 1, (tokens, n, n)).astype(np.float32))
    host_fn = SinkhornFn(iters, eps)
    host = ms.grad(lambda t: (host_fn(t)[0] * g).sum())
    device = ms.grad(lambda t: (sinkhorn_ops(t, iters, eps) * g).sum())

    def loss(t, gg):
        return (sinkhorn_ops(t, iters, eps) * gg).sum()

    compiled = ms.jit(loss)  # one graph, as hyper.py's `_MIX_COMPILED`
    device_jit = ms.grad(lambda t: compiled(t, g))
    return {"host": lambda: host(logits).asnumpy(), "device": lambda: device(logits).asnumpy(),
            "device_jit": lambda: device_jit(logits).asnumpy()}


def moe_dispatch_cases(shape: str, rng) -> dict:
    from mindspore import Tensor

    from mftk.engine.layers.grouped import padded_layout, padded_layout_ops

    t, k, e = (int(v) for v in shape.split(","))
    idx = Tensor(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]).astype(np.int32))

    def host():
        slot_pair, slot_token, counts, n = padded_layout(idx.asnumpy().reshape(-1), e, k)
        return (Tensor(slot_token.astype(np.int32)).asnumpy(), Tensor(slot_pair.astype(np.int32)).asnumpy())

    def device():
        slot_pair, slot_token, _, _ = padded_layout_ops(idx, e)
        return slot_token.asnumpy(), slot_pair.asnumpy()

    return {"host": host, "device": device}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--tokens", type=int, default=256, help="head_ce tokens (bench/train_step.py: 1024)")
    ap.add_argument("--sinkhorn-tokens", type=int, default=128, help="sinkhorn N = B·S (bench/train_step.py: 1024)")
    ap.add_argument("--moe-shape", default="128,2,8", help="moe_dispatch T,K,E (bench/train_step.py V4: 1024,2,8)")
    ap.add_argument("--cases", default="head_ce,csa_select,sinkhorn,moe_dispatch",
                    help="comma-separated: head_ce, csa_select, sinkhorn, moe_dispatch")
    args = ap.parse_args()
    import mindspore as ms

    ms.runtime.launch_blocking()  # mftk's CPU default
    rng = np.random.default_rng(0)
    builders = {"head_ce": lambda: head_ce_cases(args.tokens, rng), "csa_select": lambda: csa_select_cases(rng),
                "sinkhorn": lambda: sinkhorn_cases(args.sinkhorn_tokens, rng),
                "moe_dispatch": lambda: moe_dispatch_cases(args.moe_shape, rng)}
    for case in args.cases.split(","):
        fns = builders[case]()
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()  # warm-up
        for _ in range(args.rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        med = {name: statistics.median(t) for name, t in times.items()}
        others = ", ".join(f"{name} {med[name] * 1e3:.1f} ms ({name}/host {med[name] / med['host']:.3f})"
                           for name in fns if name != "host")
        print(f"{case}: host {med['host'] * 1e3:.1f} ms, {others} (median of {args.rounds}, interleaved)")


if __name__ == "__main__":
    main()
