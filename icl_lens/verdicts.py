"""The verdict machinery every study uses: paired comparisons with a bootstrap interval, the
no-effect band, the rules that turn a comparison into a verdict, the convergence criterion and
the claim row. Each study passes its own band, rule and tolerance; none is fixed here.

Chapters: experiments, across_tasks, closeness_experiment, bert.

A paired comparison holds, over the seeds, the differences (variant - reference) of one measure,
their median, a percentile-bootstrap 95% interval of that median, and how many seeds moved beyond
their band in either direction. ``lower_is_better`` says which direction is an improvement (a loss:
True; an accuracy: False). The rules read the interval in units of improvement:

    helps       agrees if the interval lies on the improving side of 0 (and, where the median
                ``effect`` is given, that median improves by more than the band); disagrees if the
                interval lies on the other side, or inside the band (with ``effect_beyond_band``:
                before the sign is read, so an effect smaller than the band is no effect); else
                inconclusive
    hurts       the mirror image of helps
    no gain     disagrees if the interval lies on the improving side of 0; agrees if its improving
                end stays within the band; else inconclusive
    not worse   disagrees if the interval lies on the worsening side of 0; agrees if its worsening
                end stays within the band; else inconclusive
    comparable  agrees if the interval lies inside the band; disagrees if it lies wholly beyond
                the band on one side; else inconclusive
"""

import math
from dataclasses import dataclass
from typing import TypedDict

import torch

from icl_lens.device import generator as make_generator

RESAMPLES = 10_000
VERDICTS = ("agrees", "disagrees", "inconclusive")
RULE_NAMES = ("helps", "hurts", "no gain", "not worse", "comparable")


class PairedComparison(TypedDict):
    """What :func:`paired_comparison` returns (the studies add their own fields around it)."""

    median: float                   # median over seeds of the differences (nan where none is left)
    interval: list                  # [low, high]: bootstrap 95% interval of that median
    better: int                     # seeds that improved by more than their band
    worse: int                      # seeds that got worse by more than their band


def bootstrap_median_interval(differences, *, resamples=RESAMPLES, level=0.95, seed=0):
    """Percentile bootstrap interval of the median of ``differences`` (inf allowed: a diverged
    model). Returns (low, high)."""
    values = torch.as_tensor(differences, dtype=torch.float64)
    if values.numel() == 0:
        raise ValueError("differences must hold at least one value")
    picks = torch.randint(0, len(values), (resamples, len(values)), generator=make_generator(seed))
    medians = values[picks].sort(dim=1).values[:, (len(values) - 1) // 2]
    tail = (1 - level) / 2
    low, high = torch.quantile(medians.nan_to_num(posinf=1e300, neginf=-1e300), torch.tensor([tail, 1 - tail],
                                                                                             dtype=torch.float64))
    return float(low), float(high)


def median(values):
    """The median of ``values`` in float64 (the lower middle value for an even count, as torch)."""
    return float(torch.tensor(list(values), dtype=torch.float64).median())


def paired_comparison(differences, bands, *, lower_is_better=True, level=0.95):
    """Median, bootstrap interval (at ``level``) and the seeds beyond their band, of per-seed
    ``differences`` (variant - reference; nan where the reference diverged, left out) with per-seed
    ``bands``. Returns a :class:`PairedComparison`."""
    if len(bands) != len(differences):
        raise ValueError(f"bands must give one band per difference ({len(differences)}), got {len(bands)}")
    kept = [(d, b) for d, b in zip(differences, bands) if not math.isnan(d)]
    low, high = bootstrap_median_interval([d for d, _ in kept], level=level) if kept else (math.nan, math.nan)
    sign = -1 if lower_is_better else 1
    return {"median": median(d for d, _ in kept) if kept else math.nan, "interval": [low, high],
            "better": sum(sign * d > b for d, b in kept), "worse": sum(-sign * d > b for d, b in kept)}


def improvement_interval(interval, lower_is_better):
    """An interval of differences in units of improvement (positive: the variant is better)."""
    low, high = interval
    return (-high, -low) if lower_is_better else (low, high)


def inside_band(interval, band):
    """Whether the whole interval lies within +-band (False where either is missing)."""
    if band is None or None in interval:
        return False
    low, high = interval
    return -band <= low and high <= band


def helps(interval, band, *, lower_is_better=True, effect_beyond_band=True, effect=None):
    """The rule for a claim that the variant is better (see the module text); ``effect`` is the
    median difference, which must then improve by more than ``band`` for "agrees"."""
    if None in interval:
        return "inconclusive"
    low, high = improvement_interval(interval, lower_is_better)
    if effect_beyond_band and inside_band(interval, band):
        return "disagrees"      # no effect worth the name
    gain = None if effect is None else (-effect if lower_is_better else effect)
    if low > 0 and (gain is None or gain > band):
        return "agrees"
    if high < 0 or inside_band(interval, band):
        return "disagrees"
    return "inconclusive"


def hurts(interval, band, *, lower_is_better=True, effect_beyond_band=True, effect=None):
    """The rule for a claim that the variant is worse: :func:`helps` with the direction reversed."""
    return helps(interval, band, lower_is_better=not lower_is_better, effect_beyond_band=effect_beyond_band,
                 effect=effect)


def comparable(interval, band):
    """The rule for a claim that the variant is as good as the other, to within the band."""
    if None in interval:
        return "inconclusive"
    low, high = interval
    if inside_band(interval, band):
        return "agrees"
    if low > band or high < -band:
        return "disagrees"
    return "inconclusive"


def no_gain(interval, band, *, lower_is_better=True):
    """The rule for a claim that the variant is not better by more than the band."""
    if None in interval:
        return "inconclusive"
    low, high = improvement_interval(interval, lower_is_better)
    if low > 0:
        return "disagrees"
    return "agrees" if high <= band else "inconclusive"


def not_worse(interval, band, *, lower_is_better=True):
    """The rule for a claim that the variant is at least as good, to within the band."""
    if None in interval:
        return "inconclusive"
    low, high = improvement_interval(interval, lower_is_better)
    if high < 0:
        return "disagrees"
    return "agrees" if low >= -band else "inconclusive"


def converged(improvements, tolerance, *, two_sided=False):
    """The convergence criterion: the median over seeds of what training twice as long improves
    (``improvements``, one per seed, in the study's units) is below ``tolerance``. With
    ``two_sided`` each seed's move counts by its size, so a seed that got worse has not converged
    either, and the median is of the sizes (moves of opposite sign do not cancel). Returns the
    median, the seeds that meet it and the verdict."""
    size = abs if two_sided else (lambda x: x)
    middle = median(size(d) for d in improvements)
    return {"median_improvement": middle, "seeds_converged": sum(size(d) < tolerance for d in improvements),
            "converged": bool(math.isfinite(middle) and middle < tolerance)}


def matches(ratio, tolerance):
    """Whether a ratio of two losses is 1 to within ``tolerance`` (a layer as good as its comparator)."""
    return abs(ratio - 1) <= tolerance


@dataclass(frozen=True)
class Claim:
    """One empirical claim: its id, where the paper makes it, the task, the claim in our words, the
    rule that judges it and which variants it names (``select`` picks names from a record; with
    several, the best is used), and the quantity it is about: "final" (the result at the end of
    training) or "speed" (how fast the loss falls; "speed, early" reads the epochs before the first
    test checkpoint, from the training loss, and "speed, late" the last third of the checkpoints
    before the decay)."""

    id: str
    where: str
    task: str
    claim: str
    rule: str
    select: object = None
    quantity: str = "final"
