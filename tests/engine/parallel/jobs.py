"""Worker-side bodies for the msrun tests: each runs on every rank and returns JSON-able results.

The input data comes from the numpy functions at the top, which the tests call too, so the
parent builds its single-process numpy reference from exactly the same arrays.
"""
from __future__ import annotations

import numpy as np

B, S, H, F, V = 2, 4, 8, 12, 16


def tp_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    return {"x": rng.normal(size=(B, S, H)).astype(np.float32),
            "w1": (rng.normal(size=(F, H)) * 0.3).astype(np.float32),
            "w2": (rng.normal(size=(H, F)) * 0.3).astype(np.float32),
            "r": rng.normal(size=(B, S, H)).astype(np.float32)}


def vocab_data() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    labels = rng.integers(0, V, size=(B, S)).astype(np.int32)
    labels[0, 1] = -100
    mask = np.ones((B, S), np.float32)
    mask[1, 3] = 0.0
    return {"ids": rng.integers(0, V, size=(B, S)).astype(np.int32), "labels": labels, "mask": mask,
            "emb": (rng.normal(size=(V, H)) * 0.5).astype(np.float32),
            "head": (rng.normal(size=(V, H)) * 0.5).astype(np.float32)}


def _l(t) -> list:
    return np.asarray(t.asnumpy() if hasattr(t, "asnumpy") else t, np.float64).tolist()


# ---------------------------------------------------------------- 2-rank job


def two_rank_checks() -> dict:
    """Collectives, TP+SP MLP, vocab-parallel embedding + CE and a 2-stage pipeline on 2 ranks."""
    from mindspore import communication

    from mftk.engine.parallel.groups import create_groups
    from mftk.derive import Layout

    world = communication.get_group_size()
    tp_groups = create_groups(Layout(world=world, tp=world))
    out = {"rank": communication.get_rank()}
    out["collectives"] = _collectives(tp_groups.tp)
    out["tp_mlp"] = _tp_mlp(tp_groups.tp, sequence_parallel=True)
    out["tp_mlp_nosp"] = _tp_mlp(tp_groups.tp, sequence_parallel=False)
    out["vocab"] = _vocab(tp_groups.tp)
    pp_groups = create_groups(Layout(world=world, pp=world))
    out["pp_1f1b"] = _pipeline(pp_groups.pp, "1f1b")
    out["pp_gpipe"] = _pipeline(pp_groups.pp, "gpipe")
    return out


def _collectives(g) -> dict:
    from mindspore import Tensor
    import mindspore as ms

    from mftk.engine.parallel import comm

    r = g.rank
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * r)
    res = {"sum": _l(comm.all_reduce(x, g)), "avg": _l(comm.all_reduce(x, g, "avg")),
           "max": _l(comm.all_reduce(x, g, "max")), "input_unchanged": _l(x),
           "gather1": _l(comm.all_gather(x, g, 1)), "rs0": _l(comm.reduce_scatter(x, g, 0)),
           "bcast1": _l(comm.broadcast(x, g, 1)), "a2a": _l(comm.all_to_all(x, g, split_dim=0, concat_dim=1))}
    # uneven: rank r sends r+1 rows to member 0 and 1 row to member 1
    counts = [r + 1, 1]
    rows = Tensor(np.full((sum(counts), 2), r, np.float32) + np.arange(sum(counts), dtype=np.float32)[:, None])
    got, received = comm.all_to_all_uneven(rows, counts, g)
    res["a2a_uneven"], res["a2a_uneven_counts"] = _l(got), received
    # point to point: 0 -> 1, then 1 -> 0 doubled
    if r == 0:
        comm.send(Tensor(np.array([1.5, 2.5], np.float32)), 1, g)
        res["p2p"] = _l(comm.recv((2,), ms.float32, 1, g))
    else:
        got = comm.recv((2,), ms.float32, 0, g)
        comm.send(got * 2, 0, g)
        res["p2p"] = _l(got)
    res.update(_packed(g))
    comm.barrier(g)
    return res


def packed_blocks(rank: int) -> list[np.ndarray]:
    """Row blocks of four shapes (6, 2, 12, 2 elements): with 8 elements per message, packs [0, 1], [2], [3]."""
    return [np.arange(n, dtype=np.float32).reshape(shape) + 100 * rank + 10 * i
            for i, (n, shape) in enumerate([(6, (2, 3)), (2, (1, 2)), (12, (3, 4)), (2, (2, 1))])]


