"""The statistical design against a second implementation written from its rules (the module text
of icl_lens.statistics) with exact binomial sums: every field of every decision, on random
comparisons and on values and levels placed exactly on the thresholds, where a `<` for a `<=`
would show."""

import math
from fractions import Fraction

import numpy as np
import pytest

from icl_lens import statistics

KINDS = ("directional", "slightly", "comparable", "not beyond")


def tail(successes, n):
    """P(Bin(n, 1/2) >= successes), exactly."""
    if successes <= 0:
        return Fraction(1)
    return Fraction(sum(math.comb(n, j) for j in range(successes, n + 1)), 2 ** n)


def cdf(k, n):
    """P(Bin(n, 1/2) <= k), exactly."""
    return Fraction(sum(math.comb(n, j) for j in range(0, min(k, n) + 1)), 2 ** n) if k >= 0 else Fraction(0)


def reference_rank(n, alpha):
    ranks = [k for k in range(1, n + 1) if cdf(k - 1, n) <= alpha]
    return max(ranks) if ranks else 0


def reference_median(x):
    ordered = sorted(x)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def reference_decide(kind, differences, band, direction, alpha, alpha_disagree):
    alpha_disagree = alpha if alpha_disagree is None else alpha_disagree
    x = [(-d if direction == "lower" else d) for d in differences if d is not None and d == d]
    n = len(x)

    def count(test):
        return sum(1 for v in x if test(v))

    smallest_agree = Fraction(1, 2 ** n)
    smallest_disagree = min(Fraction(1), 2 * smallest_agree) if kind == "comparable" else smallest_agree
    found = {"n": n, "alpha": alpha, "alpha_disagree": alpha_disagree, "smallest_agree": smallest_agree,
             "smallest_disagree": smallest_disagree,
             "cannot_decide": smallest_agree > alpha and smallest_disagree > alpha_disagree}
    if n == 0:
        return {**found, "effect": None, "lower": None, "upper": None, "coverage": None, "p_agree": 1, "p_disagree": 1,
                "p": 1, "verdict": "inconclusive"}
    effect = reference_median(x)
    k = reference_rank(n, alpha)
    ordered = sorted(x)
    lower, upper, coverage = ((ordered[k - 1], ordered[n - k], 1 - cdf(k - 1, n)) if k else (None, None, None))
    above = lambda t: tail(count(lambda v: v > t), n)                 # noqa: E731
    below = lambda t: tail(count(lambda v: v < t), n)                 # noqa: E731
    at_most = lambda t: tail(count(lambda v: v <= t), n)              # noqa: E731
    if kind == "directional":
        p_agree, p_disagree = above(0), below(band)
        agree, disagree = p_agree <= alpha and effect >= band, p_disagree <= alpha_disagree
    elif kind == "slightly":
        p_agree, p_disagree = above(0), at_most(0)
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree
    elif kind == "comparable":
        p_agree = max(above(-band), below(band))
        p_disagree = min(Fraction(1), 2 * min(above(band), below(-band)))
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree
    else:
        p_agree, p_disagree = below(band), above(0)
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree and effect >= band
    verdict = "agrees" if agree else "disagrees" if disagree else "inconclusive"
    p = p_agree if agree else p_disagree if disagree else min(p_agree, p_disagree)
    return {**found, "effect": effect, "lower": lower, "upper": upper, "coverage": coverage, "p_agree": p_agree,
            "p_disagree": p_disagree, "p": p, "verdict": verdict}


def same(found, expected):
    """Field by field: numbers to round-off, everything else exactly."""
    assert set(found) == set(expected), set(found) ^ set(expected)
    for key, value in expected.items():
        if isinstance(value, (Fraction, float)) and not isinstance(value, bool):
            assert found[key] == pytest.approx(float(value), rel=1e-12, abs=1e-300), key
        else:
            assert found[key] == value, (key, found[key], value)


