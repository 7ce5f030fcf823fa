"""What checkpoint checksums cost: seconds per GB to write a checkpoint with and without them, and to verify
one (every tensor's bytes read, CRC-32 compared, NaN/Inf scanned) against a plain read of the same files.

Run: .venv/bin/python bench/ckpt_checksum.py [MiB [REPEATS]]   (default 200 MiB of fp32 tensors, best of 3)

The files are read back from the page cache (just written), so the verify figures are CPU cost, the part
checksums add; a cold read from disk adds the disk's own read time to both verify and a plain resume.
"""
from __future__ import annotations

import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.verify import check_files


def _best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(mib: int = 200, repeats: int = 3) -> None:
    n_tensors = 48
    per = mib * 1024 * 1024 // 4 // n_tensors
    rng = np.random.default_rng(0)
    model = {f"decoder.layers.{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(n_tensors)}
    gb = sum(a.nbytes for a in model.values()) / 1e9
    with tempfile.TemporaryDirectory() as root:
        plain, summed = Path(root) / "plain.safetensors", Path(root) / "summed.safetensors"
        t_crc = _best(lambda: [zlib.crc32(memoryview(a)) for a in model.values()], repeats)
        t_plain = _best(lambda: st.write_file(plain, model, checksums=False), repeats)
        t_summed = _best(lambda: st.write_file(summed, model, checksums=True), repeats)
        t_read = _best(lambda: st.read_tensors(summed), repeats)
        t_verify = _best(lambda: check_files(root, [summed]), repeats)
        assert check_files(root, [summed]).ok
    print(f"{gb * 1000:.0f} MB in {n_tensors} fp32 tensors, best of {repeats} (s/GB):")
    print(f"  CRC-32 alone            {t_crc / gb:.3f}")
    print(f"  write without checksums {t_plain / gb:.3f}  (incl. fsync)")
    print(f"  write with checksums    {t_summed / gb:.3f}  (+{(t_summed - t_plain) / gb:.3f}, "
          f"ratio {t_summed / t_plain:.2f})")
    print(f"  plain read (resume)     {t_read / gb:.3f}  (page cache)")
    print(f"  verify                  {t_verify / gb:.3f}  (read + CRC-32 + NaN/Inf; ratio to a plain read "
          f"{t_verify / t_read:.2f})")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