def _packed(g) -> dict:
    """The FSDP unit collectives (`comm.all_gather_rows_many`, `comm.all_reduce_many`) with small messages."""
    from mftk.engine.parallel import comm

    chunk, comm.REDUCE_CHUNK = comm.REDUCE_CHUNK, 8
    try:
        packs = comm.packs(packed_blocks(g.rank))
        gathered = comm.all_gather_rows_many(packed_blocks(g.rank), g)
        reduced = comm.all_reduce_many(packed_blocks(g.rank), g, "avg")
    finally:
        comm.REDUCE_CHUNK = chunk
    return {"packs": packs, "gathered": [_l(a) for a in gathered], "reduced": [_l(a) for a in reduced]}


def _tp_mlp(g, *, sequence_parallel: bool) -> dict:
    """fc1 column-wise, fc2 row-wise (plain `Linear`s cut by the TP styles); without SP, Megatron's f/g: the
    input is whole, its gradient and the row-wise output are summed over the group."""
    import mindspore as ms
    from mindspore import Tensor, nn, ops

    from mftk.engine.layers.linear import Linear
    from mftk.engine.parallel import comm
    from mftk.engine.parallel.tensor_parallel import Sharded, block, columnwise, rowwise

    d = tp_data()

    class Mlp(nn.Cell):
        def __init__(self):
            super().__init__()
            fc1, fc2 = Linear(H, F), Linear(F, H)
            fc1.weight.set_data(Tensor(d["w1"]))
            fc2.weight.set_data(Tensor(d["w2"]))
            if sequence_parallel:
                self.fc1, self.fc2 = columnwise(fc1, g, gather_input=True), rowwise(fc2, g)
            else:
                fc1.weight.set_data(Tensor(block(d["w1"], g, 0)))
                fc2.weight.set_data(Tensor(block(d["w2"], g, 1)))
                self.fc1 = Sharded(fc1, enter=comm.CopyToGroup(g))
                self.fc2 = Sharded(fc2, leave=comm.ReduceFromGroup(g))

        def construct(self, x, r):
            return (self.fc2(ops.tanh(self.fc1(x))) * r).sum()

    net = Mlp()
    if sequence_parallel:  # activations and the loss weights split along the sequence
        x, r = Tensor(block(d["x"], g, 1)), Tensor(block(d["r"], g, 1))
    else:
        x, r = Tensor(d["x"]), Tensor(d["r"])
    params = net.trainable_params()
    loss, (dx, grads) = ms.value_and_grad(net, (0,), params)(x, r)
    if sequence_parallel:
        loss = comm.all_reduce(loss.reshape(1), g)  # each rank's loss covers its tokens only
    return {"loss": _l(loss.reshape(-1))[0], "dx": _l(dx), "dw1": _l(grads[0]), "dw2": _l(grads[1])}


def _vocab(g) -> dict:
    import mindspore as ms
    from mindspore import Tensor, nn

    from mftk.engine.layers.embedding import VocabEmbedding
    from mftk.engine.layers.linear import Linear
    from mftk.engine.parallel.tensor_parallel import (VocabParallelCrossEntropy, VocabParallelEmbedding, columnwise,
                                                      vocab_parallel_masked_mean_ce)

    d = vocab_data()

    class Lm(nn.Cell):
        def __init__(self):
            super().__init__()
            emb, head = VocabEmbedding(V, H), Linear(H, V)
            emb.weight.set_data(Tensor(d["emb"]))
            head.weight.set_data(Tensor(d["head"]))
            self.emb = VocabParallelEmbedding(emb, g)
            self.head = columnwise(head, g, gather_input=True)
            self.ce = VocabParallelCrossEntropy(g)

        def construct(self, ids, labels, mask):
            return vocab_parallel_masked_mean_ce(self.head(self.emb(ids)), labels, mask, self.ce)

    net = Lm()
    loss, grads = ms.value_and_grad(net, None, net.trainable_params())(
        Tensor(d["ids"]), Tensor(d["labels"]), Tensor(d["mask"]))
    return {"loss": float(loss.asnumpy()), "demb": _l(grads[0]), "dhead": _l(grads[1])}