# levels: the usual one, dyadic ones that a p-value can equal exactly, and the corrected ones
LEVELS = (0.05, 1 / 32, 1 / 16, 1 / 64, 0.025, 0.05 / 3)


def random_differences(rng, band):
    n = int(rng.integers(0, 13))
    values = list(rng.normal(rng.choice([-1.0, 0.0, 0.5, 1.0]) * band, band, size=n))
    # some values exactly on a threshold, where "beyond" and "not beyond" part
    for i in range(n):
        if rng.random() < 0.2:
            values[i] = float(rng.choice([0.0, band, -band, 2 * band]))
    if n and rng.random() < 0.1:
        values[0] = None
    return values


@pytest.mark.parametrize("kind", KINDS)
def test_decide_is_the_rule_written_out(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    for _ in range(400):
        band = float(rng.choice([0.1, 0.5]))
        differences = random_differences(rng, band)
        direction = str(rng.choice(["lower", "higher"]))
        alpha = float(rng.choice(LEVELS))
        alpha_disagree = rng.choice([None, alpha / 2, 1 / 32])
        alpha_disagree = None if alpha_disagree is None else float(alpha_disagree)
        found = statistics.decide(kind, differences, band, direction=direction, alpha=alpha,
                                  alpha_disagree=alpha_disagree)
        same(found, reference_decide(kind, differences, band, direction, alpha, alpha_disagree))


@pytest.mark.parametrize("kind", KINDS)
def test_a_p_value_equal_to_the_level_decides(kind):
    """Five seeds all one way give p = 1/32: at alpha = 1/32 that decides (p <= alpha), just below
    it does not; the same for the disagreeing side."""
    band = 0.1
    agreeing = {"directional": [0.3] * 5, "slightly": [0.05] * 5, "comparable": [0.0] * 5,
                "not beyond": [0.05] * 5}[kind]
    disagreeing = {"directional": [0.05] * 5, "slightly": [-0.05] * 5, "comparable": [0.3] * 5,
                   "not beyond": [0.3] * 5}[kind]
    at = statistics.decide(kind, agreeing, band, direction="higher", alpha=1 / 32)
    assert at["verdict"] == "agrees" and at["p"] == 1 / 32
    assert statistics.decide(kind, agreeing, band, direction="higher", alpha=1 / 33)["verdict"] == "inconclusive"
    level = 1 / 16 if kind == "comparable" else 1 / 32      # the comparable side pays a factor 2
    at = statistics.decide(kind, disagreeing, band, direction="higher", alpha=0.05, alpha_disagree=level)
    assert at["verdict"] == "disagrees" and at["p"] == level
    assert statistics.decide(kind, disagreeing, band, direction="higher", alpha=0.05,
                             alpha_disagree=level * 0.99)["verdict"] == "inconclusive"


def test_an_effect_exactly_on_the_band_is_beyond_it():
    x = [0.1, 0.1, 0.1, 0.1, 0.1]
    assert statistics.decide("directional", x, 0.1, direction="higher")["verdict"] == "agrees"
    assert statistics.decide("not beyond", x, 0.1, direction="higher")["verdict"] == "disagrees"


def test_levels_out_of_range_are_refused():
    for alpha in (0.0, 0.5, -0.1):
        with pytest.raises(ValueError, match="alpha"):
            statistics.decide("directional", [0.1] * 5, 0.1, alpha=alpha)


def test_one_seed_is_still_judged():
    found = statistics.decide("slightly", [-0.2], 0.1)
    assert found["n"] == 1 and found["effect"] == 0.2 and found["p_agree"] == 0.5


def reference_claim(kind, alternatives, band, direction, scope, alpha, choice, k):
    k = k or len(alternatives)
    level = alpha / k
    agreeing = [[reference_decide(kind, d, band, direction, level, alpha / len(a)) for d in a] for a in alternatives]
    disagreeing = [[reference_decide(kind, d, band, direction, alpha, alpha / len(a)) for d in a] for a in alternatives]

    def agrees(comparisons):
        return all(c["verdict"] == "agrees" for c in comparisons)

    def agree_p(comparisons):
        return max(c["p_agree"] for c in comparisons)

    def lowest(comparisons):
        return min(-math.inf if c["effect"] is None else c["effect"] for c in comparisons)

    order = sorted(range(len(alternatives)), key=lambda i: (not agrees(agreeing[i]), agree_p(agreeing[i]),
                                                            -lowest(agreeing[i])))
    chosen = order[0] if choice is None else choice
    p_agree = min(Fraction(1), k * agree_p(agreeing[chosen]))
    p_disagree = max(min(Fraction(1), len(a) * min(c["p_disagree"] for c in a)) for a in disagreeing)
    if agrees(agreeing[chosen]):
        verdict, p = "agrees", p_agree
    elif all(any(c["verdict"] == "disagrees" for c in a) for a in disagreeing):
        verdict, p = "disagrees", p_disagree
    else:
        verdict, p = "inconclusive", min(p_agree, p_disagree)
    if verdict == "disagrees":
        comparisons = disagreeing[chosen]
        weakest = sorted(range(len(comparisons)), key=lambda i: comparisons[i]["p_disagree"])[0]
    else:
        comparisons = agreeing[chosen]
        weakest = sorted(range(len(comparisons)), key=lambda i: (
            comparisons[i]["verdict"] == "agrees", -comparisons[i]["p_agree"],
            -math.inf if comparisons[i]["effect"] is None else comparisons[i]["effect"]))[0]
    smallest_agree = k * max(c["smallest_agree"] for c in agreeing[chosen])
    smallest_disagree = max(len(a) * min(c["smallest_disagree"] for c in a) for a in disagreeing)
    return {"verdict": verdict, "p": p, "p_agree": p_agree, "p_disagree": p_disagree, "chosen": chosen, "k": k,
            "level": level, "comparisons": comparisons, "weakest": weakest,
            "smallest_p": min(smallest_agree, smallest_disagree), "smallest_agree": min(1, smallest_agree),
            "smallest_disagree": min(1, smallest_disagree),
            "cannot_decide": smallest_agree > alpha and smallest_disagree > alpha}


@pytest.mark.parametrize("kind", KINDS)
def test_decide_claim_is_the_rule_written_out(kind):
    rng = np.random.default_rng(10 + KINDS.index(kind))
    for _ in range(150):
        band = 0.1
        scope = str(rng.choice(["every", "some"]))
        count = 1 if scope == "every" else int(rng.integers(1, 4))
        alternatives = [[random_differences(rng, band) for _ in range(int(rng.integers(1, 4)))]
                        for _ in range(count)]
        direction = str(rng.choice(["lower", "higher"]))
        choice = int(rng.integers(0, count)) if rng.random() < 0.3 else None
        k = count + int(rng.integers(0, 3)) if rng.random() < 0.3 else None
        found = statistics.decide_claim(kind, alternatives, band, direction=direction, scope=scope, choice=choice,
                                        k=k)
        expected = reference_claim(kind, alternatives, band, direction, scope, 0.05, choice, k)
        comparisons_found, comparisons_expected = found.pop("comparisons"), expected.pop("comparisons")
        same(found, expected)
        for a, b in zip(comparisons_found, comparisons_expected, strict=True):
            same(a, b)


def test_decide_claim_names_its_bad_arguments():
    with pytest.raises(ValueError, match="alternatives must hold"):
        statistics.decide_claim("directional", [[[0.1] * 5], []], 0.1, scope="some")
    with pytest.raises(ValueError, match="alternatives must hold"):
        statistics.decide_claim("directional", [], 0.1)
    with pytest.raises(ValueError, match=r"k must be at least the number of alternatives \(2\), got 1"):
        statistics.decide_claim("directional", [[[0.1] * 5], [[0.2] * 5]], 0.1, scope="some", k=1)


def test_rank_and_critical_count_by_exact_sums():
    for n in range(0, 25):
        for alpha in LEVELS + (0.3, 0.49):
            assert statistics.rank_for(n, alpha) == reference_rank(n, alpha), (n, alpha)
            passing = [c for c in range(0, n + 1) if tail(c, n) <= alpha]
            assert statistics.critical_count(n, alpha) == (passing[0] if passing else n + 1), (n, alpha)


def test_regions_part_at_the_thresholds():
    band = 0.25
    x = [-0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0]
    assert statistics.regions(x, band) == [1, 3, 1, 3]


def test_median_of_infinities_and_binomial_tail_at_zero():
    assert math.isnan(statistics.median([-math.inf, math.inf]))
    assert statistics.median([math.inf, math.inf]) == math.inf
    assert statistics.median([1.0, math.inf]) == math.inf
    assert statistics.median([-math.inf, 1.0]) == -math.inf
    assert statistics.binomial_tail(0, 5) == 1.0 and statistics.binomial_tail(1, 5) == 1 - 1 / 32
    assert statistics.in_direction([1.0, None, math.nan, -2.0], "higher") == [1.0, -2.0]


def reference_by(p_values, smallest, alpha=0.05):
    kept = [i for i, p in enumerate(p_values) if p is not None]
    while True:
        m = len(kept)
        threshold = alpha / sum(Fraction(1, j) for j in range(1, m + 1)) if m else alpha
        fewer = [i for i in kept if smallest[i] <= threshold]
        if len(fewer) == m:
            break
        kept = fewer
    m = len(kept)
    c = sum(1 / j for j in range(1, m + 1))
    order = sorted(kept, key=lambda i: p_values[i])
    adjusted = [None] * len(p_values)
    running = 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p_values[i] * m * c / rank)
        adjusted[i] = min(1.0, running)
    return adjusted


