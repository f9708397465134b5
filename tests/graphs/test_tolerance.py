"""graphrt's one rule for a value that differs: integers exactly; floating values where
max |Δ| > atol + rtol × max |eager| (per dtype, relative to the size of the whole value), each
case on both sides of its boundary, and every way floating point compares unequal."""

import math

import pytest
import torch

from graphrt.graphs.tolerance import EXACT, LAST_BITS, ValueDifference, compare_values

INF, NAN = math.inf, math.nan


def test_an_element_near_zero_is_judged_by_the_size_of_the_whole_output():
    eager = torch.tensor([1000.0, 0.001])
    # bound: 1e-5 + 1e-5 × 1000 ≈ 0.01; elementwise it would be 1e-5 + 1e-5 × 0.001
    assert compare_values(eager, eager + torch.tensor([0.0, 0.009]), LAST_BITS) is None
    found = compare_values(eager, eager + torch.tensor([0.0, 0.011]), LAST_BITS)
    assert found.index == (1,) and found.max_abs_diff == pytest.approx(0.011, rel=1e-3)
    assert found.limit == "atol 1e-05 + rtol 1e-05 × max |eager| 1e+03"


def test_one_bfloat16_element_rounding_differently_is_no_difference_a_real_error_is():
    eager = torch.linspace(-3, 3, 64).bfloat16().view(8, 8)
    one_ulp = eager.clone()
    one_ulp[5, 3] = torch.nextafter(eager[5, 3], torch.tensor(10.0).bfloat16())  # the next bfloat16
    assert compare_values(eager, one_ulp, LAST_BITS) is None
    wrong = eager.clone()
    wrong[5, 3] += 0.25
    assert compare_values(eager, wrong, LAST_BITS).index == (5, 3)


def test_the_row_and_column_of_a_2d_value_name_the_element_that_differs():
    eager = torch.zeros(3, 4)
    replay = eager.clone()
    replay[2, 1], replay[0, 3] = 5.0, 1.0
    found = compare_values(eager, replay, EXACT)
    assert (found.index, found.element) == ((2, 1), "row 2, column 1")
    assert found.describe() == "row 2, column 1, max |Δ| 5 > 0 (exact)"
    assert compare_values(torch.zeros(4), torch.tensor([0.0, 0, 2, 0]), EXACT).element == "row 2"
    assert compare_values(torch.zeros(1, 2, 3), torch.ones(1, 2, 3), EXACT).element == "element (0, 0, 0)"


@pytest.mark.parametrize("eager, replay, differs, diff", [
    (NAN, 1.0, True, INF),  # nan against a number: as far off as can be
    (1.0, NAN, True, INF),
    (NAN, NAN, False, None),  # the same computation made nan
    (INF, -INF, True, INF),
    (INF, INF, False, None),
    (-INF, 1.0, True, INF),
    (-0.0, 0.0, False, None),  # equal by IEEE ==
    (1e-45, 0.0, True, 1.401298464324817e-45),  # a subnormal against zero: exactly a difference
], ids=["nan-number", "number-nan", "nan-nan", "inf-minus-inf", "inf-inf", "minus-inf-number",
        "minus-zero-zero", "subnormal-zero"])
@pytest.mark.parametrize("tolerances", [EXACT, LAST_BITS], ids=["exact", "rounding"])
def test_every_way_floats_compare_unequal(eager, replay, differs, diff, tolerances):
    found = compare_values(torch.tensor([2.0, eager]), torch.tensor([2.0, replay]), tolerances)
    if tolerances is LAST_BITS and eager == 1e-45:
        differs = False  # within any atol
    assert (found is not None) == differs
    if differs:
        assert found.index == (1,) and found.max_abs_diff == diff


def test_an_infinite_eager_element_does_not_widen_the_bound_for_the_others():
    eager = torch.tensor([INF, 1.0])
    assert compare_values(eager, torch.tensor([INF, 1.5]), LAST_BITS).index == (1,)
    assert compare_values(torch.tensor([NAN, INF]), torch.tensor([NAN, INF]), LAST_BITS) is None


def test_integers_compare_exactly_even_where_a_double_cannot_tell_them_apart():
    big = torch.tensor([2**60, 7])
    assert compare_values(big, big + torch.tensor([1, 0]), LAST_BITS) == ValueDifference((0,), 0.0, "0 (exact)")
    assert compare_values(big, big.clone(), LAST_BITS) is None
    assert compare_values(torch.tensor([True]), torch.tensor([False]), LAST_BITS).index == (0,)


def test_other_shapes_or_dtypes_differ_with_how():
    found = compare_values(torch.zeros(2), torch.zeros(3), EXACT)
    assert found.describe() == "shape or dtype: torch.float32 [3], eager's torch.float32 [2]"
    assert compare_values(torch.zeros(0), torch.zeros(0), EXACT) is None
