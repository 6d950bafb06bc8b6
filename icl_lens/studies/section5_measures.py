"""Reading Section 5's task records as paired measurements: a model's final loss or speed, its
difference from the model it is compared with, per seed, the round-off twins' noise floor and the
seeds that cannot vote (a failed screen, decided before training). The claims of
:mod:`icl_lens.studies.section5_claims` are decided on these numbers.

Chapters: experiments, claims.
"""

import math

from icl_lens import statistics
from icl_lens.studies.section5_readings import (curve_scale, finite_or_none, log_ratio, normalised_loss, run_length,
                                                seed_key)

# one band for every measure, since each is a log: log(1.1), a tenth of the loss either way (a
# band in units of the label variance would be as wide as the loss itself where the layers learn
# the task to ~1% of it)
BAND = math.log(1.1)


def find_model(record, name, seed):
    return next(m for m in record["models"] if m["name"] == name and m["seed"] == seed)


def partner(record, model):
    """The normal model of the same seed and learning rate (the paper's normal model for a control)."""
    normals = [m for m in record["models"] if m["group"] == "normal" and m["seed"] == model["seed"]]
    if model["group"] == "normal":
        return normals[0]
    return next(m for m in normals if m["lr"] == model["lr"])


def constant_phase_end(record, until=1.0):
    """The epoch at which the run of ``until`` x epochs starts to decay (its end for "constant")."""
    config = record.get("config", {})
    decay = config.get("decay_fraction", 0.2) if config.get("schedule", "constant") == "decay" else 0.0
    return run_length(record, until) * (1 - decay)


