"""The one statistical design (icl_lens.statistics) against independent arithmetic: binomial tails
from math.comb, the coverage table of the statistics notes, each kind's rule giving each verdict and
failing on a wrong input, every / some settings, Benjamini-Yekutieli by hand, and the power
simulation."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import statistics


def tail(successes, n):
    """P(Bin(n, 1/2) >= successes), from binomial coefficients."""
    return sum(math.comb(n, j) for j in range(max(successes, 0), n + 1)) / 2 ** n


def cdf(k, n):
    return sum(math.comb(n, j) for j in range(0, k + 1)) / 2 ** n


# n: (largest k with a two-sided 95% interval, its coverage), from shared/statistics_notes.md
NOTES = {6: (1, 0.969), 8: (1, 0.992), 10: (2, 0.979), 12: (3, 0.961), 15: (4, 0.965), 20: (6, 0.959),
         25: (8, 0.957), 30: (10, 0.957)}


@pytest.mark.parametrize("n", sorted(NOTES))
def test_two_sided_coverage_is_the_notes_table(n):
    k, coverage = NOTES[n]
    values = list(range(n))
    low, high, found = statistics.two_sided_interval(values)
    assert (low, high) == (k - 1, n - k)                       # x(k), x(n - k + 1), 1-based
    assert found == pytest.approx(1 - 2 * cdf(k - 1, n)) and round(found, 3) == coverage


def test_no_interval_below_its_n_and_one_sided_bounds_from_five():
    for n in (3, 4, 5):
        assert statistics.two_sided_interval(list(range(n))) == (None, None, None)
    assert statistics.one_sided_bounds([1.0, 2.0, 3.0, 4.0]) == (None, None, None)
    low, high, coverage = statistics.one_sided_bounds([5.0, 1.0, 4.0, 2.0, 3.0])
    assert (low, high, coverage) == (1.0, 5.0, 1 - 1 / 32)    # all five on one side: p = 1/32


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    assert statistics.median(range(10)) == 4.5
    assert statistics.median([3.0, 1.0, 2.0]) == 2.0
    assert statistics.median([-0.0996, -0.021, 0.03, -0.15]) == pytest.approx((-0.0996 - 0.021) / 2)
    with pytest.raises(ValueError, match="values"):
        statistics.median([])


@given(st.lists(st.integers(-20, 20), min_size=1, max_size=40), st.integers(-20, 20))
def test_sign_test_p_values_are_binomial_tails(values, threshold):
    assert statistics.p_above(values, threshold) == pytest.approx(tail(sum(v > threshold for v in values), len(values)))
    assert statistics.p_below(values, threshold) == pytest.approx(tail(sum(v < threshold for v in values), len(values)))
    assert statistics.p_below(values, threshold, inclusive=True) == pytest.approx(
        tail(sum(v <= threshold for v in values), len(values)))


BAND = 0.1


@pytest.mark.parametrize("kind, x, verdict", [
    ("directional", [0.3, 0.2, 0.4, 0.5, 0.25], "agrees"),
    ("directional", [0.05, 0.02, 0.04, 0.03, 0.01], "disagrees"),       # better, but within the band
    ("directional", [-0.3, -0.2, -0.4, -0.5, -0.25], "disagrees"),      # the other way
    ("directional", [0.3, -0.2, 0.4, 0.5, 0.25], "inconclusive"),
    ("directional", [0.3, 0.2, 0.4, 0.5], "inconclusive"),              # four seeds: p = 1/16
    ("slightly", [0.05, 0.02, 0.04, 0.03, 0.01], "agrees"),
    ("slightly", [-0.05, -0.02, 0.0, -0.03, -0.01], "disagrees"),       # a zero counts against the claim
    ("comparable", [0.05, -0.02, 0.04, -0.03, 0.01], "agrees"),
    ("comparable", [0.3, 0.2, 0.4, 0.5, 0.25, 0.35], "disagrees"),      # six beyond the band: p = 2 x 2^-6
    ("comparable", [0.3, 0.2, 0.4, 0.5, 0.25], "inconclusive"),         # five: 2 x 2^-5 > 0.05
    ("not beyond", [0.05, -0.02, 0.04, -0.03, 0.01], "agrees"),
    ("not beyond", [0.3, 0.2, 0.4, 0.5, 0.25], "disagrees"),
])
def test_each_kind_gives_each_verdict(kind, x, verdict):
    found = statistics.decide(kind, x, BAND, direction="higher")
    assert found["verdict"] == verdict
    # the same differences read for a claim the other way round ("lower") with the signs flipped
    assert statistics.decide(kind, [-v for v in x], BAND, direction="lower")["verdict"] == verdict


@settings(max_examples=400, deadline=None)
@given(st.lists(st.floats(-1, 1), min_size=1, max_size=25), st.sampled_from(statistics.KINDS),
       st.floats(0.01, 0.5))
def test_verdicts_follow_from_bounds_computed_apart(x, kind, band):
    """The decision agrees with the bounds read off the sorted values at the rank from math.comb, and
    never both agrees and disagrees."""
    found = statistics.decide(kind, x, band, direction="higher")
    n = len(x)
    ordered = sorted(x)
    k = max((j for j in range(1, n + 1) if cdf(j - 1, n) <= 0.05), default=0)
    if k == 0:
        assert found["lower"] is None and found["verdict"] == "inconclusive"
        return
    low, high = ordered[k - 1], ordered[n - k]
    assert (found["lower"], found["upper"]) == (low, high)
    effect = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    assert found["effect"] == pytest.approx(effect)
    if kind == "directional":
        # ties at 0 count against: L > 0 is strict
        assert (found["verdict"] == "agrees") == (low > 0 and effect >= band)
        assert (found["verdict"] == "disagrees") == (high < band and not (low > 0 and effect >= band))
    if kind == "not beyond" and found["verdict"] == "agrees":
        assert high < band
    if kind == "comparable" and found["verdict"] == "agrees":
        assert -band < low and high < band


def test_bad_inputs_name_the_argument():
    with pytest.raises(ValueError, match="kind"):
        statistics.decide("helps", [1.0], BAND)
    with pytest.raises(ValueError, match="band"):
        statistics.decide("directional", [1.0], 0.0)
    with pytest.raises(ValueError, match="direction"):
        statistics.decide("directional", [1.0], BAND, direction="up")
    with pytest.raises(ValueError, match="alpha"):
        statistics.decide("directional", [1.0], BAND, alpha=0.7)
    with pytest.raises(ValueError, match="scope"):
        statistics.decide_claim("directional", [[[1.0]]], BAND, scope="any")
    with pytest.raises(ValueError, match="every setting"):
        statistics.decide_claim("directional", [[[1.0]], [[1.0]]], BAND, scope="every")


def test_every_setting_must_agree_and_one_disagreement_decides_at_alpha_over_m():
    good = [0.3, 0.2, 0.4, 0.5, 0.25, 0.3]
    none = [0.01, -0.02, 0.03, 0.0, 0.02, 0.01]
    both = statistics.decide_claim("directional", [[good, good]], BAND, direction="higher")
    assert both["verdict"] == "agrees" and both["p"] == pytest.approx(1 / 64)
    # one of two comparisons disagreeing is a union of two tests: each at 0.025, p = 2 x 2^-6
    one = statistics.decide_claim("directional", [[good, none]], BAND, direction="higher")
    assert one["verdict"] == "disagrees" and one["weakest"] == 1 and one["p"] == pytest.approx(2 / 64)
    five = statistics.decide_claim("directional", [[good[:5], none[:5]]], BAND, direction="higher")
    assert five["verdict"] == "inconclusive"      # 2 x 2^-5 > 0.05
    # the comparison shown is the one that fails, not the first
    small = [0.05, 0.06, 0.07, 0.05, 0.06, 0.3]   # every seed on the paper's side, the median within the band
    shown = statistics.decide_claim("directional", [[good, small]], BAND, direction="higher")
    assert shown["verdict"] == "inconclusive" and shown["weakest"] == 1


def test_tarone_leaves_out_tests_that_cannot_pass_the_family():
    """With m tests BY's largest threshold is 0.05 / (1 + 1/2 + ... + 1/m): at 40 tests 0.0117, so
    tests whose smallest p is 2^-5 = 0.031 (five seeds) can never pass and leave the family."""
    p = [0.03125] * 40 + [0.001, 0.004]
    smallest = [0.03125] * 40 + [0.0001, 0.0001]
    found = statistics.family_adjusted(p, smallest)
    assert found[:40] == [None] * 40
    assert found[40:] == pytest.approx(by_by_hand([0.001, 0.004]))
    # without the smallest p's, all 42 stay in and the two small ones are adjusted over 42
    assert statistics.family_adjusted(p)[40] == pytest.approx(by_by_hand(p)[40])


def test_some_setting_pays_for_the_choice():
    good6 = [0.3, 0.2, 0.4, 0.5, 0.25, 0.35]
    none6 = [0.01, -0.02, 0.03, 0.0, 0.02, 0.01]
    found = statistics.decide_claim("directional", [[none6], [good6]], BAND, direction="higher", scope="some")
    assert found["verdict"] == "agrees" and found["chosen"] == 1 and found["p"] == pytest.approx(2 / 64)
    # with three choices, six of six is not enough: 3 x 2^-6 > 0.05 / ... the level is 0.05 / 3
    three = statistics.decide_claim("directional", [[none6], [good6], [none6]], BAND, direction="higher",
                                    scope="some")
    assert three["verdict"] == "agrees" and three["level"] == pytest.approx(0.05 / 3)
    five = statistics.decide_claim("directional", [[none6[:5]], [good6[:5]]], BAND, direction="higher",
                                   scope="some")
    # five seeds cannot show agreement with a choice of two (2 x 2^-5); disagreeing stays possible
    assert five["verdict"] == "inconclusive" and five["smallest_agree"] == pytest.approx(2 / 32)
    assert five["smallest_disagree"] == pytest.approx(1 / 32) and not five["cannot_decide"]
    # disagrees only if every alternative does
    assert statistics.decide_claim("directional", [[none6], [good6]], BAND, direction="lower",
                                   scope="some")["verdict"] == "disagrees"
    mixed = statistics.decide_claim("directional", [[none6], [[0.3, -0.2, 0.4, 0.5, -0.25, 0.35]]], BAND,
                                    direction="higher", scope="some")
    assert mixed["verdict"] == "inconclusive"


def by_by_hand(p_values, alpha=0.05):
    """Benjamini-Yekutieli adjusted p-values: m c(m) p_(i) / i, made monotone from the top, capped at 1."""
    m = len(p_values)
    c = sum(1 / i for i in range(1, m + 1))
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, m * c * p_values[i] / rank)
        adjusted[i] = min(1.0, running)
    return adjusted


def test_family_correction_is_benjamini_yekutieli():
    p = [0.001, 0.03, 0.2, 0.004, 0.5]
    found = statistics.family_adjusted([p[0], None, p[1], p[2], None, p[3], p[4]])
    expected = by_by_hand(p)
    assert found[1] is None and found[4] is None
    assert [found[i] for i in (0, 2, 3, 5, 6)] == pytest.approx(expected)


def test_seeds_needed_by_simulation():
    clear = [0.3, 0.2, 0.4, 0.5, 0.25, 0.3, 0.35]
    mixed = [0.3, -0.2, 0.4, -0.5, 0.25, 0.3, -0.1]
    few = statistics.seeds_needed("directional", clear, BAND, direction="higher")
    assert few is not None and 5 <= few < 40
    many = statistics.seeds_needed("directional", mixed, BAND, direction="higher")
    assert many is None or many > few
    # a Bonferroni factor asks for more seeds
    assert statistics.seeds_needed("directional", clear, BAND, direction="higher", choices=24) > few
    # deterministic for a seed
    assert statistics.seeds_needed("directional", clear, BAND, direction="higher") == few


def test_unstable_is_an_exact_paired_test():
    five = statistics.unstable([True] * 5, [False] * 5)
    assert five["verdict"] == "agrees" and five["p"] == pytest.approx(1 / 32)
    one = statistics.unstable([True, False, False, False, False], [False] * 5)
    assert one["verdict"] == "inconclusive" and one["p_agree"] == pytest.approx(0.5)
    # 29 seeds with none unstable: the exact upper bound 1 - 0.05^(1/29) < 0.1
    stable = statistics.unstable([False] * 29, [False] * 29)
    assert stable["verdict"] == "disagrees" and stable["upper"] == pytest.approx(1 - 0.05 ** (1 / 29))
    assert statistics.unstable([False] * 28, [False] * 28)["verdict"] == "inconclusive"
    with pytest.raises(ValueError, match="one flag per seed"):
        statistics.unstable([True], [True, False])


def test_an_unmeasured_comparison_blocks_agreeing_but_not_a_measured_disagreement():
    """A speed most pairs tie at is not measured: it cannot agree, nor carry a disagreement, but a
    measured comparator that disagrees still refutes an "every comparator" claim (the review found
    a row held inconclusive by an unread comparator while the other was slower on 20 of 20 seeds)."""
    faster = [-0.5 - 0.01 * i for i in range(20)]        # the variant lower by 0.5: agrees
    slower = [0.5 + 0.01 * i for i in range(20)]         # higher by 0.5: disagrees
    band = 0.1

    def verdict(comparisons, flags):
        return statistics.decide_claim("directional", [comparisons], band, unmeasured=[flags])["verdict"]

    assert verdict([faster, faster], [False, False]) == "agrees"
    assert verdict([faster, faster], [False, True]) == "inconclusive"     # one comparator unread
    assert verdict([slower, faster], [False, False]) == "disagrees"
    assert verdict([slower, faster], [False, True]) == "disagrees"        # measured disagreement stands
    assert verdict([faster, slower], [False, True]) == "inconclusive"     # an unread one cannot refute
    decided = statistics.decide_claim("directional", [[faster, slower]], band, unmeasured=[[False, True]])
    assert decided["p"] == 1.0 and decided["comparisons"][1]["not_measured"]
    # "some" setting: an unread alternative is one that cannot agree; the other can be chosen
    some = statistics.decide_claim("directional", [[faster], [faster]], band, scope="some",
                                   unmeasured=[[True], [False]])
    assert some["verdict"] == "agrees" and some["chosen"] == 1 and some["k"] == 2
    with pytest.raises(ValueError, match="unmeasured"):
        statistics.decide_claim("directional", [[faster, slower]], band, unmeasured=[[False]])
