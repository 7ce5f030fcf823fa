"""Independent reference: safetensors bytes packed by hand with struct (no mftk code involved)."""
from __future__ import annotations

import json
import struct
from pathlib import Path


def pack(entries: list[tuple[str, str, list[int], bytes]], *, metadata: dict | None = None) -> bytes:
    """Header JSON in the given order, data back to back, no padding (valid per the format)."""
    head: dict = {"__metadata__": metadata} if metadata else {}
    pos = 0
    for name, dtype, shape, data in entries:
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
    raw = json.dumps(head).encode()
    return struct.pack("<Q", len(raw)) + raw + b"".join(e[3] for e in entries)


def write(path: Path, entries: list[tuple[str, str, list[int], bytes]]) -> Path:
    path.write_bytes(pack(entries))
    return path


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def mf_step_dir(root: Path, step: int = 4, *, opt: bool = True, gbs: int = 2) -> Path:
    """A single-card checkpoint written without mftk: w = [[1,2],[3,4]], b = [0.5, -0.5] (bf16 bits)."""
    d = root / f"iteration_{step:08d}"
    d.mkdir(parents=True)
    bf16 = struct.pack("<2H", 0x3F00, 0xBF00)  # 0.5, -0.5
    write(d / "checkpoint-model-0000000-0000001.safetensors",
          [("w", "F32", [2, 2], f32(1, 2, 3, 4)), ("b", "BF16", [2], bf16)])
    if opt:
        write(d / "checkpoint-opt-0000000-0000001.safetensors",
              [("adam_m.w", "F32", [2, 2], f32(0, 0, 0, 0)), ("adam_v.w", "F32", [2, 2], f32(0, 0, 0, 0)),
               ("global_step", "I64", [1], struct.pack("<q", step))])
    (d / "common.json").write_text(json.dumps({
        "epoch_num": 1, "step_num": 10, "global_step": step, "loss_scale": 1.0,
        "global_batch_size": gbs, "consumed_samples": step * gbs, "ckpt_status": None}, indent=4))
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return d