def test_family_adjustment_is_benjamini_yekutieli_with_tarone_written_out():
    rng = np.random.default_rng(5)
    for _ in range(200):
        m = int(rng.integers(1, 12))
        p_values = [None if rng.random() < 0.15 else float(rng.choice([rng.random() * 0.1, rng.random()]))
                    for _ in range(m)]
        smallest = [float(rng.choice([0.0, 2.0 ** -5, 2.0 ** -10, 0.02])) for _ in range(m)]
        found = statistics.family_adjusted(p_values, smallest)
        expected = reference_by(p_values, smallest)
        for a, b in zip(found, expected):
            assert (a is None) == (b is None) and (a is None or a == pytest.approx(b, rel=1e-12))


def test_a_test_whose_smallest_p_is_the_threshold_stays_in_the_family():
    # two tests: the largest BY threshold is 0.05 / 1.5; a smallest p exactly there can still pass
    threshold = 0.05 / 1.5
    found = statistics.family_adjusted([0.001, 0.5], [threshold, threshold])
    assert found[0] is not None and found[1] is not None
    # a hair above it, the test leaves the family, and the other is then corrected alone
    found = statistics.family_adjusted([0.001, 0.5], [threshold * 1.005, 0.0])
    assert found[0] is None and found[1] == pytest.approx(0.5)