def speed(record, model, until=1.0, part="all"):
    """How fast a model's test loss falls: the mean over the checkpoints of the constant-rate phase
    of the run of ``until`` x epochs (before its decay) of log(test loss / label variance), the
    area under the normalised log test curve. ``part`` "late" keeps the last third of those
    checkpoints; "early" reads the part of the run before the first checkpoint, which the test
    curve does not see, from the per-epoch training loss. Lower is faster; inf for a model that
    diverged there."""
    end = constant_phase_end(record, until)
    if part == "early":
        points = model["train_loss"][:max(1, record["checkpoint_epochs"][0] - 1)]
    else:
        points = [loss for epoch, loss in zip(record["checkpoint_epochs"], model["test_curve"])
                  if epoch <= end + 1e-9]
        points = points[-max(1, len(points) // 3):] if part == "late" else points
    if not points:
        raise ValueError(f"the record has no checkpoint in the constant-rate phase of {run_length(record, until)} epochs")
    variance = curve_scale(record, model["seed"])
    if any(loss is None or not math.isfinite(loss) for loss in points):
        return math.inf
    return sum(math.log(loss / variance) for loss in points) / len(points)


# the levels a speed is read at (time to level), as fractions of the label variance, per task; fixed
# from the five-seed record (test losses at 16 checkpoints) before the twenty-seed run was read: a
# level the normal models' median running minimum crosses while it still falls, in the constant-rate
# phase (linear: 0.08 at epochs 30-40 of 160, 0.03 near 90 at lr 0.003 and 50 at 0.005, 0.015 near
# 70 at 0.005; trigonometric 0.9 near 100 of 320; exponential 0.1 near 300 of 600). "early" and
# "late" are the linear task's two levels for "slower at first, faster later" (g2+).
SPEED_LEVELS = {
    "linear": {"speed": 0.03, "speed, early": 0.08, "speed, late": 0.015},
    "trigonometric": {"speed": 0.9},
    "exponential": {"speed": 0.1},
}
# speeds read by time to level; the area (mean log loss) readings stay as a note beside their rows
QUANTITIES = {"final": None, "speed": None, "speed, early": None, "speed, late": None,
              "area": "all", "area, early": "early", "area, late": "late"}
AREA_OF = {"speed": "area", "speed, early": "area, early", "speed, late": "area, late"}


def speed_level(record, quantity):
    """The level (fraction of the label variance) at which ``quantity`` is read on ``record``'s task."""
    # a record may carry its own levels (a study of other tasks, a test); else the task's
    levels = record.get("speed_levels") or SPEED_LEVELS.get(record.get("task"), {})
    if quantity not in levels:
        raise ValueError(f"no {quantity!r} level is fixed for the {record.get('task')} task (SPEED_LEVELS)")
    return levels[quantity]


def time_to_level(record, model, level, until=1.0):
    """How fast a model gets to ``level``: the epoch at which the running minimum of its normalised
    test loss (test MSE / label variance) first reaches ``level``, interpolated in log loss between
    the two checkpoints around the crossing, read in the constant-rate phase of the run of
    ``until`` x epochs (the decay would lower every curve at once). Before the first checkpoint the
    curve starts at the first epoch's mean training loss, placed at epoch 0. inf where the model
    never reaches the level there (censored: slower than any model that does) or diverged."""
    end = constant_phase_end(record, until)
    variance = curve_scale(record, model["seed"])
    first = model["train_loss"][0]
    points = [(0, math.inf if first is None else first / variance)]
    points += [(epoch, math.inf if loss is None else loss / variance)
               for epoch, loss in zip(record["checkpoint_epochs"], model["test_curve"]) if epoch <= end + 1e-9]
    lowest = math.inf
    for (e0, l0), (e1, l1) in zip(points, points[1:]):
        lowest = min(lowest, l0)
        if lowest <= level:
            return float(e0)
        if l1 <= level:
            if not math.isfinite(lowest):
                return float(e1)
            return e0 + (e1 - e0) * (math.log(lowest) - math.log(level)) / (math.log(lowest) - math.log(l1))
    return 0.0 if points[0][1] <= level else math.inf


def measured(record, model, until, quantity):
    """The number a claim about ``quantity`` reads for one model: the normalised final loss, the
    time to the task's level (:func:`time_to_level`) or the area reading (:func:`speed`)."""
    if quantity == "final":
        return normalised_loss(record, model, until)
    if quantity.startswith("speed"):
        return time_to_level(record, model, speed_level(record, quantity), until)
    return speed(record, model, until, QUANTITIES[quantity])


def difference(variant, other, quantity):
    """The paired difference of one seed: log(variant / other) of normalised final losses or of
    times to level, or variant - other of area readings (already logs). inf where only the variant
    diverged or never reached the level, -inf where only ``other`` did, 0 where both did (a tie):
    no seed is left out for how it trained."""
    if not math.isfinite(other):
        return 0.0 if not math.isfinite(variant) else -math.inf
    if quantity == "final" or quantity.startswith("speed"):
        return log_ratio(variant, other)
    return variant - other


def twin_gap(record, seed, until=1.0, quantity="final"):
    """How far the round-off twin of a seed's normal model ends from it, as :func:`difference`
    on ``quantity``; None for a record without twins."""
    twin = next((m for m in record["models"] if m["group"] == "twin" and m["seed"] == seed), None)
    if twin is None:
        return None
    normal = partner(record, twin)
    gap = difference(measured(record, twin, until, quantity), measured(record, normal, until, quantity), quantity)
    return gap if math.isfinite(gap) else math.inf


def chaotic(record, seed, until=1.0, quantity="final"):
    """Whether a seed's round-off twin ends more than :data:`BAND` from its normal model on
    ``quantity``: a noisy draw (it votes; the noise floor reports it)."""
    gap = twin_gap(record, seed, until, quantity)
    return gap is not None and abs(gap) > BAND


def seeds_apart(record):
    """{seed: why it cannot vote}: its task draw failed the screen, decided before training. A record
    without screening leaves every seed in."""
    apart = {}
    for seed in sorted({m["seed"] for m in record["models"]}):
        screened = record.get("screening", {}).get(seed_key(seed))
        if screened is not None and not screened["passes"]:
            apart[seed] = (f"fails the screen: Nadaraya-Watson gains {screened['gain']:.3f} of the label "
                           "variance over the context mean")
    return apart


def deciding_seeds(record):
    apart = seeds_apart(record)
    return [s for s in sorted({m["seed"] for m in record["models"]}) if s not in apart]


def noise_floor(record, until=1.0, quantity="final"):
    """The median over the deciding seeds of |twin - normal| on ``quantity`` (None without twins)."""
    gaps = [twin_gap(record, s, until, quantity) for s in deciding_seeds(record)]
    gaps = [abs(g) for g in gaps if g is not None]
    return statistics.median(gaps) if gaps else None


# a speed row whose pairs are ties at the level (neither model reaches it, or both start at it) on
# more than this share of its seeds does not measure speed at that level: it is inconclusive
MOST_TIES = 0.2


def level_tie(pair):
    """Why a pair of times to a level orders nothing, or None: neither model reaches the level in
    the constant-rate phase, or both are at it from the first point. The seed still votes (a tie,
    difference 0: no seed leaves after training); too many ties make the row unmeasured there."""
    variant, other = pair
    if math.isinf(variant) and math.isinf(other):
        return "a tie: neither model reaches the level"
    if variant == 0.0 and other == 0.0:
        return "a tie: both models are at the level from the first point"
    return None


def paired(record, name, *, until=1.0, against=None, quantity="final"):
    """Variant ``name`` against its normal partner (or, with ``against``, the model of that name) on
    every seed that votes: the measures of ``quantity``, their per-seed differences
    (:func:`difference`), the ordinary median, the two-sided 95% sign-test interval of the
    differences (None below 6 seeds) with its coverage, and the seeds better / worse by more than
    the band / diverged; the screened-out seeds apart, with their differences; and for a speed how
    many voting seeds' pairs are ties at the level (:func:`level_tie`, ``ties``)."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {list(QUANTITIES)}, got {quantity!r}")
    apart = seeds_apart(record)
    rows, set_apart, seeds = [], {}, []
    for seed in sorted({m["seed"] for m in record["models"]}):
        model = find_model(record, name, seed)
        other = find_model(record, against, seed) if against else partner(record, model)
        pair = (measured(record, model, until, quantity), measured(record, other, until, quantity))
        if seed in apart:
            set_apart[seed_key(seed)] = {"reason": apart[seed],
                                         "difference": finite_or_none(difference(*pair, quantity))}
        else:
            rows.append(pair)
            seeds.append(seed)
    variant = [v for v, _ in rows]
    differences = [difference(v, o, quantity) for v, o in rows]
    kept = [d for d in differences if not math.isnan(d)]
    low, high, coverage = statistics.two_sided_interval(kept) if kept else (None, None, None)
    return {
        "name": name,
        "against": against or "normal (same seed and lr)",
        "seed_list": seeds,
        "variant": [finite_or_none(v) for v in variant],
        "partner": [finite_or_none(o) for _, o in rows],
        "difference": [None if math.isnan(d) else finite_or_none(d) if math.isfinite(d) else
                       (1e300 if d > 0 else -1e300) for d in differences],
        "median_variant": finite_or_none(statistics.median(variant)) if variant else None,
        "median_difference": finite_or_none(statistics.median(kept)) if kept else None,
        "interval": [None if low is None else finite_or_none(low), None if high is None else finite_or_none(high)],
        "coverage": coverage,
        "no_effect": BAND,
        "quantity": quantity,
        "better": sum(d < -BAND for d in kept),
        "worse": sum(d > BAND for d in kept),
        "diverged": sum(not math.isfinite(v) for v in variant),
        "seeds": len(kept),
        "seeds_apart": set_apart,
        "ties": sum(level_tie(pair) is not None for pair in rows) if quantity.startswith("speed") else 0,
    }


def raw_differences(comparison):
    """The per-seed differences of :func:`paired` as floats (None: the comparator diverged)."""
    return [math.nan if d is None else math.inf if d >= 1e300 else -math.inf if d <= -1e300 else d
            for d in comparison["difference"]]


def variant_rows(record, until=1.0):
    """One paired comparison per non-normal model name (controls against the paper's normal)."""
    seed = record["models"][0]["seed"]
    names = [m["name"] for m in record["models"] if m["seed"] == seed][1:]
    return [paired(record, name, until=until) for name in names]


def number(value, digits=3):
    """A loss or difference for a table; "diverged" for a diverged model (None, inf, or the bootstrap's
    stand-in for inf, 1e300)."""
    if value is None or not math.isfinite(value) or abs(value) >= 1e300:
        return "diverged"
    return f"{value:.{digits}g}"


def markdown_rows(rows):
    """Paired comparisons as a Markdown table (losses divided by the label variance; the paired
    difference as the log ratio of the two)."""
    lines = ["| model | median loss | median log(model / normal) | 95% sign-test interval | no effect within | "
             "better / worse / diverged |", "|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["interval"]
        interval = (f"none at n = {r['seeds']} (needs 6)" if r.get("coverage") is None
                    else f"[{number(low, 2)}, {number(high, 2)}] (>= {r['coverage']:.3f})")
        lines.append(f"| {r['name']} | {number(r['median_variant'])} | {number(r['median_difference'], 2)} | "
                     f"{interval} | ±{number(r['no_effect'], 2)} | "
                     f"{r['better']} / {r['worse']} / {r['diverged']} |")
    return "\n".join(lines)


def spread(values):
    """The sample standard deviation (n - 1 in the denominator)."""
    mean = sum(values) / len(values)
    return math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1))


def test_set_noise(record):
    """How much noise the test set adds to a seed's number, measured on the record itself: each
    model's final test loss on the disjoint parts of its seed's test set (``test_loss_parts``).
    For a model alone, the standard deviation over parts of log(loss on a part); for a paired
    difference, that of log(variant / partner) part by part (both read the same part, so a part's
    hard prompts cancel). Medians over the models (deciding seeds, finite losses); divided by the
    square root of the number of parts, the noise of the whole test set. None for a record
    without parts (the five-seed run)."""
    apart = seeds_apart(record)
    single, paired_spread, count = [], [], None
    for model in record["models"]:
        parts = model.get("test_loss_parts")
        if not parts or model["seed"] in apart or any(p is None or p <= 0 for p in parts) or len(parts) < 2:
            continue
        count = len(parts)
        single.append(spread([math.log(p) for p in parts]))
        if model["group"] in ("normal", "twin"):
            continue
        other = partner(record, model).get("test_loss_parts")
        if other and all(o is not None and o > 0 for o in other):
            paired_spread.append(spread([math.log(p / o) for p, o in zip(parts, other)]))
    if not single:
        return None
    whole = math.sqrt(count)
    sequences = record.get("config", {}).get("test_sequences")
    return {"parts": count, "sequences_per_part": None if sequences is None else sequences // count,
            "model_per_part": statistics.median(single), "paired_per_part": statistics.median(paired_spread)
            if paired_spread else None, "model_whole_set": statistics.median(single) / whole,
            "paired_whole_set": statistics.median(paired_spread) / whole if paired_spread else None,
            "band": BAND}
