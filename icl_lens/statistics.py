"""The one statistical design every empirical claim is decided by (the claims page states it).

Chapters: claims, experiments, bert, closeness_experiment.

A comparison is a list of per-seed paired differences ``d`` (variant minus comparator, one per
seed; a seed whose comparator diverged is left out and n says so). A claim has a direction:
``"lower"`` (the variant's measure is lower: a loss that is better, a speed measure that is
faster) or ``"higher"``. The differences read in the claim's direction are ``x = -d`` for
"lower" and ``x = d`` for "higher"; the effect ``e`` is the ordinary median of ``x`` (the mean of
the two middle values for an even count).

Bounds are sign-test order statistics (distribution-free): for n values sorted
x(1) <= ... <= x(n), the one-sided lower bound at level alpha is x(k) with the largest k such
that P(Bin(n, 1/2) <= k - 1) <= alpha, and the upper bound is x(n - k + 1); each covers the median
with probability >= 1 - alpha (its achieved coverage, 1 - P(Bin(n, 1/2) <= k - 1), is printed as
">= c"). Below n = 5 no one-sided 95% bound exists. Decisions are made with the sign test's exact
p-values, which agree with the bounds: "L > c" at level alpha is P(Bin(n, 1/2) >= #{x > c}) <=
alpha. A value equal to a threshold counts as not beyond it (a zero is no effect); n is kept.

Per claim kind, at one-sided alpha (0.05), with ``band`` the no-effect band:

=================== ==================================== =======================================
kind                agrees                               disagrees
=================== ==================================== =======================================
directional         L > 0 and e >= band                  U < band
slightly            L > 0                                U <= 0
comparable          -band < L and U < band (TOST)        L > band or U < -band (each at alpha/2)
not beyond          U < band                             L > 0 and e >= band
=================== ==================================== =======================================

"not beyond" is "no significant improvement" (direction: the improving one) and "not worse" /
"sufficient" (direction: the worsening one). Anything else is inconclusive; the two columns
cannot both hold. A comparison whose n cannot reach alpha says "cannot decide at n = ...".

Sets of settings (:func:`decide_claim`): a claim about *every* setting it names (or every
comparator) agrees only if each of its m comparisons agrees at alpha (intersection-union, no
correction) and disagrees if one does at alpha / m (a union, Bonferroni); a claim about *some*
setting takes the best of its k alternatives at alpha / k (Bonferroni; the best is one that
agrees, then the smallest p-value, chosen at the end of training and kept at half) and
disagrees only if every alternative disagrees.

Family: :func:`family_adjusted` applies Benjamini-Yekutieli (valid under any dependence) to
both tests of every row (agreeing and disagreeing); tests whose smallest attainable p cannot pass
BY's largest threshold are left out of the family (Tarone).

Power: :func:`seeds_needed` simulates studies under the comparison's rule (its levels), drawing
the probabilities of the four regions that the thresholds cut (x < -band, -band <= x <= 0,
0 < x < band, x >= band) from their Dirichlet posterior given the observed seeds. It leaves out
the half-of-training check and the family correction: an estimate, not a guarantee.
"""

import math

import numpy as np
from scipy import stats

ALPHA = 0.05
KINDS = ("directional", "slightly", "comparable", "not beyond")
DIRECTIONS = ("lower", "higher")
VERDICTS = ("agrees", "disagrees", "inconclusive")


def median(values):
    """The ordinary median (the mean of the two middle values for an even count)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("values must hold at least one value")
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return float(ordered[middle])
    low, high = ordered[middle - 1], ordered[middle]
    if math.isinf(low) and math.isinf(high) and low != high:
        return math.nan
    return float((low + high) / 2)


def binomial_tail(successes, n):
    """P(Bin(n, 1/2) >= successes): the one-sided sign test's p-value."""
    if successes <= 0:
        return 1.0
    return float(stats.binom.sf(successes - 1, n, 0.5))


