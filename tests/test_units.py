"""`mftk.units`: counts and rates against hand-written figures (three significant digits, SI prefixes)."""
import math

import pytest

from mftk.units import count, count_exact, every_steps, flops, flops_rate, plural, si


@pytest.mark.parametrize("n, text", [
    (0, "0"), (7, "7"), (999, "999"), (1000, "1.00K"), (1234, "1.23K"), (622_976, "623K"),
    (999_600, "1.00M"), (12_345_678, "12.3M"), (596_049_920, "596M"), (37.6e9, "37.6B"), (671e9, "671B"),
])
def test_count_has_a_unit_that_shows_the_value(n, text):
    assert count(n) == text


def test_count_exact_keeps_the_figure():
    assert count_exact(622_976) == "623K (622,976)"
    assert count_exact(6) == "6"


@pytest.mark.parametrize("tflops, text", [
    (0.0, "0 FLOP/s"), (0.004114, "4.11 GFLOP/s"), (0.0123, "12.3 GFLOP/s"), (24.99, "25.0 TFLOP/s"),
    (312.4, "312 TFLOP/s"), (2.5e-7, "250 kFLOP/s"), (1500.0, "1.50 PFLOP/s"),
])
def test_flops_rate_from_the_logs_tflops(tflops, text):
    assert flops_rate(tflops) == text


def test_si_and_flop_counts():
    assert flops(2.315e9) == "2.31 GFLOP" and flops(1.307e15) == "1.31 PFLOP"
    assert si(math.inf, "B") == "inf B"


def test_wording():
    assert every_steps(1) == "step" and every_steps(10) == "10 steps"
    assert plural(1, "parameter") == "1 parameter" and plural(19, "parameter") == "19 parameters"