def region_values(counts, band, kind):
    """Seeds in the four regions, placed so that the median is beyond the band exactly when more
    than half the seeds are (the count rule's reading of the median)."""
    beyond = 2 * band if kind == "comparable" else band
    return ([-2 * band] * counts[0] + [-band / 2] * counts[1] + [band / 2] * counts[2] + [beyond] * counts[3])


@pytest.mark.parametrize("kind", KINDS)
def test_decided_by_counts_is_decide_on_the_regions(kind):
    rng = np.random.default_rng(20 + KINDS.index(kind))
    band = 0.1
    for n in range(1, 16):
        counts = rng.multinomial(n, rng.dirichlet([1, 1, 1, 1], size=60))
        for alpha, alpha_disagree in ((0.05, 0.05), (0.025, 0.05 / 3), (1 / 32, 1 / 16)):
            found = statistics.decided_by_counts(kind, counts, n, alpha, alpha_disagree)
            expected = [reference_decide(kind, region_values(list(c), band, kind), band, "higher", alpha,
                                         alpha_disagree)["verdict"] != "inconclusive" for c in counts]
            assert list(found) == expected, (kind, n, alpha)


def reference_power_curve(kind, differences, band, direction, alpha, choices, comparisons, most, studies, seed):
    x = [(-d if direction == "lower" else d) for d in differences]
    concentration = np.array([sum(v < -band for v in x), sum(-band <= v <= 0 for v in x),
                              sum(0 < v < band for v in x), sum(v >= band for v in x)], dtype=float) + 0.5
    rng = np.random.default_rng(seed)
    powers = []
    for n in range(1, most + 1):
        counts = rng.multinomial(n, rng.dirichlet(concentration, size=studies))
        decided = [reference_decide(kind, region_values(list(c), band, kind), band, "higher", alpha / choices,
                                    alpha / comparisons)["verdict"] != "inconclusive" for c in counts]
        powers.append(sum(decided) / studies)
    return powers


