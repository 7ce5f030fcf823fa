"""Balanced checkpoint loading across ranks (``checkpoint.load_balanced: true``, resume scenario 4).

Without it every rank reads every global tensor from disk (``load_global``), so a world of N reads
the checkpoint N times. Here each unique shard is read by exactly one rank (the assignment of
:mod:`mftk.ckpt.balance`, balanced by bytes) and broadcast from that reader to the others; the
result is the same global tensors, bit for bit, as ``load_global`` on every rank.

Broadcast as raw bytes: a reader packs its pieces into int32 words (padded), so any dtype travels
unchanged (float arithmetic would turn -0.0 into +0.0 in ``comm.broadcast``'s copy; integer
arithmetic cannot change a bit) and one collective carries many small tensors. Batches are capped
at ``BATCH_BYTES`` to bound the extra memory.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Sequence

import attrs
import numpy as np

from mftk.ckpt.balance import ReadUnit, assign, place, read_unit, read_units

log = logging.getLogger("mftk.train")
BATCH_BYTES = 64 * 1024 * 1024
_MIB = 1024 * 1024


@attrs.frozen
class BalancedStats:
    """What this rank read itself versus the whole checkpoint (bytes on disk)."""

    rank: int
    world: int
    units_read: int
    units_total: int
    bytes_read: int
    bytes_total: int
    seconds: float

    def describe(self) -> str:
        share = 100.0 * self.bytes_read / self.bytes_total if self.bytes_total else 0.0
        return (f"Balanced load: rank {self.rank} read {self.bytes_read / _MIB:.2f} MiB of "
                f"{self.bytes_total / _MIB:.2f} MiB ({self.bytes_read} of {self.bytes_total} bytes, {share:.1f}%; "
                f"{self.units_read} of {self.units_total} shards) from disk; the rest by broadcast from the other "
                f"{self.world - 1} rank(s) in {self.seconds:.2f}s")


@attrs.frozen
class BalancedLoad:
    """Global tensors by the kind of file they came from (model weights, optimizer states)."""

    model: dict[str, np.ndarray]
    optimizer: dict[str, np.ndarray]
    stats: BalancedStats


def load_balanced(path: str | os.PathLike, *, rank: int, world: int,
                  kinds: tuple[str, ...] = ("model", "opt")) -> BalancedLoad:
    """Global tensors of the checkpoint at ``path`` (``kinds`` of files only); every rank of the world group
    must call this, with the same arguments but its own ``rank``."""
    t0 = time.perf_counter()
    units = read_units(path, kinds=kinds)
    readers = assign([u.nbytes for u in units], world)
    pieces: dict[int, np.ndarray] = {i: read_unit(u) for i, u in enumerate(units) if readers[i] == rank}
    group = _world_group(rank, world)
    for src in range(world):
        own = [i for i in range(len(units)) if readers[i] == src]
        for batch in _batches(own, units):
            got = _broadcast_batch(batch, units, pieces if src == rank else None, src, group)
            pieces.update(got)
    out: dict[str, dict[str, np.ndarray]] = {"model": {}, "opt": {}}
    for i, u in enumerate(units):
        place(out[u.kind], u, pieces.pop(i))
    mine = [u for i, u in enumerate(units) if readers[i] == rank]
    stats = BalancedStats(rank=rank, world=world, units_read=len(mine), units_total=len(units),
                          bytes_read=sum(u.nbytes for u in mine), bytes_total=sum(u.nbytes for u in units),
                          seconds=time.perf_counter() - t0)
    log.info(stats.describe())
    return BalancedLoad(model=out["model"], optimizer=out["opt"], stats=stats)


def _batches(indices: Sequence[int], units: Sequence[ReadUnit]) -> list[list[int]]:
    """Consecutive groups of at most BATCH_BYTES (a larger unit goes alone)."""
    out: list[list[int]] = []
    size = 0
    for i in indices:
        n = units[i].out_nbytes
        if not out or size + n > BATCH_BYTES:
            out.append([])
            size = 0
        out[-1].append(i)
        size += n
    return out


def _broadcast_batch(batch: list[int], units: Sequence[ReadUnit], pieces: dict[int, np.ndarray] | None,
                     src: int, group) -> dict[int, np.ndarray]:
    """One broadcast of ``batch``'s pieces from ``src``; returns them on receivers ({} on the source)."""
    from mindspore import Tensor

    from mftk.engine.parallel.comm import broadcast

    total = sum(units[i].out_nbytes for i in batch)
    words = (total + 3) // 4
    if words == 0:  # empty tensors only: nothing to send
        return {} if pieces is not None else {i: np.empty(units[i].info.shape, units[i].dtype) for i in batch}
    raw = np.zeros(words * 4, np.uint8)
    if pieces is not None:  # the reader packs what it read
        pos = 0
        for i in batch:
            b = np.ascontiguousarray(pieces[i]).view(np.uint8).reshape(-1)
            raw[pos:pos + b.size] = b
            pos += b.size
    got = broadcast(Tensor(raw.view(np.int32)), group, src_index=src).asnumpy()
    if pieces is not None:
        return {}
    data = np.ascontiguousarray(got).view(np.uint8)
    out: dict[int, np.ndarray] = {}
    pos = 0
    for i in batch:
        u = units[i]
        n = u.out_nbytes
        out[i] = data[pos:pos + n].copy().view(u.dtype).reshape(u.info.shape)
        pos += n
    return out


def _world_group(rank: int, world: int):
    from mindspore.communication.management import GlobalComm

    from mftk.engine.parallel.groups import AxisGroup

    return AxisGroup(name=GlobalComm.WORLD_COMM_GROUP, ranks=tuple(range(world)), rank=rank)
