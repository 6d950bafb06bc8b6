"""Every empirical claim of Section 5 / Appendix E as a row (:data:`CLAIMS`), paired comparisons of
the trained models and the verdict of each claim, by the rules of :mod:`icl_lens.verdicts`.

Chapters: experiments, claims.

Every modified model is compared with the normal model of the same seed and learning rate: they
share the task weight, the training sequences, the test set and the initial weights, so the
per-seed log ratio of their normalised test losses, log(variant / normal), is a paired
measurement, and so is the difference of their speeds (mean log losses). Over the seeds that can
decide we report the median, a bootstrap 95% interval of that median (widened to 1 - 0.05 / k
where the best of k variants is chosen) and the number of seeds better / worse.

Seeds that cannot decide are reported apart: a task draw that fails the training-free screen
(:func:`icl_lens.studies.section5.screen`, decided before training), and a seed whose normal
model's round-off twin (:data:`icl_lens.studies.section5.TWIN_NUDGE`) ends further from it than
the band, on the claim's own measure: there the result is set by round-off, not by the variant.

Verdict rules (for a claim that a variant *helps*; a claim that it *hurts* is the mirror image):

    disagrees     the whole interval lies inside the no-effect band (+-log 1.1: a tenth of the
                  loss either way), or above 0
    agrees        otherwise, if the whole interval lies below 0 and the median improves by more
                  than the band
    inconclusive  otherwise

With five seeds the bootstrap interval of the median runs from about the smallest to the largest
value, so "agrees" needs every deciding seed better (a sign test would give p = 1/32).

A verdict that changes between half of training and the end is inconclusive (``stable``
False). Test losses are those at the end of the run, where the learning rate has decayed to 0
(:func:`icl_lens.studies.section5.reported_loss`); "half of training" is the same run at half the
epochs, with its own decay (for a constant-rate record: the last and the second quarter's means).
"""

import math

import torch

from icl_lens import context_use, verdicts
from icl_lens.approximation import ApproximationConfig, log_log_slope
from icl_lens.studies.section5 import finite_or_none, log_ratio, normalised_loss, run_length, seed_key
from icl_lens.validation import check_positive_int
from icl_lens.verdicts import RESAMPLES, Claim

# one band for every measure, since each is a log: log(1.1), a tenth of the loss either way (a
# band in units of the label variance would be as wide as the loss itself where the layers learn
# the task to ~1% of it)
BAND = math.log(1.1)
LEVEL = 0.95        # of the intervals; 1 - (1 - LEVEL) / k where the best of k variants is chosen
RULES = {
    "final": "test MSE at the end of training (the learning rate decays to 0 over the last fifth of "
             "the steps), divided by the label variance of the seed's test set; paired with the normal "
             "model of the same seed and learning rate as the log ratio log(variant / normal)",
    "speed": "the mean over the checkpoints before the decay of log(test MSE / label variance), the area "
             "under the normalised log test curve (lower is faster); 'late' keeps the last third of those "
             "checkpoints, 'early' reads the epochs before the first checkpoint from the training loss; "
             "paired as the difference variant - normal (a log ratio of geometric means)",
    "interval": f"percentile bootstrap ({RESAMPLES} resamples) 95% interval of the median over the deciding "
                "seeds; where the best of k variants is chosen, a 1 - 0.05 / k interval (Bonferroni)",
    "no effect": f"within +-log(1.1) = {BAND:.3f} on either measure: a tenth of the loss either way",
    "seeds": "a seed decides unless its task draw fails the screen (before training: Nadaraya-Watson must "
             "beat the context mean by 5% of the label variance) or its normal model's twin, nudged at "
             "round-off level, ends more than the band from it on the claim's measure (chaotic); those "
             "seeds are reported apart",
    "helps": "disagrees if the interval lies inside the no-effect band or above 0; agrees if it lies below 0 "
             "and the median improves by more than the band; else inconclusive",
    "hurts": "the mirror image of helps",
    "comparable": "agrees if the interval lies inside the no-effect band; disagrees if it lies wholly beyond "
                  "it on one side; else inconclusive",
    "no gain": "disagrees if the interval lies below 0; agrees if its lower end stays within the band; "
               "else inconclusive",
    "unstable": "agrees if a seed diverges or ends worse than predicting the mean (normalised loss > 1)",
    "worse-than-single": "the best combination against the best single regularized or augmented model, by "
                         "the hurts rule",
    "not-worse-than-more": "the best regularized + augmented combination that was also trained with negative "
                           "samples added, against that model: disagrees if the interval lies above 0, agrees "
                           "if its upper end stays within the band",
    "best": "where a claim names several variants, the one with the lowest median difference is used "
            "(for 'comparable': the one closest to 0), chosen again at half of training; its interval is "
            "widened for the choice",
    "stability": "the verdict is computed at the end and on the same run trained for half the epochs "
                 "(with its own decay); if they differ the claim is inconclusive (except instability "
                 "seen at the end: a divergence is not undone by training longer)",
}


