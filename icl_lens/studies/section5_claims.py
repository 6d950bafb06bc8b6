"""Every empirical claim of Section 5 / Appendix E as a row (:data:`CLAIMS`), paired comparisons of
the trained models and the verdict of each claim, by the rules of :mod:`icl_lens.verdicts`.

Chapters: experiments.

Every modified model is compared with the normal model of the same seed and learning rate: they
share the task weight, the training sequences, the test set and the initial weights, so the
per-seed difference of their normalised test losses (test loss / the seed's label variance) is a
paired measurement. Over the seeds we report the median difference, a bootstrap 95% interval of
that median and the number of seeds better / worse.

Verdict rules (for a claim that a variant *helps*; a claim that it *hurts* is the mirror image):

    disagrees     the whole interval lies inside the no-effect band (a tenth of the normal model's
                  median loss either side of 0: no effect worth the name), or above 0
    agrees        otherwise, if the whole interval lies below 0 (better on the median, on every resample)
    inconclusive  otherwise

With five seeds the bootstrap interval of the median runs from about the smallest to the largest
difference, so "agrees" needs every seed better (a sign test would give p = 1/32).

A verdict that changes between half of training and the end is inconclusive (``stable``
False). Test losses are those at the end of the run, where the learning rate has decayed to 0
(:func:`icl_lens.studies.section5.reported_loss`); "half of training" is the same run at half the
epochs, with its own decay (for a constant-rate record: the last and the second quarter's means).
"""

import math
from icl_lens import context_use, verdicts
from icl_lens.approximation import log_log_slope
from icl_lens.studies.section5 import finite_or_none, normalised_loss
from icl_lens.verdicts import RESAMPLES, Claim