def test_power_curves_are_the_simulation_written_out():
    x = [0.3, 0.2, -0.05, 0.5, 0.25, 0.12, 0.35]
    for kind, choices, comparisons in (("directional", 1, 1), ("comparable", 3, 1), ("not beyond", 1, 2),
                                       ("slightly", 2, 2)):
        found = statistics.power_curve(kind, x, 0.1, direction="higher", choices=choices, comparisons=comparisons,
                                       most=12, studies=150, seed=3)
        assert found == pytest.approx(reference_power_curve(kind, x, 0.1, "higher", 0.05, choices, comparisons,
                                                            12, 150, 3))
    # the defaults: 100 seeds at most, 2000 studies, seed 0, no correction
    defaults = statistics.power_curve("directional", x, 0.1, direction="higher")
    assert len(defaults) == 100
    assert defaults[:3] == pytest.approx(reference_power_curve("directional", x, 0.1, "higher", 0.05, 1, 1, 3,
                                                               2000, 0))
    assert statistics.seeds_needed("directional", x, 0.1, direction="higher") == statistics.first_lasting(
        defaults, 0.8)


def test_first_lasting_needs_every_later_power():
    assert statistics.first_lasting([0.1, 0.9, 0.7, 0.85, 0.9], 0.8) == 4
    assert statistics.first_lasting([0.9, 0.9], 0.8) == 1
    assert statistics.first_lasting([0.9, 0.5], 0.8) is None
    assert statistics.first_lasting([0.8], 0.8) == 1


def reference_unstable_curve(variant, normal, alpha, band, most, studies, seed):
    from scipy import stats as scipy_stats

    b0 = sum(v and not o for v, o in zip(variant, normal))
    c0 = sum(o and not v for v, o in zip(variant, normal))
    rng = np.random.default_rng(seed)
    concentration = np.array([b0, c0, len(variant) - b0 - c0], dtype=float) + 0.5
    powers = []
    for n in range(1, most + 1):
        counts = rng.multinomial(n, rng.dirichlet(concentration, size=studies))
        decided = 0
        for b, c, _ in counts:
            agree = b > 0 and tail(int(b), int(b + c)) <= alpha
            upper = 1.0 if b == n else scipy_stats.beta.ppf(1 - alpha, b + 1, n - b)
            decided += bool(agree or upper < band)
        powers.append(decided / studies)
    return powers