def find_model(record, name, seed):
    return next(m for m in record["models"] if m["name"] == name and m["seed"] == seed)


def partner(record, model):
    """The normal model of the same seed and learning rate (the paper's normal model for a control)."""
    normals = [m for m in record["models"] if m["group"] == "normal" and m["seed"] == model["seed"]]
    if model["group"] == "normal":
        return normals[0]
    return next(m for m in normals if m["lr"] == model["lr"])


def speed(record, model, until=1.0, part="all"):
    """How fast a model's test loss falls: the mean over the checkpoints of the constant-rate phase
    of the run of ``until`` x epochs (before its decay) of log(test loss / label variance), the
    area under the normalised log test curve. ``part`` "late" keeps the last third of those
    checkpoints; "early" reads the part of the run before the first checkpoint, which the test
    curve does not see, from the per-epoch training loss. Lower is faster; inf for a model that
    diverged there."""
    epochs = run_length(record, until)
    config = record.get("config", {})
    decay = config.get("decay_fraction", 0.2) if config.get("schedule", "constant") == "decay" else 0.0
    end = epochs * (1 - decay)
    if part == "early":
        points = model["train_loss"][:max(1, record["checkpoint_epochs"][0] - 1)]
    else:
        points = [loss for epoch, loss in zip(record["checkpoint_epochs"], model["test_curve"])
                  if epoch <= end + 1e-9]
        points = points[-max(1, len(points) // 3):] if part == "late" else points
    if not points:
        raise ValueError(f"the record has no checkpoint in the constant-rate phase of {epochs} epochs")
    variance = record["baselines"][seed_key(model["seed"])]["label_variance"]
    if any(loss is None or not math.isfinite(loss) for loss in points):
        return math.inf
    return sum(math.log(loss / variance) for loss in points) / len(points)


QUANTITIES = {"final": None, "speed": "all", "speed, early": "early", "speed, late": "late"}


def measured(record, model, until, quantity):
    """The number a claim about ``quantity`` reads for one model: the normalised final loss or a
    :func:`speed`."""
    if quantity == "final":
        return normalised_loss(record, model, until)
    return speed(record, model, until, QUANTITIES[quantity])


def difference(variant, other, quantity):
    """The paired difference of one seed: log(variant / other) of normalised final losses, or
    variant - other of speeds (already logs). nan where ``other`` diverged (left out), inf where only
    the variant did."""
    if not math.isfinite(other):
        return math.nan
    if quantity == "final":
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


def seeds_apart(record, until=1.0, quantity="final"):
    """{seed: why it cannot decide}: its task draw fails the screen, or its normal model's twin ends
    more than :data:`BAND` from it on ``quantity`` (chaotic). A record without screening or twins
    (older runs, the temperature check) leaves every seed in."""
    apart = {}
    for seed in sorted({m["seed"] for m in record["models"]}):
        screened = record.get("screening", {}).get(seed_key(seed))
        gap = twin_gap(record, seed, until, quantity)
        if screened is not None and not screened["passes"]:
            apart[seed] = (f"fails the screen: Nadaraya-Watson gains {screened['gain']:.3f} of the label "
                           "variance over the context mean")
        elif gap is not None and abs(gap) > BAND:
            apart[seed] = f"chaotic: its normal model's round-off twin ends {number(gap, 2)} from it"
    return apart


def paired(record, name, *, until=1.0, against=None, quantity="final", choices=1):
    """Variant ``name`` against its normal partner (or, with ``against``, the model of that name) on
    every seed: the measure of ``quantity`` (normalised final losses, or speeds), their paired
    differences (:func:`difference`), and over the seeds that can decide (:func:`seeds_apart`) the
    median, its bootstrap interval (at 1 - 0.05 / ``choices``: the variant is the best of that many),
    the no-effect band and the counts of seeds better / worse by more than the band / diverged; the
    seeds set apart with their reasons and differences."""
    if quantity not in QUANTITIES:
        raise ValueError(f"quantity must be one of {list(QUANTITIES)}, got {quantity!r}")
    check_positive_int(choices, "choices")
    apart = seeds_apart(record, until, quantity)
    rows, set_apart = [], {}
    for seed in sorted({m["seed"] for m in record["models"]}):
        model = find_model(record, name, seed)
        other = find_model(record, against, seed) if against else partner(record, model)
        pair = (measured(record, model, until, quantity), measured(record, other, until, quantity))
        if seed in apart:
            set_apart[seed_key(seed)] = {"reason": apart[seed],
                                         "difference": finite_or_none(difference(*pair, quantity))}
        else:
            rows.append(pair)
    variant = [v for v, _ in rows]
    differences = [difference(v, o, quantity) for v, o in rows]
    level = 1 - (1 - LEVEL) / choices
    compared = verdicts.paired_comparison(differences, [BAND] * len(rows), level=level)
    low, high = compared["interval"]
    return {
        "name": name,
        "against": against or "normal (same seed and lr)",
        "variant": [finite_or_none(v) for v in variant],
        "partner": [finite_or_none(o) for _, o in rows],
        "difference": [finite_or_none(d) for d in differences],
        "median_variant": finite_or_none(verdicts.median(variant)) if variant else None,
        "median_difference": finite_or_none(compared["median"]),
        "interval": [finite_or_none(low), finite_or_none(high)],
        "level": level,
        "no_effect": BAND,
        "quantity": quantity,
        "better": compared["better"],
        "worse": compared["worse"],
        "diverged": sum(not math.isfinite(v) for v in variant),
        "seeds": len(rows),
        "seeds_apart": set_apart,
    }


def inside_band(comparison):
    """Whether a comparison's whole interval lies inside its no-effect band."""
    return verdicts.inside_band(comparison["interval"], comparison["no_effect"])


def verdict_helps(comparison):
    return verdicts.helps(comparison["interval"], comparison["no_effect"], effect=comparison["median_difference"])


def verdict_hurts(comparison):
    if None in comparison["interval"] and comparison["diverged"]:
        return "agrees"      # a diverged variant is worse, whatever the interval of the rest
    return verdicts.hurts(comparison["interval"], comparison["no_effect"], effect=comparison["median_difference"])


def verdict_comparable(comparison):
    return verdicts.comparable(comparison["interval"], comparison["no_effect"])


def verdict_no_gain(comparison):
    return verdicts.no_gain(comparison["interval"], comparison["no_effect"])


def verdict_not_worse(comparison):
    if None in comparison["interval"] and comparison["diverged"]:
        return "disagrees"   # a diverged variant is worse, whatever the interval of the rest
    return verdicts.not_worse(comparison["interval"], comparison["no_effect"])


def verdict_unstable(comparison):
    """Instability: a seed diverges or ends worse than predicting the mean (normalised loss > 1)."""
    losses = [math.inf if v is None else v for v in comparison["variant"]]
    return "agrees" if any(v > 1 for v in losses) else "disagrees"


def best_of(record, names, *, until=1.0, quantity="final", closest=False):
    """The name among ``names`` with the lowest median paired difference of ``quantity`` at
    ``until`` (the paper, too, reports its best setting; the choice is remade at half of training);
    with ``closest``, the one whose median difference is closest to 0 (for "comparable")."""
    scored = [(paired(record, n, until=until, quantity=quantity)["median_difference"], n) for n in names]
    if closest:
        scored = [(None if d is None else abs(d), n) for d, n in scored]
    return min(scored, key=lambda pair: math.inf if pair[0] is None else pair[0])[1]


SECTION5_RULES = {"helps": verdict_helps, "hurts": verdict_hurts, "comparable": verdict_comparable,
                  "no gain": verdict_no_gain, "unstable": verdict_unstable}


def names_where(record, predicate):
    """Names of the models (one seed's worth) whose modification satisfies ``predicate``."""
    seed = record["models"][0]["seed"]
    return [m["name"] for m in record["models"] if m["seed"] == seed and m["group"] != "normal"
            and predicate(m["group"], m["modification"])]


def regularized(form, sign):
    return lambda g, m: g == "regularized" and m["alpha_form"] == form and m["renormalise"] and m["alpha"] * sign > 0


def is_alpha(value):
    return lambda g, m: g == "regularized" and abs(m["alpha"] - value) < 1e-9


def augmented(value_map, key_map):
    return lambda g, m: g == "augmented" and (m["value_map"], m["key_map"]) == (value_map, key_map)


def negative(k=None, beta=None):
    return lambda g, m: g == "negative" and (k is None or m["negative_k"] == k) and (beta is None or m["beta"] == beta)


def claims_for_both_readings(id, where, task, claim, rule, sign, quantity):
    """One claim about the sign of alpha, judged on each reading of the regularized form."""
    return tuple(Claim(f"{id}-{form}", where, task, f"{claim}; {form} reading", rule, regularized(form, sign),
                       quantity) for form in ("proportional", "constant"))


LINEAR_COMBINATION = (lambda g, m: g == "combination" and m["alpha"] != 0 and m["negative_k"] == 0
                      and "gelu" in (m["value_map"], m["key_map"]))

# Each claim in the paper's words (paraphrased; where: its section and figure), with the direction
# the paper gives it, the quantity it is about and exactly the variants it names.
CLAIMS = (
    # Sec. 5, linear task (Fig. 3), repeated in App. E.1
    *claims_for_both_readings("linear-alpha-positive", "Sec. 5, Fig. 3", "linear",
                              "alpha > 0 converges to a poorer result", "hurts", 1, "final"),
    *claims_for_both_readings("linear-alpha-negative-faster", "Sec. 5, Fig. 3", "linear",
                              "alpha < 0 converges faster", "helps", -1, "speed"),
    *claims_for_both_readings("linear-alpha-negative-comparable", "Sec. 5, Fig. 3", "linear",
                              "alpha < 0 reaches a final result comparable to the normal model",
                              "comparable", -1, "final"),
    Claim("linear-g2-faster", "Sec. 5, Fig. 3", "linear",
          "g2 alone (augmented keys) converges slightly faster", "helps", augmented("none", "gelu"), "speed"),
    Claim("linear-g2-plus-slower-early", "Sec. 5, Fig. 3", "linear",
          "g2+ (a two-layer MLP on the keys) converges slightly slower at first (before the first "
          "test checkpoint)", "hurts",
          augmented("none", "mlp-gelu"), "speed, early"),
    Claim("linear-g2-plus-faster-late", "Sec. 5, Fig. 3", "linear",
          "g2+ eventually accelerates convergence", "helps", augmented("none", "mlp-gelu"), "speed, late"),
    Claim("linear-g2-plus-better", "Sec. 5, Fig. 3", "linear",
          "g2+ achieves a better solution", "helps", augmented("none", "mlp-gelu"), "final"),
    Claim("linear-negative-k3-faster", "Sec. 5, Fig. 3", "linear",
          "negative samples with k = 3, beta = 0.1 can converge slightly faster", "helps", negative(3, 0.1),
          "speed"),
    Claim("linear-combination-sufficient", "App. E.3, Fig. 13", "linear",
          "regularized + augmented is sufficient (read: adding negative samples to it does not do "
          "better)", "not-worse-than-more", LINEAR_COMBINATION),
    # App. E.2.1, trigonometric task (Fig. 11)
    *claims_for_both_readings("trigonometric-alpha-negative-faster", "App. E.2.1, Fig. 11", "trigonometric",
                              "alpha < 0 converges slightly faster", "helps", -1, "speed"),
    *claims_for_both_readings("trigonometric-alpha-negative-better", "App. E.2.1, Fig. 11", "trigonometric",
                              "alpha < 0 reaches a better final result", "helps", -1, "final"),
    Claim("trigonometric-g1-slower", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 alone (augmented values) significantly degrades convergence speed", "hurts",
          augmented("gelu", "none"), "speed"),
    Claim("trigonometric-g1-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 alone significantly degrades the final result", "hurts", augmented("gelu", "none")),
    Claim("trigonometric-g1-g2-slower", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 and g2 together significantly degrade convergence speed", "hurts", augmented("gelu", "gelu"),
          "speed"),
    Claim("trigonometric-g1-g2-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 and g2 together significantly degrade the final result", "hurts", augmented("gelu", "gelu")),
    Claim("trigonometric-g2-comparable", "App. E.2.1, Fig. 11", "trigonometric",
          "g2 alone gives a result comparable with the normal model", "comparable", augmented("none", "gelu")),
    Claim("trigonometric-g2-plus-faster", "App. E.2.1, Fig. 11", "trigonometric",
          "g2+ (two-layer ELU MLP on the keys) accelerates convergence", "helps", augmented("none", "mlp-elu"),
          "speed"),
    Claim("trigonometric-negative-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "negative samples perform worse than the normal model (even the best k)", "hurts", negative()),
    Claim("trigonometric-combinations", "App. E.3, Fig. 13", "trigonometric",
          "combinations are worse than the best single modification", "worse-than-single",
          lambda g, m: g == "combination"),
    # App. E.2.2, exponential task (Fig. 12)
    Claim("exponential-alpha-16-faster", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 16 converges faster (best reading that defines it)", "helps", is_alpha(16.0), "speed"),
    Claim("exponential-alpha-16-better", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 16 achieves a better result (best reading that defines it)", "helps", is_alpha(16.0)),
    Claim("exponential-alpha-sixth-faster", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 1/6 (if '16' lost a fraction bar) converges faster", "helps", is_alpha(1 / 6), "speed"),
    Claim("exponential-alpha-sixth", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 1/6 (if '16' lost a fraction bar) achieves a better result", "helps", is_alpha(1 / 6)),
    Claim("exponential-g1", "App. E.2.2, Fig. 12", "exponential",
          "g1 alone (augmented values) performs better", "helps", augmented("gelu", "none")),
    Claim("exponential-g2", "App. E.2.2, Fig. 12", "exponential",
          "g2 alone (augmented keys) performs better", "helps", augmented("none", "gelu")),
    Claim("exponential-g1-g2-unstable", "App. E.2.2", "exponential",
          "g1 and g2 together make training unstable (a seed diverges or ends worse than the mean)",
          "unstable", augmented("gelu", "gelu")),
    Claim("exponential-negative-no-gain", "App. E.2.2, Fig. 12", "exponential",
          "negative samples show no significant improvement (even the best k)", "no gain", negative()),
    Claim("exponential-combinations", "App. E.3, Fig. 13", "exponential",
          "combinations are worse than the best single modification", "worse-than-single",
          lambda g, m: g == "combination"),
)
# the claims the temperature check judges again on layers without the d**-1/4 scale
TEMPERATURE_CLAIMS = tuple(c for c in CLAIMS if c.id.startswith(("linear-alpha-negative", "linear-g2-faster")))


def temperature_check(with_scale, without_scale):
    """Each of :data:`TEMPERATURE_CLAIMS` judged on the linear task's record (``with_scale``) and on
    the same models trained without the temperature (``without_scale``), side by side."""
    found = []
    for claim in TEMPERATURE_CLAIMS:
        pair = {}
        for key, record in (("with", with_scale), ("without", without_scale)):
            (judged,) = evaluate({"linear": record}, (claim,))
            m = judged["measurement"]
            pair[key] = {"variant": m["name"], "median_difference": m["median_difference"],
                         "interval": m["interval"], "no_effect": m["no_effect"], "better": m["better"],
                         "worse": m["worse"], "verdict": judged["verdict"]}
        changes = pair["with"]["verdict"] != pair["without"]["verdict"]
        found.append({"id": claim.id, "claim": claim.claim, **pair, "changes": changes})
    return found


def measure(claim, record, until):
    """(comparison, verdict) of one claim on one task record at ``until`` of training. Where the
    claim names several variants the best is compared, its interval widened for the choice."""
    names = names_where(record, claim.select)
    if not names:
        raise ValueError(f"claim {claim.id}: the {claim.task} record trains none of its variants")
    quantity = claim.quantity
    best = best_of(record, names, until=until, quantity=quantity, closest=claim.rule == "comparable")
    if claim.rule == "worse-than-single":
        # "worse than using regularized or augmented modification individually" (App. E.3)
        single = names_where(record, lambda g, m: g in ("regularized", "augmented"))
        best_single = best_of(record, single, until=until, quantity=quantity)
        comparison = paired(record, best, until=until, against=best_single, quantity=quantity,
                            choices=len(names) * len(single))
        return comparison, verdict_hurts(comparison)
    if claim.rule == "not-worse-than-more":   # each combination against itself with negatives added
        added = {name: [n for n in names_where(record, lambda g, m: m["negative_k"] > 0)
                        if n.startswith(name + " + k=")] for name in names}
        names = [name for name in names if added[name]]
        if not names:
            raise ValueError(f"claim {claim.id}: no combination of the {claim.task} record has a counterpart "
                             "with negative samples")
        best = best_of(record, names, until=until, quantity=quantity)
        comparison = paired(record, best, until=until, quantity=quantity,
                            against=best_of(record, added[best], until=until, quantity=quantity),
                            choices=len(names) * len(added[best]))
        return comparison, verdict_not_worse(comparison)
    comparison = paired(record, best, until=until, quantity=quantity, choices=len(names))
    return comparison, SECTION5_RULES[claim.rule](comparison)


def evaluate(records, claims=CLAIMS):
    """Every claim whose task is in ``records``: the comparison and verdict at the end of training
    and at half of it; a verdict that differs between the two is reported as inconclusive."""
    results = []
    for claim in claims:
        if claim.task not in records:
            continue
        record = records[claim.task]
        full, verdict_full = measure(claim, record, 1.0)
        half, verdict_half = measure(claim, record, 0.5)
        # a divergence cannot be undone by training longer, so instability seen at the end stands
        stable = verdict_full == verdict_half or (claim.rule == "unstable" and verdict_full == "agrees")
        results.append({
            "id": claim.id, "where": claim.where, "task": claim.task, "claim": claim.claim, "rule": claim.rule,
            "quantity": claim.quantity,
            "measurement": full, "at_half": half, "verdict_at_end": verdict_full, "verdict_at_half": verdict_half,
            "stable": stable, "verdict": verdict_full if stable else "inconclusive",
        })
    return results


def exact_claim(curves, tolerance=1e-24, **row):
    """An identity on trained layers: after N per-demonstration steps the dual prediction equals
    the layer's output to float64 round-off on every equivalence curve of ``curves`` (the squared
    gap at t = N, relative to the gap at t = 0 where that is above 1)."""
    worst = max(curve["squared_error"][-1] / max(1.0, curve["squared_error"][0]) for curve in curves)
    return {**row, "rule": "exact", "measurement": {"worst_relative_squared_gap": worst, "tolerance": tolerance,
                                                    "layers": len(curves)},
            "quantity": "final", "stable": True, "verdict": "agrees" if worst <= tolerance else "disagrees"}


def equivalence_claim(records, tolerance=1e-24):
    """Theorem 3.1 on the trained layers (Fig. 3, left): after N per-demonstration steps the dual
    prediction equals the layer's output to float64 round-off on every task and seed."""
    return exact_claim([curve for record in records.values() for curve in record["equivalence"].values()],
                       tolerance, id="equivalence", where="Sec. 5, App. E.2, Figs. 3, 11, 12 (left), Theorem 3.1",
                       task="all",
                       claim="the trained layer's output equals its dual model after N per-demonstration SGD steps")


def transformer_equivalence_claim(rank, tolerance=1e-24):
    """Theorem B.1 on trained Transformer layers (App. E.4, Fig. 14 left): the attention + ReLU FFN
    layers of the rank study, each against its dual model after N per-demonstration steps."""
    if "equivalence" not in rank:
        raise ValueError("the Fig. 14 record has no equivalence curves (it predates them): rerun "
                         "python -m icl_lens reproduce fig14")
    return exact_claim(list(rank["equivalence"].values()), tolerance, id="transformer-equivalence",
                       where="App. E.4, Fig. 14 (left), Theorem B.1", task="linear (trained FFN layers)",
                       claim="a trained Transformer layer's output equals its dual model's test prediction "
                             "after N per-demonstration SGD steps")


def random_feature_claim(study):
    """Figs. 6-8 on trained layers: "as the dimension of random features increases, the
    approximation performance gradually improves". Agrees if the attention MSE falls at every step
    of d_r and by more than the band (:data:`BAND`, a tenth) from the smallest d_r to the largest;
    disagrees if it does not fall overall (log-log slope >= 0) or by no more than the band;
    inconclusive between. The slope is reported: on random layers it is about -1 (an error falling
    like 1/d_r)."""
    counts, errors = study["feature_counts"], study["attention_mse"]
    slope = log_log_slope(counts, errors)
    falling = all(b < a for a, b in zip(errors, errors[1:]))
    fall = math.log(errors[0] / errors[-1])
    verdict = "agrees" if falling and fall > BAND else ("disagrees" if slope >= 0 or fall <= BAND else "inconclusive")
    return {"id": "random-features", "where": "App. E.1, Figs. 6-8", "task": "linear (trained layers)",
            "claim": "the random-feature estimate of attention improves as d_r grows",
            "rule": "falls", "measurement": {"feature_counts": counts, "attention_mse": errors, "slope": slope,
                                             "monotone": falling, "log_fall": fall, "band": BAND},
            "quantity": "final", "stable": True, "verdict": verdict}


# an attention error is "low" below a tenth of the mean attention weight, 1 / (number of tokens)
LOW_LEVEL = 0.1


def low_level_claim(study, num_tokens=ApproximationConfig().num_tokens):
    """Fig. 8 on trained layers: "both errors reaching a low level in the end", read at the
    largest d_r of the study as an attention MAE below :data:`LOW_LEVEL` / num_tokens (a tenth of
    the mean attention weight; the MSE is its square, so the reading holds for both). Agrees if the
    upper quartile over repeats is below it, disagrees if the lower quartile is above, else
    inconclusive; the random layers' error at the same d_r is reported beside."""
    trained, random = study["trained layers (linear task)"], study["iid (random layers)"]
    position = len(trained["feature_counts"]) - 1
    threshold = LOW_LEVEL / num_tokens
    low, high = trained["attention_mae_quartiles"][position]
    verdict = "agrees" if high < threshold else ("disagrees" if low > threshold else "inconclusive")
    largest = trained["feature_counts"][position]
    return {"id": "random-features-low-level", "where": "App. E.1, Fig. 8", "task": "linear (trained layers)",
            "claim": f"the attention error reaches a low level in the end (read: attention MAE below a tenth of "
                     f"the mean weight at the largest d_r, {largest})", "rule": "below",
            "measurement": {"features": largest, "median": trained["attention_mae_median"][position],
                            "quartiles": [low, high],
                            "threshold": threshold, "random_layers": random["attention_mae_median"][position],
                            "ratio_to_random": trained["attention_mae_median"][position]
                            / random["attention_mae_median"][position]},
            "quantity": "final", "stable": True, "verdict": verdict}


LARGER = 0.1    # the largest tenth of the exact attention weights
LESS_ACCURATE = 2.0   # their median absolute error at least this many times the rest's


def larger_values_claim(compared):
    """Fig. 9 on the first seed's trained layer at d_r = 1200: "some larger values are not estimated
    accurately". The median absolute error of the largest :data:`LARGER` of the exact weights
    against that of the others: agrees if at least :data:`LESS_ACCURATE` times it, disagrees if
    no larger, else inconclusive. One layer, one draw of the features."""
    exact = torch.tensor(compared["attention"], dtype=torch.float64).flatten()
    error = (torch.tensor(compared["attention_estimate"], dtype=torch.float64).flatten() - exact).abs()
    order = exact.argsort(descending=True)
    count = max(1, round(LARGER * len(exact)))
    top, rest = float(error[order[:count]].median()), float(error[order[count:]].median())
    ratio = top / rest if rest > 0 else math.inf
    verdict = "agrees" if ratio >= LESS_ACCURATE else ("disagrees" if ratio <= 1 else "inconclusive")
    return {"id": "random-features-larger-values", "where": "App. E.1, Fig. 9", "task": "linear (trained layer, seed 0)",
            "claim": "the larger attention weights are estimated less accurately than the rest", "rule": "ratio",
            "measurement": {"top_error": top, "rest_error": rest, "ratio": ratio, "threshold": LESS_ACCURATE,
                            "share": LARGER},
            "quantity": "final", "stable": True, "verdict": verdict}


def seed_counts(rank, holds, judged):
    """Fig. 14's claims counted in whole seeds: per width d_h, how many seeds' bounds satisfy
    ``holds``; over the widths ``judged`` takes, the fewest; the verdict: agrees if every seed
    holds at every such width, disagrees if fewer than half do at one of them, else inconclusive.
    Returns (counts by width, seeds, fewest, verdict)."""
    counts = {h: sum(holds(b) for b in bounds) for h, bounds in zip(rank["hidden_sizes"], rank["bound_per_seed"])}
    seeds = len(rank["seeds"])
    judged_counts = [counts[h] for h in counts if judged(h)]
    fewest = min(judged_counts) if judged_counts else 0
    verdict = ("agrees" if judged_counts and fewest == seeds else
               "disagrees" if 2 * fewest < seeds else "inconclusive")
    return counts, seeds, fewest, verdict


def rank_claim(rank):
    """Fig. 14 (right) on trained layers, counted seed by seed: a seed saturates at a width d_h when
    its mean of min(d, #active ReLUs) over tokens reaches d - 0.5. Agrees if every seed saturates
    at every width d_h >= the paper's 2.75 d = 33; disagrees if fewer than half do at some such
    width; inconclusive between. Whole seeds are counted, so no mean a hair above its threshold
    decides it."""
    d, threshold = rank["d"], rank["paper_saturation"]
    counts, seeds, fewest, verdict = seed_counts(rank, lambda b: b >= d - 0.5, lambda h: h >= threshold)
    every = [h for h in counts if counts[h] == seeds and all(counts[k] == seeds for k in counts if k >= h)]
    return {"id": "rank-saturation", "where": "App. E.4, Fig. 14 (right)", "task": "linear (trained FFN layers)",
            "claim": f"the Rank(W_F) bound saturates at d = {d} once d_h >= {threshold}",
            "rule": "saturates", "measurement": {"hidden_sizes": rank["hidden_sizes"], "mean_bound": rank["mean_bound"],
                                                 "seeds_saturated": [counts[h] for h in rank["hidden_sizes"]],
                                                 "seeds": seeds, "fewest_at_or_above": fewest,
                                                 "every_seed_from": min(every) if every else None},
            "quantity": "final", "stable": True, "verdict": verdict}


def low_rank_claim(rank):
    """Fig. 14 (right), the sentence's second half: "when d_h is set to a smaller value, W_F
    exhibits clear low-rank property", counted seed by seed as the rank bound staying below
    d - 0.5. Agrees if every seed stays below at every width d_h < 2.75 d; disagrees if fewer than
    half do at some such width; inconclusive between."""
    d, threshold = rank["d"], rank["paper_saturation"]
    counts, seeds, fewest, verdict = seed_counts(rank, lambda b: b < d - 0.5, lambda h: h < threshold)
    return {"id": "rank-low-below", "where": "App. E.4, Fig. 14 (right)", "task": "linear (trained FFN layers)",
            "claim": f"below d_h = {threshold} the Rank(W_F) bound stays clearly below d = {d} (low rank)",
            "rule": "low rank", "measurement": {"hidden_sizes": rank["hidden_sizes"], "seeds": seeds,
                                                "seeds_below": [counts[h] for h in rank["hidden_sizes"]],
                                                "fewest_below": fewest},
            "quantity": "final", "stable": True, "verdict": verdict}


RAISED = 1.5      # a variant's median query weight at least this many times its partner's: "raised"


def context_note(claim, records, context):
    """How the variant a claim is judged on differs in context use from the model it is compared
    with (medians over seeds of :mod:`icl_lens.context_use`'s measurements, from ``context``, the
    saved ``context_use.json``), or None for a claim that compares no variant. ``reading`` says
    whether the variant puts more (or less) weight on the query's own token (:data:`RAISED` times
    its partner's, or that fraction) and whether it predicts better (half its partner's loss) or
    worse (twice) from the query alone."""
    m = claim["measurement"]
    if "name" not in m or claim["task"] not in records:
        return None
    record, by_name = records[claim["task"]], context["tasks"][claim["task"]]
    seed = record["models"][0]["seed"]
    variant = find_model(record, m["name"], seed)
    against = partner(record, variant)["name"] if m["against"].startswith("normal") else m["against"]
    ours, theirs = context_use.medians(by_name[m["name"]]), context_use.medians(by_name[against])
    readings = []
    if None not in (ours["query_weight"], theirs["query_weight"]):
        if ours["query_weight"] > RAISED * max(theirs["query_weight"], 1e-12):
            readings.append("more weight on the query's own token")
        elif ours["query_weight"] < theirs["query_weight"] / RAISED:
            readings.append("less weight on the query's own token")
    if None not in (ours["query_alone"], theirs["query_alone"]):
        if ours["query_alone"] < 0.5 * theirs["query_alone"]:
            readings.append("predicts better from the query alone")
        elif ours["query_alone"] > 2 * theirs["query_alone"]:
            readings.append("predicts worse from the query alone")
    return {"variant": m["name"], "against": against, "variant_measures": ours, "against_measures": theirs,
            "reading": "; ".join(readings) or "no change beyond these factors"}


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
    lines = ["| model | median loss | median log(model / normal) | 95% interval | no effect within | "
             "better / worse / diverged |", "|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["interval"]
        lines.append(f"| {r['name']} | {number(r['median_variant'])} | {number(r['median_difference'], 2)} | "
                     f"[{number(low, 2)}, {number(high, 2)}] | +-{number(r['no_effect'], 2)} | "
                     f"{r['better']} / {r['worse']} / {r['diverged']} |")
    return "\n".join(lines)


def measured_text(result):
    """What was measured for one claim, in a line (the verdict table's "our measurement")."""
    m, rule = result["measurement"], result["rule"]
    if rule == "exact":
        return f"worst squared gap {m['worst_relative_squared_gap']:.1e} over {m['layers']} trained layers"
    if rule == "falls":
        return (f"MSE slope {m['slope']:.2f} in log-log, log(first / last) {m['log_fall']:.2f} against a band of "
                f"{m['band']:.3f}")
    if rule == "low rank":
        return f"{m['fewest_below']} of {m['seeds']} seeds below d - 0.5 at every d_h under the paper's"
    if rule == "below":
        return (f"attention MAE at d_r = {m['features']}: {m['median']:.2g} (quartiles {m['quartiles'][0]:.2g} to "
                f"{m['quartiles'][1]:.2g}) against a low level of {m['threshold']:.2g}; random layers "
                f"{m['random_layers']:.2g}")
    if rule == "ratio":
        return f"largest tenth's median error {m['ratio']:.2g} x the rest's (threshold {m['threshold']:g})"
    if rule == "saturates":
        return (f"{m['fewest_at_or_above']} of {m['seeds']} seeds reach d - 0.5 at every d_h from the paper's; "
                f"every seed from d_h = {m['every_seed_from']}")
    low, high = m["interval"]
    apart = f", {len(m['seeds_apart'])} set apart" if m.get("seeds_apart") else ""
    text = (f"`{m['name']}`: log ratio {number(m['median_difference'], 2)} [{number(low, 2)}, {number(high, 2)}], "
            f"{m['better']} better / {m['worse']} worse" + (f" / {m['diverged']} diverged" if m["diverged"] else "")
            + f" of {m['seeds']}{apart}")
    return text if m["against"].startswith("normal") else text + f" vs `{m['against']}`"


PAIRED_RULES = ("helps", "hurts", "comparable", "no gain", "unstable", "worse-than-single", "not-worse-than-more")


def markdown_claims(results):
    """The verdicts as a Markdown table."""
    lines = ["| claim | where | task | quantity | our measurement | verdict |", "|---|---|---|---|---|---|"]
    for r in results:
        verdict = r["verdict"] if r["stable"] else f"inconclusive (end: {r['verdict_at_end']}, half: {r['verdict_at_half']})"
        lines.append(f"| {r['claim']} | {r['where']} | {r['task']} | {r.get('quantity', 'final')} | "
                     f"{measured_text(r)} | **{verdict}** |")
    return "\n".join(lines)
