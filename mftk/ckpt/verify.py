"""Whether a checkpoint's tensor bytes are the ones that were written, and finite.

Every safetensors file mftk writes records each tensor's CRC-32 in its header metadata
(`safetensors_io.CHECKSUM_KEY`). Checking a file reads every tensor once: its bytes against the
recorded checksum (a flipped bit on disk, a torn write) and, for floating tensors, for NaN or
infinity (a file written without checksums, or by another tool, gets that check only). Problems are
collected, one line each naming the file and the tensor, never raised, so a caller can list them all or
fall back to an older checkpoint (`mftk.ckpt.resume.select_checkpoint`).
"""
from __future__ import annotations

import os
from pathlib import Path

import attrs
import numpy as np

from mftk.ckpt import safetensors_io as st
from mftk.errors import CheckpointError
from mftk.files import open_regular


@attrs.frozen
class FileCheck:
    """One file: its problems (``"<file>: <tensor>: ..."``) and whether it carried checksums."""

    path: str
    problems: tuple[str, ...]
    checksummed: bool
    bytes_read: int = 0


@attrs.frozen
class DirCheck:
    """Every weight/optimizer file of one checkpoint dir."""

    step_dir: str
    problems: tuple[str, ...]
    unchecksummed: tuple[str, ...]  # file names written without checksums (checked for NaN/Inf only)
    bytes_read: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def note(self) -> str | None:
        """What a reader should know about files that carry no checksums, or None."""
        if not self.unchecksummed:
            return None
        return (f"{Path(self.step_dir).name}: {len(self.unchecksummed)} file(s) carry no checksums (saved by an "
                "older mftk or another tool): their bytes cannot be verified, only checked for NaN/Inf")


def check_file(path: str | os.PathLike, *, finite: bool = True) -> FileCheck:
    """Read every tensor of ``path`` once: checksum (when recorded) and NaN/Inf (``finite``)."""
    from mftk.ckpt.save import non_finite

    name = Path(path).name
    try:
        h = st.read_header(path)
        sums = st.recorded_checksums(h)
    except CheckpointError as exc:
        return FileCheck(str(path), tuple(_lines(name, exc)), checksummed=False)
    problems: list[str] = []
    if sums is not None:
        problems += [f"{name}: {t}: no checksum recorded" for t in h.tensors if t not in sums]
        problems += [f"{name}: {t}: checksum recorded for a tensor the file does not hold" for t in sums
                     if t not in h.tensors]
    total = 0
    try:
        with open_regular(h.path, error=CheckpointError, what="safetensors file") as fh:
            for t in h.tensors.values():
                buf = st.read_tensor_bytes(fh, h, t)
                total += len(buf)
                if sums is not None and t.name in sums and st.crc32(buf) != sums[t.name]:
                    problems.append(f"{name}: {t.name}: checksum mismatch (recorded {sums[t.name]}, the bytes "
                                    f"give {st.crc32(buf)}): the data changed after it was written")
                elif finite and _float(t.dtype) and non_finite({t.name: _view(t, buf)}):
                    problems.append(f"{name}: {t.name}: holds NaN or infinity")
    except CheckpointError as exc:
        problems += _lines(name, exc)
    except OSError as exc:
        problems.append(f"{name}: cannot be read ({exc.strerror or exc})")
    return FileCheck(str(path), tuple(problems), checksummed=sums is not None, bytes_read=total)


def check_files(step_dir: str | os.PathLike, files: list[Path], *, finite: bool = True) -> DirCheck:
    """`check_file` over ``files`` (a step dir's, an HF dir's)."""
    problems: list[str] = []
    plain: list[str] = []
    total = 0
    for p in files:
        fc = check_file(p, finite=finite)
        problems += fc.problems
        total += fc.bytes_read
        if not fc.checksummed:
            plain.append(p.name)
    return DirCheck(str(step_dir), tuple(problems), tuple(plain), total)


def check_step_dir(step_dir: str | os.PathLike, *, finite: bool = True) -> DirCheck:
    """A checkpoint dir as a resume would use it: its rank files are consistent, ``common.json`` reads, every
    rank has its model file, and every model/optimizer file verifies."""
    from mftk.ckpt.common import read_common
    from mftk.ckpt.layout import scan_step_dir

    d = Path(step_dir)
    try:
        files = scan_step_dir(d)
        read_common(d)
    except (CheckpointError, OSError) as exc:
        lines = _lines(d.name, exc) if isinstance(exc, CheckpointError) else [f"{d.name}: {exc}"]
        return DirCheck(str(d), tuple(lines), ())
    problems = list(files.problems)
    if files.world == 0:
        problems.append("no *-model-*.safetensors files")
    problems += [f"rank {r}: model file missing" for r in files.missing_model_ranks]
    checked = check_files(d, [*files.model.values(), *files.opt.values()], finite=finite)
    return attrs.evolve(checked, problems=tuple(problems) + checked.problems)


def _float(dtype: str) -> bool:
    return dtype in ("F16", "BF16", "F32", "F64")


def _view(t: st.TensorInfo, buf: bytes) -> "np.ndarray | st.Bf16":
    if t.dtype == "BF16":
        return st.Bf16(bits=np.frombuffer(buf, dtype="<u2"))
    return np.frombuffer(buf, dtype=st.DTYPES[t.dtype][1])


def _lines(name: str, exc: CheckpointError) -> list[str]:
    if exc.problems:
        return [f"{name}: {p}" for p in exc.problems]
    return [exc.message if name in exc.message else f"{name}: {exc.message}"]
