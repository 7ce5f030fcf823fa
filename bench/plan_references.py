"""`plan-parallel`'s accelerator profiles against published runs (mftk/plan/references.py): no measurement here.

Prints every reference row (published peak memory and tokens/s per device beside the estimate of its framework
sub-profile), the fitted and held-out error ranges, and with --fit refits the profiles' fitted constants from the
rows marked ``fit`` only:

- torchtitan's allocator reserve: exp(−mean log(allocated estimate / published reserved)) − 1;
- Megatron's persistent overhead: the median of mem-allocated-bytes (after a step) minus the estimated states;
- the step-time efficiencies (matmul, attention, Float8, torch.compile): least squares of log(estimate/published)
  (scipy), Float8 bounded by the datasheets' fp8/bf16 peak ratio of 2.

    .venv/bin/python bench/plan_references.py          # the table and the error ranges
    .venv/bin/python bench/plan_references.py --fit    # refit the constants (compare with memory.py's presets)
"""
from __future__ import annotations

import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import attrs  # noqa: E402

from mftk.plan import hardware as HW  # noqa: E402
from mftk.plan import references as R  # noqa: E402
from mftk.plan.memory import estimate, preset  # noqa: E402

STATES = ("weights", "gradients", "optimizer")


def table() -> None:
    print(f"{'row':26s} {'fit':>3s} {'published':>10s} {'estimate':>9s} {'ratio':>6s} {'tok/s pub':>9s} "
          f"{'estimate':>9s} {'ratio':>6s}")
    for r in R.results():
        speed = (f"{r.ref.tokens_per_s:9.0f} {r.estimated_tokens_per_s:9.0f} {r.speed_ratio:6.2f}"
                 if r.speed_ratio else "")
        print(f"{r.ref.key:26s} {'yes' if r.ref.fit else 'no':>3s} {r.ref.measured_gib:9.2f}G {r.estimated_gib:8.2f}G "
              f"{r.memory_ratio:6.2f} {speed}")
    for name in R.FRAMEWORKS:
        for held in (False, True):
            print(("held out" if held else "fitted  ") + ": " + R.profile_error(name, held_out=held).line())
    print("default : " + R.profile_error("accelerator").line())
    print("all     : " + R.profile_error("generic").line() + " (the uncalibrated generic profile on every row)")


def fit_reserve() -> float:
    logs = []
    for ref in R.REFERENCES:
        if ref.fit and ref.framework == "torchtitan":
            asm = attrs.evolve(preset("torchtitan"), reserve_fraction=0.0)
            if ref.compiled_loss:
                asm = attrs.evolve(asm, loss_bytes=R.COMPILED_LOSS_BYTES)
            est = estimate(R.layout(ref), R.plan_inputs(ref), asm).peak.total / R.GiB
            logs.append(math.log(est / ref.measured_gib))
    return math.exp(-statistics.mean(logs)) - 1


def fit_overhead() -> float:
    gaps = []
    for ref in R.REFERENCES:
        if ref.fit and ref.framework == "megatron" and ref.resident_bytes:
            est = estimate(R.layout(ref), R.plan_inputs(ref), preset("megatron"))
            stage = est.stages[-1] if ref.stage == "last" else est.peak
            gaps.append(ref.resident_bytes - sum(stage.term(n).value for n in STATES))
    return statistics.median(gaps)


def fit_speed() -> list[float]:
    import numpy as np
    from scipy.optimize import least_squares

    rows = [r for r in R.REFERENCES if r.fit and r.tokens_per_s and not r.speed_note]
    pre = [(r, estimate(R.layout(r), R.plan_inputs(r), preset(r.framework)), R.plan_inputs(r)) for r in rows]

    def residuals(p):
        out = []
        for r, est, inputs in pre:
            asm = attrs.evolve(preset(r.framework), matmul_efficiency=p[0], attention_efficiency=p[1],
                               float8_speedup=p[2], compile_speedup=p[3])
            speed = HW.tokens_per_s(est, inputs, HW.preset(r.hardware), asm, float8=r.float8, compiled=r.compiled)
            out.append(math.log(speed / r.tokens_per_s))
        return np.array(out)

    res = least_squares(residuals, x0=[0.4, 0.2, 1.3, 1.1], bounds=([0.05, 0.02, 1.0, 1.0], [0.95, 0.95, 2.0, 1.5]))
    return [float(x) for x in res.x]


def main() -> None:
    table()
    if "--fit" in sys.argv:
        print(f"torchtitan reserve_fraction: {fit_reserve():.3f}")
        print(f"megatron overhead_bytes: {fit_overhead() / 1e6:.0f} MB")
        mm, attn, f8, comp = fit_speed()
        print(f"step time: matmul_efficiency {mm:.3f}, attention_efficiency {attn:.3f}, float8_speedup {f8:.2f}, "
              f"compile_speedup {comp:.3f}")


if __name__ == "__main__":
    main()