def rank_for(n, alpha):
    """The largest k with P(Bin(n, 1/2) <= k - 1) <= alpha (0 where none: no bound at that n)."""
    k = 0
    while k + 1 <= n and float(stats.binom.cdf(k, n, 0.5)) <= alpha:
        k += 1
    return k


def one_sided_bounds(values, alpha=ALPHA):
    """(L, U, coverage): the sign-test lower and upper one-sided bounds of the median at level
    ``alpha`` and the coverage each achieves at this n (>= 1 - alpha); (None, None, None) where no
    bound exists at this n (fewer than 5 values at alpha = 0.05)."""
    ordered = sorted(values)
    n = len(ordered)
    k = rank_for(n, alpha)
    if k == 0:
        return None, None, None
    coverage = 1 - float(stats.binom.cdf(k - 1, n, 0.5))
    return float(ordered[k - 1]), float(ordered[n - k]), coverage


def two_sided_interval(values, level=0.95):
    """(low, high, coverage): the sign-test interval [x(k), x(n - k + 1)] with the largest k
    whose coverage 1 - 2 P(Bin(n, 1/2) <= k - 1) is >= ``level``; Nones below n = 6 (at 95%)."""
    low, high, coverage = one_sided_bounds(values, (1 - level) / 2)
    return low, high, None if coverage is None else 1 - 2 * (1 - coverage)


def p_above(values, threshold):
    """Sign-test p-value that the median exceeds ``threshold``: P(Bin(n, 1/2) >= #{x > t})."""
    return binomial_tail(sum(x > threshold for x in values), len(values))


def p_below(values, threshold, inclusive=False):
    """Sign-test p-value that the median is below ``threshold`` (or at most it, ``inclusive``)."""
    count = sum(x <= threshold if inclusive else x < threshold for x in values)
    return binomial_tail(count, len(values))


def smallest_p(n):
    """The smallest one-sided sign-test p-value attainable with n values, 2 ** -n."""
    return 0.5 ** n


def in_direction(differences, direction):
    """The differences read in the claim's direction (positive: as the claim says)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    sign = -1.0 if direction == "lower" else 1.0
    kept = [float(d) for d in differences if d is not None and not math.isnan(d)]
    return [sign * d for d in kept]


def decide(kind, differences, band, *, direction="lower", alpha=ALPHA, alpha_disagree=None):
    """One comparison by the rule of ``kind`` (see the module text). ``differences`` are per-seed
    variant - comparator (None or nan: left out); ``band`` > 0; ``alpha_disagree`` the level of the
    disagreeing test where it differs from ``alpha`` (a union of comparisons, corrected).

    Returns {verdict, effect, lower, upper, coverage, n, p_agree, p_disagree, p, alpha,
    smallest_agree, smallest_disagree, cannot_decide}: the effect and bounds in the claim's
    direction, the p-values of the tests for agreeing and for disagreeing (for a two-test
    condition, the larger of its two; for a one-of-two condition, twice the smaller), ``p`` the one
    of the verdict (for an inconclusive comparison the smaller of the two: the test that came
    nearest), the smallest p each side can reach at this n, and ``cannot_decide`` where neither
    side can reach its level."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if not (isinstance(band, (int, float)) and band > 0 and math.isfinite(band)):
        raise ValueError(f"band must be a positive finite number, got {band!r}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must lie in (0, 0.5), got {alpha!r}")
    alpha_disagree = alpha if alpha_disagree is None else alpha_disagree
    x = in_direction(differences, direction)
    n = len(x)
    smallest_agree = smallest_p(n)
    smallest_disagree = min(1.0, 2 * smallest_p(n)) if kind == "comparable" else smallest_p(n)
    found = {"n": n, "alpha": alpha, "alpha_disagree": alpha_disagree, "effect": None, "lower": None,
             "upper": None, "coverage": None, "p_agree": 1.0, "p_disagree": 1.0, "p": 1.0, "verdict": "inconclusive",
             "smallest_agree": smallest_agree, "smallest_disagree": smallest_disagree,
             "cannot_decide": smallest_agree > alpha and smallest_disagree > alpha_disagree}
    if n == 0:
        return found
    effect = median(x)
    lower, upper, coverage = one_sided_bounds(x, alpha)
    found.update(effect=effect, lower=lower, upper=upper, coverage=coverage)
    beyond = effect >= band
    if kind == "directional":
        p_agree, p_disagree = p_above(x, 0.0), p_below(x, band)
        agree, disagree = p_agree <= alpha and beyond, p_disagree <= alpha_disagree
    elif kind == "slightly":
        p_agree, p_disagree = p_above(x, 0.0), p_below(x, 0.0, inclusive=True)
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree
    elif kind == "comparable":
        p_agree = max(p_above(x, -band), p_below(x, band))
        p_disagree = min(1.0, 2 * min(p_above(x, band), p_below(x, -band)))
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree
    else:   # "not beyond"
        p_agree, p_disagree = p_below(x, band), p_above(x, 0.0)
        agree, disagree = p_agree <= alpha, p_disagree <= alpha_disagree and beyond
    if agree and disagree:     # cannot happen (tested); kept as a guard on the table above
        raise AssertionError(f"{kind}: both agrees and disagrees hold for {x}")
    verdict = "agrees" if agree else "disagrees" if disagree else "inconclusive"
    p = p_agree if agree else p_disagree if disagree else min(p_agree, p_disagree)
    found.update(verdict=verdict, p_agree=p_agree, p_disagree=p_disagree, p=p)
    return found