# a difference within a tenth of the normal model's loss is no effect: a band in units of the label
# variance would be as wide as the loss itself where the layers learn the task to ~1% of it
NO_EFFECT_SHARE = 0.1
RULES = {
    "measure": "test MSE at the end of training (the learning rate decays to 0 over the last fifth of "
               "the steps), divided by the label variance of the seed's test set; paired with the normal "
               "model of the same seed and learning rate (difference = variant - normal)",
    "interval": f"percentile bootstrap ({RESAMPLES} resamples) 95% interval of the median difference over seeds",
    "no effect": f"a difference within +-{NO_EFFECT_SHARE:g} x the median normalised loss of the model "
                 "compared against (per seed: of that seed's)",
    "helps": "disagrees if the interval lies inside the no-effect band or above 0; agrees if it lies below 0; "
             "else inconclusive",
    "hurts": "the mirror image of helps",
    "unstable": "agrees if a seed diverges or ends worse than predicting the mean (normalised loss > 1)",
    "worse-than-single": "the best combination against the best single modification, by the hurts rule",
    "best": "where a claim names several variants, the one with the lowest median difference is used, "
            "chosen again at half of training",
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


def paired(record, name, *, until=1.0, against=None):
    """Variant ``name`` against its normal partner (or, with ``against``, the model of that name) on
    every seed: normalised losses, their differences (variant - partner), the median, its bootstrap
    interval, the no-effect band and the counts of seeds better / worse by more than their own
    band / diverged."""
    rows = []
    for seed in sorted({m["seed"] for m in record["models"]}):
        model = find_model(record, name, seed)
        other = find_model(record, against, seed) if against else partner(record, model)
        rows.append((normalised_loss(record, model, until), normalised_loss(record, other, until)))
    variant = [v for v, _ in rows]
    differences = [v - o if math.isfinite(o) else math.nan for v, o in rows]
    compared = verdicts.paired_comparison(differences, [NO_EFFECT_SHARE * o for _, o in rows])
    low, high = compared["interval"]
    return {
        "name": name,
        "against": against or "normal (same seed and lr)",
        "variant": [finite_or_none(v) for v in variant],
        "partner": [finite_or_none(o) for _, o in rows],
        "difference": [finite_or_none(d) for d in differences],
        "median_variant": finite_or_none(verdicts.median(variant)),
        "median_difference": finite_or_none(compared["median"]),
        "interval": [finite_or_none(low), finite_or_none(high)],
        "no_effect": finite_or_none(NO_EFFECT_SHARE * verdicts.median(o for _, o in rows)),
        "better": compared["better"],
        "worse": compared["worse"],
        "diverged": sum(not math.isfinite(v) for v in variant),
        "seeds": len(rows),
    }


def inside_band(comparison):
    """Whether a comparison's whole interval lies inside its no-effect band."""
    return verdicts.inside_band(comparison["interval"], comparison["no_effect"])


def verdict_helps(comparison):
    return verdicts.helps(comparison["interval"], comparison["no_effect"])


def verdict_hurts(comparison):
    if None in comparison["interval"] and comparison["diverged"]:
        return "agrees"      # a diverged variant is worse, whatever the interval of the rest
    return verdicts.hurts(comparison["interval"], comparison["no_effect"])


def verdict_unstable(comparison):
    """Instability: a seed diverges or ends worse than predicting the mean (normalised loss > 1)."""
    losses = [math.inf if v is None else v for v in comparison["variant"]]
    return "agrees" if any(v > 1 for v in losses) else "disagrees"


def best_of(record, names, *, until=1.0):
    """The name among ``names`` with the lowest median paired difference at ``until`` (the paper,
    too, reports its best setting; the choice is remade at half of training)."""
    scored = [(paired(record, n, until=until)["median_difference"], n) for n in names]
    return min(scored, key=lambda pair: math.inf if pair[0] is None else pair[0])[1]


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


CLAIMS = (
    Claim("linear-alpha-negative-proportional", "Sec. 5, App. E.1, Fig. 3", "linear",
          "alpha < 0 (more weight on the query's own token) improves the layer; proportional reading",
          "helps", regularized("proportional", -1)),
    Claim("linear-alpha-negative-constant", "Sec. 5, App. E.1, Fig. 3", "linear",
          "alpha < 0 improves the layer; constant reading A - alpha I", "helps", regularized("constant", -1)),
    Claim("linear-alpha-positive-proportional", "Sec. 5, App. E.1, Fig. 3", "linear",
          "alpha > 0 makes the layer worse (even the best alpha > 0); proportional reading",
          "hurts", regularized("proportional", 1)),
    Claim("linear-alpha-positive-constant", "Sec. 5, App. E.1, Fig. 3", "linear",
          "alpha > 0 makes the layer worse; constant reading A - alpha I", "hurts", regularized("constant", 1)),
    Claim("linear-augmented", "Sec. 5, App. E.1, Fig. 3", "linear",
          "an augmentation g1 / g2 improves the layer (best of the four)", "helps",
          lambda g, m: g == "augmented"),
    Claim("linear-negative", "Sec. 5, App. E.1, Fig. 3", "linear",
          "negative samples improve the layer (best k, beta)", "helps", negative()),
    Claim("linear-negative-k3", "App. E.1", "linear",
          "the reported best setting k = 3, beta = 0.1 improves the layer", "helps", negative(3, 0.1)),
    Claim("linear-combination", "App. E, Fig. 13", "linear",
          "regularized + augmented is enough for the linear task (it improves the layer)", "helps",
          lambda g, m: g == "combination" and m["alpha"] != 0 and "gelu" in (m["value_map"], m["key_map"])
          and m["negative_k"] == 0),
    Claim("trigonometric-alpha", "Sec. 5, App. E.2.1, Fig. 11", "trigonometric",
          "a suitable alpha improves the layer (best alpha, either reading)", "helps",
          lambda g, m: g == "regularized"),
    Claim("trigonometric-g2", "App. E.2.1, Fig. 11", "trigonometric",
          "augmenting the keys with one GELU layer (g2) improves the layer", "helps", augmented("none", "gelu")),
    Claim("trigonometric-g2-plus", "App. E.2.1, Fig. 11", "trigonometric",
          "the two-layer ELU augmentation of the keys (g2+) improves the layer", "helps",
          augmented("none", "mlp-elu")),
    Claim("trigonometric-negative", "App. E.2.1, Fig. 11", "trigonometric",
          "negative samples improve the layer (best k)", "helps", negative()),
    Claim("trigonometric-combinations", "App. E, Fig. 13", "trigonometric",
          "combinations are worse than the best single modification", "worse-than-single",
          lambda g, m: g == "combination"),
    Claim("exponential-alpha-16", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 16 improves the layer (best reading that defines it)", "helps", is_alpha(16.0)),
    Claim("exponential-alpha-sixth", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 1/6 (if '16' lost a fraction bar) improves the layer (better reading)", "helps",
          is_alpha(1 / 6)),
    Claim("exponential-g1", "App. E.2.2, Fig. 12", "exponential",
          "augmenting the values alone (g1) improves the layer", "helps", augmented("gelu", "none")),
    Claim("exponential-g2", "App. E.2.2, Fig. 12", "exponential",
          "augmenting the keys alone (g2) improves the layer", "helps", augmented("none", "gelu")),
    Claim("exponential-g1-g2-unstable", "App. E.2.2", "exponential",
          "using g1 and g2 together is unstable (a seed diverges or ends worse than the mean)", "unstable",
          augmented("gelu", "gelu")),
    Claim("exponential-combinations", "App. E, Fig. 13", "exponential",
          "combinations are worse than the best single modification", "worse-than-single",
          lambda g, m: g == "combination"),
)


# the claims the temperature check judges again on layers without the d**-1/4 scale
TEMPERATURE_CLAIMS = (
    *(c for c in CLAIMS if c.id in ("linear-alpha-negative-proportional", "linear-alpha-negative-constant")),
    Claim("linear-g2", "Sec. 5, App. E.1, Fig. 3", "linear",
          "augmenting the keys with one GELU layer (g2) improves the layer", "helps", augmented("none", "gelu")),
)


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
        found.append({"id": claim.id, "claim": claim.claim, **pair, "changes": pair["with"]["verdict"] != pair["without"]["verdict"]})
    return found


def measure(claim, record, until):
    """(comparison, verdict) of one claim on one task record at ``until`` of training."""
    names = names_where(record, claim.select)
    if not names:
        raise ValueError(f"claim {claim.id}: the {claim.task} record trains none of its variants")
    if claim.rule == "worse-than-single":
        single = names_where(record, lambda g, m: g not in ("combination", "normal"))
        best_single = best_of(record, single, until=until)
        comparison = paired(record, best_of(record, names, until=until), until=until, against=best_single)
        return comparison, verdict_hurts(comparison)
    comparison = paired(record, best_of(record, names, until=until), until=until)
    rule = {"helps": verdict_helps, "hurts": verdict_hurts, "unstable": verdict_unstable}[claim.rule]
    return comparison, rule(comparison)


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
            "measurement": full, "at_half": half, "verdict_at_end": verdict_full, "verdict_at_half": verdict_half,
            "stable": stable, "verdict": verdict_full if stable else "inconclusive",
        })
    return results


