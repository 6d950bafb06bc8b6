"""What the studies share besides the decisions (those are :mod:`icl_lens.statistics`'s): the
paired summary of per-seed differences that tables and figures show, the convergence criterion and
the closeness of two losses.

Chapters: experiments, across_tasks, closeness_experiment, bert.

A paired comparison holds, over the seeds, the differences (variant - reference) of one measure,
their ordinary median, the 95% sign-test interval of that median where the seeds allow one (from 6;
:func:`icl_lens.statistics.two_sided_interval`) and how many seeds moved beyond their band in
either direction. ``lower_is_better`` says which direction is an improvement (a loss: True; an
accuracy: False).
"""

import math
from typing import TypedDict

import torch

from icl_lens import statistics

VERDICTS = statistics.VERDICTS


class PairedComparison(TypedDict):
    """What :func:`paired_comparison` returns (the studies add their own fields around it)."""

    median: float                   # median over seeds of the differences (nan where none is left)
    interval: list                  # [low, high]: 95% sign-test interval of that median ([None, None] below 6)
    coverage: float | None          # its achieved coverage
    better: int                     # seeds that improved by more than their band
    worse: int                      # seeds that got worse by more than their band


def lower_median(values):
    """The median of ``values`` in float64 (the lower middle value for an even count, as torch): the
    convergence criteria's, kept so that their saved numbers stay what they are. Claims use
    :func:`icl_lens.statistics.median`."""
    return float(torch.tensor(list(values), dtype=torch.float64).median())


def paired_comparison(differences, bands, *, lower_is_better=True):
    """Median, 95% sign-test interval and the seeds beyond their band, of per-seed ``differences``
    (variant - reference; nan where the reference diverged, left out) with per-seed ``bands``.
    Returns a :class:`PairedComparison`."""
    if len(bands) != len(differences):
        raise ValueError(f"bands must give one band per difference ({len(differences)}), got {len(bands)}")
    kept = [(d, b) for d, b in zip(differences, bands) if not math.isnan(d)]
    low, high, coverage = statistics.two_sided_interval([d for d, _ in kept]) if kept else (None, None, None)
    sign = -1 if lower_is_better else 1
    return {"median": statistics.median(d for d, _ in kept) if kept else math.nan, "interval": [low, high],
            "coverage": coverage, "better": sum(sign * d > b for d, b in kept),
            "worse": sum(-sign * d > b for d, b in kept)}


def converged(improvements, tolerance, *, two_sided=False):
    """The convergence criterion: the median over seeds of what training twice as long improves
    (``improvements``, one per seed, in the study's units) is below ``tolerance``. With
    ``two_sided`` each seed's move counts by its size, so a seed that got worse has not converged
    either, and the median is of the sizes (moves of opposite sign do not cancel). Returns the
    median, the seeds that meet it and the verdict."""
    size = abs if two_sided else (lambda x: x)
    middle = lower_median(size(d) for d in improvements)
    return {"median_improvement": middle, "seeds_converged": sum(size(d) < tolerance for d in improvements),
            "converged": bool(math.isfinite(middle) and middle < tolerance)}


def matches(ratio, tolerance):
    """Whether a ratio of two losses is 1 to within ``tolerance`` (a layer as good as its comparator)."""
    return abs(ratio - 1) <= tolerance