def decide_claim(kind, alternatives, band, *, direction="lower", scope="every", alpha=ALPHA, choice=None, k=None,
                 unmeasured=None):
    """A claim over sets of settings. ``alternatives`` is a list of alternatives, each a list of
    per-seed difference lists (an alternative holds only if each of its m comparisons holds: a
    setting against each comparator it names, or every setting against the normal model).

    - Within an alternative, agreeing needs every comparison to agree at the alternative's level
      (intersection-union, no correction); disagreeing needs one comparison to disagree, a union
      of m tests, so each is tested at level / m and the alternative's p is m x the smallest.
    - ``scope`` "every": one alternative at ``alpha``. "some": the best of the k alternatives at
      alpha / k (Bonferroni), chosen among those that agree, then by the smallest p; the claim
      disagrees only if every alternative disagrees at ``alpha`` (intersection-union again).
    - ``choice`` fixes the alternative (an index; at half of training, the one chosen at the
      end); ``k`` the number of alternatives the choice was made among, where fewer are passed.
    - ``unmeasured`` (booleans shaped like ``alternatives``) marks comparisons the measure cannot
      read (a speed at a level most pairs tie at): such a comparison neither agrees nor disagrees,
      so its alternative cannot agree, while a measured comparison that disagrees still refutes it.

    Returns {verdict, p, p_agree, p_disagree, chosen, k, level, comparisons (of the chosen
    alternative), weakest (the index of the comparison that decides), smallest_p (the smallest p
    the claim can reach on either side at these n), cannot_decide}."""
    if scope not in ("every", "some"):
        raise ValueError(f"scope must be 'every' or 'some', got {scope!r}")
    if not alternatives or any(not alternative for alternative in alternatives):
        raise ValueError("alternatives must hold at least one alternative of at least one comparison")
    if scope == "every" and len(alternatives) != 1:
        raise ValueError(f"a claim about every setting has one alternative (all its comparisons), "
                         f"got {len(alternatives)}")
    k = k or len(alternatives)
    if k < len(alternatives):
        raise ValueError(f"k must be at least the number of alternatives ({len(alternatives)}), got {k}")
    unmeasured = unmeasured or [[False] * len(alternative) for alternative in alternatives]
    if [len(flags) for flags in unmeasured] != [len(alternative) for alternative in alternatives]:
        raise ValueError("unmeasured must hold one flag per comparison of each alternative")
    level = alpha / k
    # an unread comparison: no verdict, and no p-value that could decide either side
    unread = {"verdict": "inconclusive", "p_agree": 1.0, "p_disagree": 1.0, "p": 1.0, "smallest_agree": 1.0,
              "smallest_disagree": 1.0, "not_measured": True}

    def judged_at(agree_level, disagree_level):
        def judged(differences, flag, m):
            found = decide(kind, differences, band, direction=direction, alpha=agree_level,
                           alpha_disagree=disagree_level / m)
            return {**found, **unread} if flag else found
        return [[judged(d, flag, len(alternative)) for d, flag in zip(alternative, flags)]
                for alternative, flags in zip(alternatives, unmeasured)]

    for_agreeing, for_disagreeing = judged_at(level, alpha), judged_at(alpha, alpha)

    def agree_p(comparisons):
        return max(c["p_agree"] for c in comparisons)

    def disagree_p(comparisons):
        return min(1.0, len(comparisons) * min(c["p_disagree"] for c in comparisons))

    def agrees(comparisons):
        return all(c["verdict"] == "agrees" for c in comparisons)

    def lowest_effect(comparisons):
        return min(c["effect"] if c["effect"] is not None else -math.inf for c in comparisons)

    chosen = choice if choice is not None else min(
        range(len(alternatives)),
        key=lambda i: (not agrees(for_agreeing[i]), agree_p(for_agreeing[i]), -lowest_effect(for_agreeing[i])))
    comparisons = for_agreeing[chosen]
    disagreeing = [any(c["verdict"] == "disagrees" for c in alternative) for alternative in for_disagreeing]
    p_agree = min(1.0, k * agree_p(comparisons))
    p_disagree = max(disagree_p(alternative) for alternative in for_disagreeing)
    verdict = "agrees" if agrees(comparisons) else "disagrees" if all(disagreeing) else "inconclusive"
    p = p_agree if verdict == "agrees" else p_disagree if verdict == "disagrees" else min(p_agree, p_disagree)
    # the comparison that decides: one that does not agree, else the one nearest to failing
    weakest = min(range(len(comparisons)), key=lambda i: (comparisons[i]["verdict"] == "agrees",
                                                          -comparisons[i]["p_agree"],
                                                          comparisons[i]["effect"] if comparisons[i]["effect"]
                                                          is not None else -math.inf))
    if verdict == "disagrees":
        comparisons = for_disagreeing[chosen]
        weakest = min(range(len(comparisons)), key=lambda i: comparisons[i]["p_disagree"])
    smallest_agree = k * max(c["smallest_agree"] for c in for_agreeing[chosen])
    smallest_disagree = max(len(a) * min(c["smallest_disagree"] for c in a) for a in for_disagreeing)
    return {"verdict": verdict, "p": p, "p_agree": p_agree, "p_disagree": p_disagree, "chosen": chosen,
            "k": k, "level": level, "comparisons": comparisons, "weakest": weakest,
            "smallest_p": min(smallest_agree, smallest_disagree), "smallest_agree": min(1.0, smallest_agree),
            "smallest_disagree": min(1.0, smallest_disagree),
            "cannot_decide": smallest_agree > alpha and smallest_disagree > alpha}