def equivalence_claim(records, tolerance=1e-24):
    """Theorem 3.1 on the trained layers (Fig. 3, left): after N per-demonstration steps the dual
    prediction equals the layer's output to float64 round-off on every task and seed."""
    gaps = [(curve["squared_error"][0], curve["squared_error"][-1])
            for record in records.values() for curve in record["equivalence"].values()]
    worst = max(end / max(1.0, start) for start, end in gaps)
    return {"id": "equivalence", "where": "Sec. 5, Fig. 3 (left), Theorem 3.1", "task": "all",
            "claim": "the trained layer's output equals its dual model after N per-demonstration SGD steps",
            "rule": "exact", "measurement": {"worst_relative_squared_gap": worst, "tolerance": tolerance},
            "stable": True, "verdict": "agrees" if worst <= tolerance else "disagrees"}


def random_feature_claim(study):
    """Figs. 6-8 on trained layers: the attention error falls at every step of d_r (agrees), rises
    overall (log-log slope >= 0: disagrees), or neither. The slope is reported: on random layers it
    is about -1 (an error falling like 1/d_r)."""
    counts, errors = study["feature_counts"], study["attention_mse"]
    slope = log_log_slope(counts, errors)
    falling = all(b < a for a, b in zip(errors, errors[1:]))
    verdict = "agrees" if falling else ("disagrees" if slope >= 0 else "inconclusive")
    return {"id": "random-features", "where": "App. E, Figs. 6-8", "task": "linear (trained layers)",
            "claim": "the random-feature estimate of attention improves as d_r grows",
            "rule": "falls", "measurement": {"feature_counts": counts, "attention_mse": errors, "slope": slope,
                                             "monotone": falling},
            "stable": True, "verdict": verdict}


