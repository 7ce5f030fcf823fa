"""AdamW update: mftk's flat vectorised numpy update vs a per-parameter loop, side by side; and the
host update (gradients copied to the flat numpy buffer, numpy AdamW) vs the device-resident one
(`engine.device_optim.DeviceAdamW`: fp32 accumulation and MindSpore's fused AdamWeightDecay per parameter)
on MindSpore's CPU device, interleaved, medians — why the host update stays the default on CPU.

Shapes are a Qwen-like 4-layer GPT (d=512, ffn 1408, vocab 32000, about 29 M params, as in
mindspore-cpu.md §2). Prints median seconds per update and the ratio. Run:
    .venv/bin/python bench/optim_update.py
"""
import time

import numpy as np

from mftk.engine.optim import AdamW, decide_weight_decay


def shapes():
    out = [("embedding.word_embeddings.weight", (32000, 512))]
    for i in range(4):
        p = f"decoder.layers.{i}."
        out += [(p + "input_layernorm.weight", (512,)), (p + "self_attention.linear_qkv.weight", (1536, 512)),
                (p + "self_attention.linear_proj.weight", (512, 512)), (p + "pre_mlp_layernorm.weight", (512,)),
                (p + "mlp.linear_fc1.weight", (2816, 512)), (p + "mlp.linear_fc2.weight", (512, 1408))]
    return out + [("decoder.final_layernorm.weight", (512,))]


def per_param_loop(params, grads, m, v, t, lr, wd, b1=0.9, b2=0.95, eps=1e-8):
    """The straightforward way: one set of numpy ops per parameter."""
    for p, g, mm, vv, w in zip(params, grads, m, v, wd):
        p *= np.float32(1 - lr * w)
        mm *= b1
        mm += (1 - b1) * g
        vv *= b2
        vv += (1 - b2) * g * g
        p -= (lr / (1 - b1 ** t)) * mm / (np.sqrt(vv / (1 - b2 ** t)) + eps)


def median(fn, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return sorted(times)[n // 2]


def main():
    rng = np.random.default_rng(0)
    sh = shapes()
    arrays = [rng.normal(size=s).astype(np.float32) for _, s in sh]
    grads = [rng.normal(size=s).astype(np.float32) for _, s in sh]
    dec = decide_weight_decay(sh, 0.1)
    opt = AdamW([n for n, _ in sh], arrays, dec)
    flat = opt.zeros_like_flat()
    opt.add_grads(flat, grads)
    n_params = sum(a.size for a in arrays)

    params = [a.copy() for a in arrays]
    m = [np.zeros_like(a) for a in arrays]
    v = [np.zeros_like(a) for a in arrays]
    wd = [d.weight_decay for d in dec]
    state = {"t": 0}

    def loop():
        state["t"] += 1
        per_param_loop(params, grads, m, v, state["t"], 1e-3, wd)

    flat_s = median(lambda: opt.step(flat, 1e-3))
    loop_s = median(loop)
    acc_s = median(lambda: opt.add_grads(opt.zeros_like_flat(), grads))
    print(f"params: {n_params / 1e6:.1f} M")
    print(f"flat vectorised update : {flat_s * 1000:8.1f} ms")
    print(f"per-parameter loop     : {loop_s * 1000:8.1f} ms")
    print(f"ratio (loop / flat)    : {loop_s / flat_s:8.2f}x")
    print(f"gradient flatten (fp32 accumulate into flat buffer): {acc_s * 1000:.1f} ms")
    host_s, dev_s = host_vs_device(sh, arrays, grads, dec)
    print(f"host update, grads from tensors (asnumpy + put_grads + step): {host_s * 1000:8.1f} ms")
    print(f"device update on CPU (put_grads + fused step)               : {dev_s * 1000:8.1f} ms")
    print(f"ratio (device / host)                                       : {dev_s / host_s:8.2f}x")


def host_vs_device(sh, arrays, grads, dec, rounds: int = 7):
    """One micro-batch's gradient tensors into the update, then the update: both paths, alternating."""
    import mindspore as ms
    from mindspore import Parameter, Tensor

    from mftk.engine.device_optim import DeviceAdamW

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    names = [n for n, _ in sh]
    host = AdamW(names, arrays, dec)
    dev = DeviceAdamW(names, [Parameter(Tensor(a.copy()), name=n) for n, a in zip(names, arrays)], dec)
    tensors = [Tensor(g) for g in grads]
    buf = host.grad_buffer()

    def host_step():
        host.put_grads(buf, [t.asnumpy() for t in tensors])
        host.step(buf, 1e-3)

    def dev_step():
        acc = dev.grad_buffer()
        dev.put_grads(acc, tensors)
        dev.step(acc, 1e-3)
        dev.master[-1].asnumpy()  # wait for the device's queue

    host_step(), dev_step()  # warm-up
    h, d = [], []
    for _ in range(rounds):
        h.append(median(host_step, 1))
        d.append(median(dev_step, 1))
    return sorted(h)[rounds // 2], sorted(d)[rounds // 2]


if __name__ == "__main__":
    main()