def family_adjusted(p_values, smallest=None, alpha=ALPHA):
    """Benjamini-Yekutieli adjusted p-values (valid under any dependence) of the tests that can
    pass, None for the others. ``smallest`` gives each test's smallest attainable p: a test that
    cannot reach alpha / c(m) (the largest threshold BY gives, c(m) = 1 + 1/2 + ... + 1/m) cannot
    be rejected, and leaving it out of m is Tarone's refinement; repeated until m settles."""
    smallest = smallest or [0.0] * len(p_values)
    kept = [i for i, p in enumerate(p_values) if p is not None]
    while True:
        m = len(kept)
        threshold = alpha / sum(1 / j for j in range(1, m + 1)) if m else alpha
        fewer = [i for i in kept if smallest[i] <= threshold]
        if len(fewer) == m:
            break
        kept = fewer
    adjusted = [None] * len(p_values)
    if kept:
        found = stats.false_discovery_control([p_values[i] for i in kept], method="by")
        for i, value in zip(kept, found):
            adjusted[i] = float(value)
    return adjusted


def regions(x, band):
    """Counts of x < -band, -band <= x <= 0, 0 < x < band, x >= band."""
    return [sum(v < -band for v in x), sum(-band <= v <= 0 for v in x), sum(0 < v < band for v in x),
            sum(v >= band for v in x)]