def test_unstable_power_curve_is_the_simulation_written_out():
    variant, normal = [True, False, False, True, False], [False, False, True, False, False]
    found = statistics.power_curve_unstable(variant, normal, most=40, studies=200, seed=2)
    assert found == pytest.approx(reference_unstable_curve(variant, normal, 0.05, 0.1, 40, 200, 2))
    found = statistics.power_curve_unstable(variant, normal, alpha=1 / 16, band=0.2, most=30, studies=100, seed=4)
    assert found == pytest.approx(reference_unstable_curve(variant, normal, 1 / 16, 0.2, 30, 100, 4))
    defaults = statistics.power_curve_unstable(variant, normal)
    assert len(defaults) == 100
    assert defaults[:2] == pytest.approx(reference_unstable_curve(variant, normal, 0.05, 0.1, 2, 2000, 0))
    assert statistics.seeds_needed_unstable(variant, normal) == statistics.first_lasting(defaults, 0.8)
    assert statistics.seeds_needed_unstable(variant, normal, power=0.5, most=60) == statistics.first_lasting(
        statistics.power_curve_unstable(variant, normal, most=60), 0.5)
    with pytest.raises(ValueError, match="one flag per seed"):
        statistics.power_curve_unstable([True], [True, False])


def test_the_p_of_a_verdict_is_its_own_test_not_the_nearer_one():
    """Where the other side's p is smaller, the row still prints the p of the test that decided."""
    x = [0.05] * 5 + [0.2]       # six seeds above 0, five below the band of 0.1
    # "not beyond" agrees (5 of 6 below the band: p = 7/64); above 0 would give 1/64
    found = statistics.decide("not beyond", x, 0.1, direction="higher", alpha=0.125)
    assert found["verdict"] == "agrees" and found["p"] == pytest.approx(7 / 64)
    # "directional" disagrees at 0.125 (5 of 6 below the band); above 0 would give 1/64
    found = statistics.decide("directional", x, 0.1, direction="higher", alpha=0.05, alpha_disagree=0.125)
    assert found["verdict"] == "disagrees" and found["p"] == pytest.approx(7 / 64)
    claim = statistics.decide_claim("not beyond", [[x]], 0.1, direction="higher", alpha=0.125)
    assert claim["verdict"] == "agrees" and claim["p"] == pytest.approx(7 / 64)
    claim = statistics.decide_claim("directional", [[x]], 0.1, direction="higher", alpha=0.125)
    assert claim["verdict"] == "disagrees" and claim["p"] == pytest.approx(7 / 64)


def test_a_claim_whose_smallest_p_is_the_level_can_decide():
    five = [0.3] * 5
    assert statistics.decide_claim("directional", [[five]], 0.1, alpha=1 / 32)["cannot_decide"] is False
    # two settings: agreeing needs 2/32, disagreeing (every setting) 1/32 = alpha: still decidable
    found = statistics.decide_claim("directional", [[five], [five]], 0.1, scope="some", alpha=1 / 32)
    assert found["smallest_agree"] == 2 / 32 and found["smallest_disagree"] == 1 / 32
    assert found["cannot_decide"] is False
    assert statistics.decide_claim("directional", [[five[:4]], [five[:4]]], 0.1, scope="some",
                                   alpha=1 / 32)["cannot_decide"] is True


def test_seeds_needed_passes_every_setting_on():
    x = [0.3, 0.2, -0.05, 0.5, 0.25, 0.12, 0.35]
    settings = dict(direction="higher", alpha=0.1, choices=2, comparisons=3, most=30, studies=300, seed=7)
    for kind in KINDS:
        assert statistics.seeds_needed(kind, x, 0.1, power=0.6, **settings) == statistics.first_lasting(
            statistics.power_curve(kind, x, 0.1, **settings), 0.6)
        curve = statistics.power_curve(kind, x, 0.1, **settings)
        for name, other in (("alpha", 0.05), ("comparisons", 1), ("studies", 301), ("seed", 8)):
            assert statistics.power_curve(kind, x, 0.1, **{**settings, name: other}) != curve, (kind, name)
    # the defaults are those documented: no correction, 100 seeds, 2000 studies, seed 0
    mixed = [0.3, -0.2, 0.05, -0.5, 0.25, 0.3, -0.1]
    assert statistics.power_curve("comparable", mixed, 0.1) == statistics.power_curve(
        "comparable", mixed, 0.1, direction="lower", alpha=0.05, choices=1, comparisons=1, most=100, studies=2000,
        seed=0)
    assert statistics.power_curve("comparable", mixed, 0.1) != statistics.power_curve(
        "comparable", mixed, 0.1, comparisons=2)


