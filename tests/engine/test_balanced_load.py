"""`load_balanced` in one process: two simulated ranks exchange their packed broadcasts through a fake
collective; each must end with `load_global`'s tensors bit for bit (bf16, int64, NaN, -0.0), having read
only its share. The real msrun run is in tests/commands/test_train_distributed.py."""

import mftk.engine.parallel.comm as comm
from mftk.ckpt.load import load_global
from mftk.engine import balanced_load as bl
from tests.helpers.sharded import assert_bits_equal as _bits_equal, two_rank_checkpoint as _two_rank
from tests.helpers.handmade import mf_step_dir


def _run_two_ranks(monkeypatch, path, kinds=("model", "opt")):
    sent: dict[int, list] = {0: [], 1: []}  # what each source broadcast, in call order
    calls = {"n": 0}

    def record(t, group, src_index=0):  # pass 1: the source's buffers are the truth; receivers get junk
        if group.rank == src_index:
            sent[src_index].append(t.asnumpy().copy())
        return t

    for rank in (0, 1):
        monkeypatch.setattr(comm, "broadcast", record)
        bl.load_balanced(path, rank=rank, world=2, kinds=kinds)
    results = []
    for rank in (0, 1):
        cursor = {0: 0, 1: 0}

        def deliver(t, group, src_index=0):
            buf = sent[src_index][cursor[src_index]]
            cursor[src_index] += 1
            assert buf.shape == tuple(t.shape) and buf.dtype == t.asnumpy().dtype  # the receiver's size agrees
            calls["n"] += 1
            from mindspore import Tensor
            return Tensor(buf)

        monkeypatch.setattr(comm, "broadcast", deliver)
        results.append(bl.load_balanced(path, rank=rank, world=2, kinds=kinds))
    return results, calls["n"]


def test_two_ranks_get_load_global_bit_for_bit(tmp_path, monkeypatch):
    d = _two_rank(tmp_path)
    (r0, r1), n = _run_two_ranks(monkeypatch, d)
    ref = load_global(d)
    for r in (r0, r1):
        _bits_equal({**r.model, **r.optimizer}, ref)
        assert set(r.optimizer) == {"adam_m.w", "adam_m.b", "global_step"}
    assert n == 4  # one packed broadcast per source per rank
    assert r0.stats.bytes_read + r1.stats.bytes_read == r0.stats.bytes_total == 296
    assert r0.stats.units_read + r1.stats.units_read == r0.stats.units_total == 7
    assert "Balanced load: rank 1 read" in r1.stats.describe()


def test_single_card_with_bf16_and_int64(tmp_path, monkeypatch):
    d = mf_step_dir(tmp_path)
    (r0, r1), _ = _run_two_ranks(monkeypatch, d, kinds=("model",))
    for r in (r0, r1):
        _bits_equal(r.model, load_global(d, ["w", "b"]))
        assert r.optimizer == {}


def test_batches_are_capped(monkeypatch):
    monkeypatch.setattr(bl, "BATCH_BYTES", 100)

    class U:
        def __init__(self, n):
            self.out_nbytes = n

    units = [U(60), U(30), U(20), U(200), U(10)]
    assert bl._batches([0, 1, 2, 3, 4], units) == [[0, 1], [2], [3], [4]]