def critical_count(n, alpha):
    """The fewest successes out of n whose one-sided sign-test p-value is <= alpha (n + 1: none)."""
    tails = stats.binom.sf(np.arange(n + 1) - 1, n, 0.5)      # P(Bin >= c) for c = 0..n
    passing = np.nonzero(tails <= alpha)[0]
    return int(passing[0]) if len(passing) else n + 1


def decided_by_counts(kind, counts, n, alpha, alpha_disagree):
    """Whether simulated studies with region ``counts`` (shape (studies, 4)) decide under ``kind``
    (agreeing at ``alpha``, disagreeing at ``alpha_disagree``): from counts alone (values on a
    threshold have measure 0)."""
    below_minus, low, up, beyond = (counts[:, i] for i in range(4))
    need, against = critical_count(n, alpha), critical_count(n, alpha_disagree)
    effect_beyond = beyond >= n // 2 + 1     # the median at least the band (conservative for even n)
    if kind == "directional":
        agree, disagree = (up + beyond >= need) & effect_beyond, below_minus + low + up >= against
    elif kind == "slightly":
        agree, disagree = up + beyond >= need, below_minus + low >= against
    elif kind == "comparable":
        either = critical_count(n, alpha_disagree / 2)
        agree = (low + up + beyond >= need) & (below_minus + low + up >= need)
        disagree = (beyond >= either) | (below_minus >= either)
    else:
        agree, disagree = below_minus + low + up >= need, (up + beyond >= against) & effect_beyond
    return agree | disagree


PRIOR = 0.5    # Dirichlet pseudo-count of each of the four regions: a prior mass of 2, as Beta(1, 1)'s


def power_curve(kind, differences, band, *, direction="lower", alpha=ALPHA, choices=1, comparisons=1, most=100,
                studies=2000, seed=0):
    """[power at n = 1, ..., ``most``]: the share of ``studies`` simulated studies of n seeds that
    decide (agree or disagree) under :func:`decide`'s rule, agreeing at alpha / ``choices`` and
    disagreeing at alpha / ``comparisons``; each study's region probabilities are drawn from
    Dirichlet(:data:`PRIOR` + the observed counts of the four regions), then its n seeds' regions."""
    x = in_direction(differences, direction)
    rng = np.random.default_rng(seed)
    concentration = np.array(regions(x, band), dtype=float) + PRIOR
    powers = []
    for n in range(1, most + 1):
        probabilities = rng.dirichlet(concentration, size=studies)
        counts = rng.multinomial(n, probabilities)
        powers.append(float(decided_by_counts(kind, counts, n, alpha / choices, alpha / comparisons).mean()))
    return powers


def first_lasting(powers, power):
    """The smallest n (counting from 1) from which every entry of ``powers`` is at least ``power``;
    None if the last one is not."""
    for n in range(1, len(powers) + 1):
        if all(value >= power for value in powers[n - 1:]):
            return n
    return None


def seeds_needed(kind, differences, band, *, direction="lower", alpha=ALPHA, choices=1, comparisons=1,
                 power=0.8, most=100, studies=2000, seed=0):
    """An estimate by simulation of the seeds a comparison needs: the smallest n (up to ``most``)
    from which at least ``power`` of simulated studies decide (:func:`power_curve`); None if none
    up to ``most``. It leaves out the half-of-training check and the family correction."""
    return first_lasting(power_curve(kind, differences, band, direction=direction, alpha=alpha, choices=choices,
                                     comparisons=comparisons, most=most, studies=studies, seed=seed), power)


