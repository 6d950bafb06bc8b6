"""The claims about trained layers that are read against a threshold of their own rather than
compared across seeds: Theorems 3.1 and B.1 on trained layers (an identity to round-off), the
random-feature estimate on trained layers (R&L Figs. 6-9) and the rank of the FFN (Fig. 14).

Chapters: experiments, claims.
"""

import math

import torch

from icl_lens.approximation import ApproximationConfig, log_log_slope
from icl_lens.studies.section5_measures import BAND


def exact_claim(curves, tolerance=1e-24, **row):
    """An identity on trained layers: after N per-demonstration steps the dual prediction equals
    the layer's output to float64 round-off on every equivalence curve of ``curves`` (the squared
    gap at t = N, relative to the gap at t = 0 where that is above 1)."""
    worst = max(curve["squared_error"][-1] / max(1.0, curve["squared_error"][0]) for curve in curves)
    return {**row, "rule": "exact", "measurement": {"worst_relative_squared_gap": worst, "tolerance": tolerance,
                                                    "layers": len(curves)},
            "quantity": "final", "stable": True, "verdict": "agrees" if worst <= tolerance else "disagrees"}


EQUIVALENCE_WHERE = {"linear": "Sec. 5, Fig. 3 (left), Theorem 3.1", "trigonometric": "App. E.2.1, Fig. 11 (left), "
                     "Theorem 3.1", "exponential": "App. E.2.2, Fig. 12 (left), Theorem 3.1"}


def equivalence_claims(records, tolerance=1e-24):
    """Theorem 3.1 on the trained layers, one row per task as the paper says it once per figure
    (Figs. 3, 11, 12, left): after N per-demonstration steps the dual prediction equals the
    layer's output to float64 round-off on every seed."""
    return [exact_claim(list(record["equivalence"].values()), tolerance, id=f"equivalence-{task}",
                        where=EQUIVALENCE_WHERE.get(task, "Sec. 5, Theorem 3.1"), task=task,
                        claim="the trained layer's output equals its dual model after N per-demonstration SGD steps")
            for task, record in records.items()]


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


MEASURES = {"attention_mse": "attention MSE", "attention_mae": "attention MAE", "output_mse": "output MSE",
            "output_mae": "output MAE"}


def rising_steps(counts, errors):
    """The steps of d_r where the error does not fall: (d_r, next d_r, error, next error)."""
    return [(a, b, x, y) for a, b, x, y in zip(counts, counts[1:], errors, errors[1:]) if y >= x]