def rank_claim(rank):
    """Fig. 14 (right) on trained layers: the mean of min(d, #active ReLUs) reaches d (to within
    0.5) at every FFN width d_h >= the paper's 2.75 d = 33."""
    d, threshold = rank["d"], rank["paper_saturation"]
    wide = [b for h, b in zip(rank["hidden_sizes"], rank["mean_bound"]) if h >= threshold]
    saturated = [h for h, b in zip(rank["hidden_sizes"], rank["mean_bound"]) if b >= d - 0.5]
    return {"id": "rank-saturation", "where": "App. B.1, Fig. 14 (right)", "task": "linear (trained FFN layers)",
            "claim": f"the Rank(W_F) bound saturates at d = {d} once d_h >= {threshold}",
            "rule": "saturates", "measurement": {"hidden_sizes": rank["hidden_sizes"], "mean_bound": rank["mean_bound"],
                                                 "first_saturated": min(saturated) if saturated else None},
            "stable": True, "verdict": "agrees" if wide and min(wide) >= d - 0.5 else "disagrees"}


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
    return "diverged" if value is None or not math.isfinite(value) else f"{value:.{digits}g}"


def markdown_rows(rows):
    """Paired comparisons as a Markdown table (losses divided by the label variance)."""
    lines = ["| model | median loss | median diff. vs normal | 95% interval | no effect within | "
             "better / worse / diverged |", "|---|---|---|---|---|---|"]
    for r in rows:
        low, high = r["interval"]
        lines.append(f"| {r['name']} | {number(r['median_variant'])} | {number(r['median_difference'], 2)} | "
                     f"[{number(low, 2)}, {number(high, 2)}] | +-{number(r['no_effect'], 2)} | "
                     f"{r['better']} / {r['worse']} / {r['diverged']} |")
    return "\n".join(lines)


def markdown_claims(results):
    """The verdicts as a Markdown table."""
    lines = ["| claim | where | task | our measurement | verdict |", "|---|---|---|---|---|"]
    for r in results:
        m = r["measurement"]
        if r["rule"] == "exact":
            measured = f"worst squared gap {m['worst_relative_squared_gap']:.1e}"
        elif r["rule"] == "falls":
            measured = f"MSE slope {m['slope']:.2f} in log-log"
        elif r["rule"] == "saturates":
            measured = f"bound reaches d - 0.5 from d_h = {m['first_saturated']}"
        else:
            low, high = m["interval"]
            measured = (f"`{m['name']}`: diff. {number(m['median_difference'], 2)} "
                        f"[{number(low, 2)}, {number(high, 2)}], {m['better']} better / {m['worse']} worse"
                        + (f" / {m['diverged']} diverged" if m["diverged"] else ""))
            if r["rule"] == "worse-than-single":
                measured += f" vs `{m['against']}`"
        verdict = r["verdict"] if r["stable"] else f"inconclusive (end: {r['verdict_at_end']}, half: {r['verdict_at_half']})"
        lines.append(f"| {r['claim']} | {r['where']} | {r['task']} | {measured} | **{verdict}** |")
    return "\n".join(lines)