def unstable(variant_unstable, normal_unstable, *, alpha=ALPHA, band=0.1):
    """A claim that a variant makes training unstable, paired by seed (each flag: the run diverged or
    ended worse than predicting the mean). Agrees if the exact McNemar test (one-sided, on the
    discordant seeds) finds the variant unstable more often at ``alpha``; disagrees if the exact
    (Clopper-Pearson) one-sided upper bound of the share of seeds where only the variant is
    unstable is below ``band``; else inconclusive."""
    if len(variant_unstable) != len(normal_unstable):
        raise ValueError("variant_unstable and normal_unstable must have one flag per seed each")
    only_variant = sum(v and not o for v, o in zip(variant_unstable, normal_unstable))
    only_normal = sum(o and not v for v, o in zip(variant_unstable, normal_unstable))
    n = len(variant_unstable)
    p_agree = binomial_tail(only_variant, only_variant + only_normal) if only_variant else 1.0
    upper = 1.0 if only_variant == n else float(stats.beta.ppf(1 - alpha, only_variant + 1, n - only_variant))
    verdict = "agrees" if p_agree <= alpha else "disagrees" if upper < band else "inconclusive"
    p_disagree = float(stats.binom.cdf(only_variant, n, band))    # P(that few | share = band)
    p = p_agree if verdict == "agrees" else p_disagree if verdict == "disagrees" else min(p_agree, p_disagree)
    smallest_disagree = float(stats.binom.cdf(0, n, band))     # no seed unstable with the variant alone
    return {"verdict": verdict, "only_variant": only_variant, "only_normal": only_normal, "n": n,
            "upper": upper, "band": band, "p_agree": p_agree, "p_disagree": p_disagree, "p": p,
            "smallest_agree": smallest_p(n), "smallest_disagree": smallest_disagree,
            "smallest_p": min(smallest_p(n), smallest_disagree),
            "cannot_decide": smallest_p(n) > alpha and smallest_disagree > alpha}


def power_curve_unstable(variant_unstable, normal_unstable, *, alpha=ALPHA, band=0.1, most=100, studies=2000,
                         seed=0):
    """:func:`power_curve` for :func:`unstable`: the shares of seeds where only the variant, only
    the normal model, or both or neither are unstable drawn from Dirichlet(:data:`PRIOR` + observed
    counts), then each study's n seeds; a study decides if McNemar's exact test agrees or the
    Clopper-Pearson bound of the variant-only share is below ``band``."""
    if len(variant_unstable) != len(normal_unstable):
        raise ValueError("variant_unstable and normal_unstable must have one flag per seed each")
    only_variant = sum(v and not o for v, o in zip(variant_unstable, normal_unstable))
    only_normal = sum(o and not v for v, o in zip(variant_unstable, normal_unstable))
    rest = len(variant_unstable) - only_variant - only_normal
    rng = np.random.default_rng(seed)
    concentration = np.array([only_variant, only_normal, rest], dtype=float) + PRIOR
    powers = []
    for n in range(1, most + 1):
        counts = rng.multinomial(n, rng.dirichlet(concentration, size=studies))
        b, c = counts[:, 0], counts[:, 1]
        agree = (b > 0) & (stats.binom.sf(b - 1, b + c, 0.5) <= alpha)
        upper = np.where(b == n, 1.0, stats.beta.ppf(1 - alpha, b + 1, np.maximum(n - b, 1)))
        powers.append(float((agree | (upper < band)).mean()))
    return powers


def seeds_needed_unstable(variant_unstable, normal_unstable, *, alpha=ALPHA, band=0.1, power=0.8, most=100,
                          studies=2000, seed=0):
    """:func:`seeds_needed` for :func:`unstable` (:func:`power_curve_unstable`)."""
    return first_lasting(power_curve_unstable(variant_unstable, normal_unstable, alpha=alpha, band=band, most=most,
                                              studies=studies, seed=seed), power)