def random_feature_claim(study, measure="attention_mse"):
    """Figs. 6-8 on trained layers: "as the dimension of random features increases, the
    approximation performance gradually improves", for one of the four errors of the sentence
    (:data:`MEASURES`: MSE and MAE of the attention and of the output matrices). Agrees if the
    error falls at every step of d_r and by more than the band (:data:`BAND`, a tenth) from the
    smallest d_r to the largest; disagrees if it does not fall overall (log-log slope >= 0) or by
    no more than the band; inconclusive between. The slope is reported: on random layers it is
    about -1 for the MSE (an error falling like 1/d_r)."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {list(MEASURES)}, got {measure!r}")
    counts, errors = study["feature_counts"], study[measure]
    slope = log_log_slope(counts, errors)
    falling = not rising_steps(counts, errors)
    fall = math.log(errors[0] / errors[-1])
    verdict = "agrees" if falling and fall > BAND else ("disagrees" if slope >= 0 or fall <= BAND else "inconclusive")
    suffix = "" if measure == "attention_mse" else "-" + measure.replace("_", "-")
    return {"id": "random-features" + suffix, "where": "App. E.1, Figs. 6-8", "task": "linear (trained layers)",
            "claim": f"the random-feature estimate improves as d_r grows ({MEASURES[measure]})",
            "rule": "falls", "measurement": {"feature_counts": counts, "errors": errors, "measure": MEASURES[measure],
                                             "slope": slope, "monotone": falling, "log_fall": fall, "band": BAND},
            "quantity": "final", "stable": True, "verdict": verdict}


# an attention error is "low" below a tenth of the mean attention weight, 1 / (number of tokens)
LOW_LEVEL = 0.1


def low_level_claim(study, num_tokens=ApproximationConfig().num_tokens, measure="attention_mae"):
    """Fig. 8 on trained layers: "both errors reaching a low level in the end", one row per error:
    the attention MAE below :data:`LOW_LEVEL` / num_tokens (a tenth of the mean attention weight)
    and the attention MSE below its square, at the largest d_r of the study. Agrees if the upper
    quartile over repeats is below it, disagrees if the lower quartile is above, else
    inconclusive; the random layers' error at the same d_r is reported beside."""
    if measure not in ("attention_mae", "attention_mse"):
        raise ValueError(f"measure must be attention_mae or attention_mse, got {measure!r}")
    trained, random = study["trained layers (linear task)"], study["iid (random layers)"]
    position = len(trained["feature_counts"]) - 1
    threshold = (LOW_LEVEL / num_tokens) ** (2 if measure == "attention_mse" else 1)
    low, high = trained[f"{measure}_quartiles"][position]
    verdict = "agrees" if high < threshold else ("disagrees" if low > threshold else "inconclusive")
    largest = trained["feature_counts"][position]
    name = MEASURES[measure]
    return {"id": "random-features-low-level" + ("-mse" if measure == "attention_mse" else ""),
            "where": "App. E.1, Fig. 8", "task": "linear (trained layers)",
            "claim": f"the {name} reaches a low level in the end (read: below "
                     f"{'the square of ' if measure == 'attention_mse' else ''}a tenth of the mean weight at the "
                     f"largest d_r, {largest})", "rule": "below",
            "measurement": {"features": largest, "median": trained[f"{measure}_median"][position],
                            "quartiles": [low, high], "measure": name,
                            "threshold": threshold, "random_layers": random[f"{measure}_median"][position],
                            "ratio_to_random": trained[f"{measure}_median"][position]
                            / random[f"{measure}_median"][position]},
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


MAJORITY = 0.5    # "the majority": more than half of the attention weights


def majority_claim(compared, num_tokens=ApproximationConfig().num_tokens):
    """Fig. 9 on the first seed's trained layer at d_r = 1200: "the majority of the information is
    still estimated comprehensively well", read as: more than half of the attention weights have an
    absolute error below :data:`LOW_LEVEL` / num_tokens (a tenth of the mean weight). Agrees if the
    share is above :data:`MAJORITY`, disagrees otherwise. One layer, one draw of the features."""
    exact = torch.tensor(compared["attention"], dtype=torch.float64).flatten()
    error = (torch.tensor(compared["attention_estimate"], dtype=torch.float64).flatten() - exact).abs()
    threshold = LOW_LEVEL / num_tokens
    share = float((error < threshold).double().mean())
    return {"id": "random-features-majority", "where": "App. E.1, Fig. 9", "task": "linear (trained layer, seed 0)",
            "claim": "most attention weights are estimated well (error below a tenth of the mean weight)",
            "rule": "share", "measurement": {"share": share, "threshold": threshold, "majority": MAJORITY},
            "quantity": "final", "stable": True, "verdict": "agrees" if share > MAJORITY else "disagrees"}


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


def random_weights_equivalence_claim(seeds=range(20), num_tokens=16, num_features=1200, tolerance=1e-10):
    """App. E.1: the equivalence of Theorem 3.1 holds "for arbitrary weights or even random
    initialization": on ``seeds`` draws of random W_Q, W_K, W_V (entries N(0, 1/d)) and a prompt of
    the paper's linear task, the dual model's test prediction against the layer's output, relative
    error in float64. Agrees if the worst is below ``tolerance`` (the book's float64 bar)."""
    from icl_lens import attention, dual, kernels, tasks
    from icl_lens.device import generator

    errors = []
    for seed in seeds:
        g = generator(seed)
        task = tasks.RegressionTask(num_tokens=num_tokens)
        weight = tasks.sample_task_weight(task, generator=g, dtype=torch.float64)
        tokens = tasks.sample_sequences(task, 1, weight, generator=g)[0][0]
        d = task.token_dim
        W_Q, W_K, W_V = (torch.randn(d, d, generator=g, dtype=torch.float64) / d ** 0.5 for _ in range(3))
        phi = kernels.PositiveRandomFeatures(kernels.draw_omega(d, num_features, generator=g, dtype=torch.float64))
        model = dual.dual_model(tokens[:-1], tokens[-1:], W_Q, W_K, W_V, phi)
        output = attention.kernel_attention(tokens[-1:], tokens, W_Q, W_K, W_V, feature_map=phi)[0]
        errors.append(float((model.test_prediction() - output).norm() / output.norm()))
    worst = max(errors)
    return {"id": "equivalence-random-weights", "where": "App. E.1, Theorem 3.1", "task": "linear (random layers)",
            "claim": "the layer's output equals its dual model's prediction for arbitrary weights, random ones "
                     "included", "rule": "exact",
            "sentence": "the inference results of ICL and the test prediction of the dual model will still remain "
                        "consistent for an attention layer with arbitrary weights or even random initialization",
            "measurement": {"worst_relative_squared_gap": worst ** 2, "tolerance": tolerance ** 2,
                            "layers": len(errors)},
            "quantity": "final", "stable": True, "verdict": "agrees" if worst < tolerance else "disagrees"}