def _pipeline(g, schedule: str) -> dict:
    """The TP-test MLP split in 2 stages (fc1+tanh | fc2 + weighted sum), 4 micro-batches along S."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, ops

    from mftk.engine.parallel.pipeline import PipelineStage, make_schedule, split_micro_batches

    d, m = tp_data(), 4
    losses = []
    if g.rank == 0:
        w = Parameter(Tensor(d["w1"]), name="w1")
        xs = split_micro_batches(Tensor(d["x"]), m, 1)

        def fn(chunk, x, i):  # x: the float zero of the first stage
            return ops.tanh(ops.matmul(xs[i] + x, w.T)), Tensor(0.0, ms.float32)
    else:
        w = Parameter(Tensor(d["w2"]), name="w2")
        rs = split_micro_batches(Tensor(d["r"]), m, 1)

        def fn(chunk, a, i):
            loss = (ops.matmul(a, w.T) * rs[i]).sum()
            losses.append((i, float(loss.asnumpy())))
            return loss
    stage = PipelineStage(fn, [[w]], g, act_shape=(B, S // m, F), act_dtype=ms.float32)
    grads = stage.step(m, lambda rank: make_schedule(schedule, m, g.size, rank))
    per_micro = dict(losses)  # the recomputed forward records the same value again
    return {"losses": [per_micro[i] for i in sorted(per_micro)], "grad": _l(grads[id(w)])}


# ---------------------------------------------------------------- 4-rank job


def four_rank_groups() -> dict:
    """tp2 × dp2 groups: sub-group all-reduce / all-gather / broadcast / send-recv see the right members."""
    import mindspore as ms
    from mindspore import Tensor, communication

    from mftk.engine.parallel import comm
    from mftk.engine.parallel.groups import create_groups
    from mftk.derive import Layout

    rank = communication.get_rank()
    groups = create_groups(Layout(world=4, tp=2, dp_shard=2, ep=2))
    x = Tensor(np.array([float(rank)], np.float32))
    out = {"rank": rank, "tp_ranks": list(groups.tp.ranks), "dp_ranks": list(groups.dp.ranks),
           "ep_ranks": list(groups.ep.ranks)}
    out["tp_sum"] = _l(comm.all_reduce(x, groups.tp))[0]
    out["dp_sum"] = _l(comm.all_reduce(x, groups.dp))[0]
    out["dp_max"] = _l(comm.all_reduce(x, groups.dp, "max"))[0]
    out["tp_gather"] = _l(comm.all_gather(x, groups.tp))
    out["dp_gather"] = _l(comm.all_gather(x, groups.dp))
    out["world_gather"] = _l(comm.all_gather(x, groups.world))
    out["dp_bcast"] = _l(comm.broadcast(x, groups.dp, 1))[0]
    peer = 1 - groups.dp.rank  # exchange with the other data-parallel rank (lower sends first)
    if groups.dp.rank == 0:
        comm.send(x, peer, groups.dp)
        out["dp_p2p"] = _l(comm.recv((1,), ms.float32, peer, groups.dp))[0]
    else:
        got = comm.recv((1,), ms.float32, peer, groups.dp)
        comm.send(x, peer, groups.dp)
        out["dp_p2p"] = _l(got)[0]
    return out


# ---------------------------------------------------------------- failure job


def fail_on(rank_to_fail: int, message: str = "boom") -> dict:
    """One rank raises; the others block in a collective the failing rank never joins."""
    import numpy as np
    from mindspore import Tensor, communication, ops

    rank = communication.get_rank()
    if rank == rank_to_fail:
        raise ValueError(f"{message} on rank {rank}")
    ops.AllReduce()(Tensor(np.ones((1,), np.float32))).asnumpy()  # hangs until the launcher kills it
    return {"rank": rank}


# ---------------------------------------------------------------- port claim job


def port_claim_held() -> dict:
    """Whether this job's port range is claimed while it runs (a fresh claim of the scheduler's port fails), and
    whether this worker holds the claim itself (inherited: it outlives a killed parent)."""
    import os

    from mftk.engine.ports import try_claim

    port = int(os.environ["MS_SCHED_PORT"])
    claim = try_claim(port)
    held = claim is None
    if claim is not None:
        claim.release()
    fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
           if os.path.islink(f"/proc/self/fd/{fd}")]
    return {"port": port, "held": held, "inherited": any(f.endswith(f"/{port}.lock") for f in fds)}
