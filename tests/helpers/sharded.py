"""A two-rank sharded checkpoint written through mftk's writer, and a bit-for-bit comparison."""
from __future__ import annotations

import numpy as np

from mftk.ckpt.common import CommonInfo
from mftk.ckpt.metadata import ShardedTensor, build_metadata
from mftk.ckpt.save import begin_save, finalize_save, write_rank_files


def two_rank_checkpoint(tmp_path):
    """FSDP-like: w split in two rows, a bias and global_step replicated (stored in both rank files)."""
    full = np.arange(32, dtype=np.float32).reshape(8, 4)
    full[0, 0] = -0.0
    w = ShardedTensor(global_shape=(8, 4), axis_fragmentations=(2, 1), holders={0: 0, 1: 1})
    rep = ShardedTensor(global_shape=(4,), axis_fragmentations=(1,), holders={0: 0, 1: 0})
    step = ShardedTensor(global_shape=(1,), axis_fragmentations=(1,), holders={0: 0, 1: 0})
    bias = np.array([np.nan, -0.0, 1.5, -2.0], np.float32)
    tmp = begin_save(tmp_path, 6)
    for rank in (0, 1):
        part = full[4 * rank:4 * rank + 4]
        write_rank_files(tmp, rank=rank, world=2, step=6, model={"w": part, "b": bias},
                         optimizer={"adam_m.w": part * 2, "adam_m.b": bias, "global_step": np.array([6], np.int64)},
                         extra={})
    meta = build_metadata({"w": w, "b": rep}, {"adam_m.w": w, "adam_m.b": rep, "global_step": step}, world=2)
    finalize_save(tmp_path, 6, common=CommonInfo.for_step(step=6, max_steps=9, global_batch_size=4,
                                                         consumed_samples=24), world=2, metadata=meta)
    return tmp_path / "iteration_00000006"


def assert_bits_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for n in a:
        assert a[n].dtype == b[n].dtype and a[n].shape == b[n].shape, n
        assert a[n].tobytes() == b[n].tobytes(), n  # bit for bit (NaN, -0.0 included)
