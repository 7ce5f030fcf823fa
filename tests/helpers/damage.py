"""Checkpoints damaged on purpose, as a disk or a careless copy would: a flipped exponent bit, a NaN written
over a weight, both in place (the header and its recorded checksums unchanged)."""
from __future__ import annotations

import struct

import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.ckpt.common import CommonInfo
from mftk.ckpt.save import save_checkpoint

MODEL = "checkpoint-model-0000000-0000001.safetensors"


def save_small(root, step):
    """A single-process checkpoint of a 3x4 float32 ``w`` (0.01..0.02 times the step) and a float16 ``b``."""
    w = np.linspace(0.01, 0.02, 12, dtype=np.float32).reshape(3, 4) * step
    model = {"w": w, "b": np.array([0.5, -1.0], np.float16)}
    opt = {"adam_m.w": np.zeros((3, 4), np.float32), "global_step": np.array([step], np.int64)}
    common = CommonInfo.for_step(step=step, max_steps=10, global_batch_size=2, consumed_samples=2 * step)
    return save_checkpoint(root, step=step, common=common, model=model, optimizer=opt)


def flip_exponent_bit(path, tensor, element=0):
    """Flip bit 30 of one float32 element (the top exponent bit): 0.01 becomes about 3.4e36, still finite."""
    h = st.read_header(path)
    pos = h.data_start + h.tensors[tensor].begin + 4 * element + 3  # little-endian: the top byte is last
    with open(path, "r+b") as f:
        f.seek(pos)
        byte = f.read(1)[0]
        f.seek(pos)
        f.write(bytes([byte ^ 0x40]))


def write_nan(path, tensor, element=0):
    """Overwrite one float32 element with a quiet NaN, in place (the header and its checksums unchanged)."""
    h = st.read_header(path)
    with open(path, "r+b") as f:
        f.seek(h.data_start + h.tensors[tensor].begin + 4 * element)
        f.write(struct.pack("<I", 0x7FC00000))
