"""Numbers for people: counts and rates with the SI prefix that shows the value.

One place, so that a tiny CPU model reads ``623K parameters`` and ``4.11 GFLOP/s`` everywhere, and a
671B model ``671B`` — never ``0.0M``, ``0.000623B`` or ``0.00 TFLOP/s``. Three significant digits;
the exact count stays available wherever it matters (``623K (622,976)``).
"""
from __future__ import annotations

import math
import re

from mftk.errors import InputError

_COUNT = ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K"))  # parameter counts: B for billion, as models are named
_SI = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def _sig3(x: float) -> str:
    """Three significant digits without an exponent: 623, 62.3, 6.23 (99.96 reads 100)."""
    x = float(f"{x:.3g}")
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def _scaled(value: float, table: tuple[tuple[float, str], ...]) -> tuple[str, str]:
    for size, prefix in table:
        if abs(value) >= size * 0.9995:  # 999,600 reads 1.00M, not 1000K
            return _sig3(value / size), prefix
    return _sig3(value) if value != int(value) else f"{int(value)}", ""


def count(n: float) -> str:
    """A parameter or token count: 622976 -> '623K', 596049920 -> '596M', 6.71e11 -> '671B'."""
    if not math.isfinite(n):
        return str(n)
    text, prefix = _scaled(float(n), _COUNT)
    return text + prefix


def count_exact(n: int) -> str:
    """'623K (622,976)': the readable figure with the exact one."""
    return f"{count(n)} ({int(n):,})" if abs(n) >= 1000 else f"{int(n):,}"


def si(value: float, unit: str) -> str:
    """A value with an SI prefix: si(4.11e9, 'FLOP/s') -> '4.11 GFLOP/s'; si(0, 'FLOP/s') -> '0 FLOP/s'."""
    if not math.isfinite(value):
        return f"{value} {unit}"
    if value == 0:
        return f"0 {unit}"
    text, prefix = _scaled(float(value), _SI)
    return f"{text} {prefix}{unit}"


def flops_rate(tflops: float) -> str:
    """A rate given in TFLOP/s (the log's unit) in the unit that shows it: 0.0041 -> '4.10 GFLOP/s'."""
    return si(tflops * 1e12, "FLOP/s")


def flops(n: float) -> str:
    """A FLOP count: 2.315e9 -> '2.32 GFLOP'."""
    return si(n, "FLOP")


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 step', '2 steps' (``words`` for an irregular plural)."""
    return f"{n} {word if n == 1 else (words or word + 's')}"


def every_steps(n: int) -> str:
    """'step' for 1 (so "every step", never "every 1 steps"), else 'N steps'."""
    return "step" if n == 1 else f"{n} steps"


# Sizes: one convention on input and output. Every suffix is binary, as mftk prints sizes (GiB) and as
# MindSpore reads its own sizes ("58GB" in context.max_device_memory is 58·2^30 bytes: kGBToByte = 1024 << 20 in
# mindspore-ai/mindspore, mindspore/ccsrc/backend/common/mem_reuse/mem_dynamic_allocator.cc). So 80G, 80GB and
# 80GiB are all 80 GiB, the figure the output then shows.
_BINARY = {"": 1, "b": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgtKMGT]?)(i?[bB])?\s*$")


def parse_bytes(text: str, what: str = "device memory") -> int:
    """'64GiB' / '80G' / '80GB' / '24576 MiB' / '1000' -> bytes (binary units throughout); InputError otherwise."""
    match = _SIZE.match(str(text))
    if match is None or (match.group(3) or "").lower() == "ib" and not match.group(2) or float(match.group(1)) <= 0:
        raise InputError(message=f"cannot read {what} {text!r}",
                         hint="write a positive size with a unit, e.g. 64GiB or 24576MiB (G, GB and GiB all mean "
                              "GiB, 2^30 bytes, as mftk prints them and MindSpore reads them)")
    return int(float(match.group(1)) * _BINARY[match.group(2).lower()])
