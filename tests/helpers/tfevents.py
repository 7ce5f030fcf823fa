"""An independent reader of TensorBoard event files for tests: TFRecord framing with CRC32C checks
and a hand-written decoder of the few Event/Summary protobuf fields we write (no tensorboardX)."""
from __future__ import annotations

import struct
from pathlib import Path


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path: Path) -> list[bytes]:
    """Every record's payload; asserts both CRCs of each record."""
    buf, out, i = Path(path).read_bytes(), [], 0
    while i < len(buf):
        header = buf[i:i + 8]
        (n,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", buf[i + 8:i + 12])
        assert hcrc == masked_crc(header), f"bad length crc at offset {i}"
        data = buf[i + 12:i + 12 + n]
        (dcrc,) = struct.unpack("<I", buf[i + 12 + n:i + 16 + n])
        assert dcrc == masked_crc(data), f"bad data crc at offset {i}"
        out.append(data)
        i += 16 + n
    return out


def _varint(b: bytes, i: int) -> tuple[int, int]:
    shift = v = 0
    while True:
        x = b[i]
        v |= (x & 0x7F) << shift
        i += 1
        if not x & 0x80:
            return v, i
        shift += 7


def fields(b: bytes) -> list[tuple[int, int, object]]:
    """(field number, wire type, value) of a protobuf message; value is int or bytes."""
    out, i = [], 0
    while i < len(b):
        key, i = _varint(b, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = _varint(b, i)
        elif wt == 1:
            v, i = b[i:i + 8], i + 8
        elif wt == 2:
            n, i = _varint(b, i)
            v, i = b[i:i + n], i + n
        elif wt == 5:
            v, i = b[i:i + 4], i + 4
        else:
            raise ValueError(f"wire type {wt}")
        out.append((num, wt, v))
    return out


def scalars(path: Path) -> tuple[dict[str, list[tuple[int, float]]], list[str]]:
    """``{tag: [(step, value), ...]}`` of simple_value summaries, and the tags of the other summaries."""
    found: dict[str, list[tuple[int, float]]] = {}
    others: list[str] = []
    for rec in records(path):
        ev = fields(rec)
        step = next((v for n, _, v in ev if n == 2), 0)
        for n, _, summary in ev:
            if n != 5:
                continue
            for vn, _, value in fields(summary):
                if vn != 1:
                    continue
                vf = {num: v for num, _, v in fields(value)}
                tag = vf[1].decode()
                if 2 in vf:
                    found.setdefault(tag, []).append((step, struct.unpack("<f", vf[2])[0]))
                else:
                    others.append(tag)
    return found, others


def event_file(logdir: Path) -> Path:
    files = sorted(Path(logdir).glob("events.out.tfevents.*"))
    assert len(files) == 1, files
    return files[0]