def test_the_unstable_curve_at_a_wide_band_and_its_defaults():
    """At a band near 1 the Clopper-Pearson branch decides small studies: where every seed is
    unstable with the variant alone the bound is 1 (never below the band), elsewhere Beta's
    quantile with n - b >= 1."""
    variant, normal = [True, False, False], [False, False, False]
    for band in (0.95, 0.99):
        found = statistics.power_curve_unstable(variant, normal, band=band, most=8, studies=300, seed=1)
        assert found == pytest.approx(reference_unstable_curve(variant, normal, 0.05, band, 8, 300, 1))
    assert statistics.power_curve_unstable(variant, normal) == statistics.power_curve_unstable(
        variant, normal, alpha=0.05, band=0.1, most=100, studies=2000, seed=0)
    for name, other in (("studies", 2001), ("seed", 1)):
        assert statistics.power_curve_unstable(variant, normal) != statistics.power_curve_unstable(
            variant, normal, **{name: other})


def test_unstable_is_the_rule_written_out():
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(30)
    for _ in range(300):
        n = int(rng.integers(1, 36))
        variant = [bool(v) for v in rng.random(n) < rng.random()]
        normal = [bool(v) for v in rng.random(n) < rng.random()]
        alpha, band = float(rng.choice([0.05, 1 / 32, 0.1])), float(rng.choice([0.1, 0.2]))
        b = sum(v and not o for v, o in zip(variant, normal))
        c = sum(o and not v for v, o in zip(variant, normal))
        p_agree = tail(b, b + c) if b else Fraction(1)
        upper = 1.0 if b == n else scipy_stats.beta.ppf(1 - alpha, b + 1, n - b)
        verdict = "agrees" if p_agree <= alpha else "disagrees" if upper < band else "inconclusive"
        p_disagree = scipy_stats.binom.cdf(b, n, band)
        found = statistics.unstable(variant, normal, alpha=alpha, band=band)
        assert (found["verdict"], found["only_variant"], found["only_normal"], found["n"]) == (verdict, b, c, n)
        assert found["p_agree"] == pytest.approx(float(p_agree)) and found["upper"] == pytest.approx(upper)
        expected_p = p_agree if verdict == "agrees" else p_disagree if verdict == "disagrees" else min(
            float(p_agree), p_disagree)
        assert found["p"] == pytest.approx(float(expected_p))
        assert found["smallest_disagree"] == pytest.approx((1 - band) ** n)


def test_the_other_sides_smallest_p_decides_whether_a_claim_can_be_decided():
    # comparable: agreeing can reach 1/32 = alpha, disagreeing only 2/32: the claim can still decide
    assert statistics.decide_claim("comparable", [[[0.0] * 5]], 0.1, alpha=1 / 32)["cannot_decide"] is False


def test_seeds_needed_unstable_passes_every_setting_on():
    variant, normal = [True, False, False, True, False], [False, False, True, False, False]
    settings = dict(alpha=0.1, band=0.2, most=40, studies=300, seed=5)
    for power in (0.5, 0.8):
        assert statistics.seeds_needed_unstable(variant, normal, power=power, **settings) == statistics.first_lasting(
            statistics.power_curve_unstable(variant, normal, **settings), power)
    assert statistics.seeds_needed_unstable(variant, normal) == statistics.first_lasting(
        statistics.power_curve_unstable(variant, normal, alpha=0.05, band=0.1, most=100, studies=2000, seed=0), 0.8)
