"""inspect-ckpt reads headers only: time it against a full tensor read of the same checkpoint.

Run: .venv/bin/python bench/ckpt_inspect.py [MiB]   (default 256 MiB of fp32 tensors)
"""
from __future__ import annotations

import sys
import tempfile
import time

import numpy as np

from mftk.ckpt.common import CommonInfo
from mftk.ckpt.inspect import inspect_checkpoint
from mftk.ckpt.save import save_checkpoint


def main(mib: int = 256) -> None:
    n_tensors = 64
    per = mib * 1024 * 1024 // 4 // n_tensors
    rng = np.random.default_rng(0)
    model = {f"decoder.layers.{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(n_tensors)}
    with tempfile.TemporaryDirectory() as root:
        t0 = time.perf_counter()
        save_checkpoint(root, step=1, common=CommonInfo.for_step(step=1, max_steps=1, global_batch_size=1,
                                                                 consumed_samples=1), model=model)
        t_save = time.perf_counter() - t0
        t0 = time.perf_counter()
        inspect_checkpoint(root, verify=True, quick=True)
        t_head = time.perf_counter() - t0
        t0 = time.perf_counter()
        inspect_checkpoint(root, verify=True, read_tensors=True)
        t_full = time.perf_counter() - t0
    print(f"{mib} MiB, {n_tensors} tensors: save {t_save:.3f}s ({mib / t_save:.0f} MiB/s incl. fsync), "
          f"inspect+verify headers {t_head * 1000:.1f} ms, with --tensors {t_full:.3f}s, "
          f"ratio {t_full / t_head:.0f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 256)
