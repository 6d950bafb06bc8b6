"""Every empirical claim of Section 5 / Appendix E declared as data (:data:`CLAIMS`): the
sentence, its kind, its direction, the settings it names (every one, or some one) and the quantity
it is about. :func:`evaluate` measures the per-seed paired differences on the saved task records
and :func:`icl_lens.statistics.decide_claim` decides; nothing here has rules of its own.

Chapters: experiments, claims.

Every modified model is compared with the model the sentence names (the normal model of the same
seed and learning rate unless the claim says otherwise): they share the task weight, the training
sequences, the test set and the initial weights, so the per-seed log ratio of their normalised
test losses, log(variant / other), is a paired measurement, and so is the log ratio of their
times to a level fixed in advance (a speed: :func:`icl_lens.studies.section5_measures.time_to_level`).
The area reading of a speed (the mean log loss before the decay) is a note beside its row.

Seeds: a task draw that fails the training-free screen (:func:`icl_lens.studies.section5.screen`,
decided before training) is reported apart; every other seed votes. The normal model's round-off
twin (:data:`icl_lens.studies.section5.TWIN_NUDGE`) is a measurement, not a filter: each claim
reports the noise floor it implies (the median over seeds of |twin - normal| on the claim's
measure).

Half of training: the verdict at the end is checked on the same runs trained for half the epochs
(with their own decay), with the same choice of setting; a verdict that differs is inconclusive,
and a decisive claim's p is the larger of the two.

The paper's learning rates: on the linear task the paper trains its normal model at 0.003 and the
augmented, negative and combined models at 0.005. A row judges the learning-rate-matched comparison;
where the paper's own comparison (its normal model at 0.003) differs, the row carries it as a note
(outside the counts and the family), and says "the learning rate explains the paper's result" only
where the paper's comparison agrees and the normal model at 0.005 against the normal model at 0.003
agrees by itself.
"""

import math
from dataclasses import dataclass, replace

from icl_lens import context_use, statistics
from icl_lens.studies.section5_readings import convergence, normalised_loss  # noqa: F401
# the measurements and the threshold claims live in their own modules; they are named here too, so
# that ``section5_claims.X`` reaches every piece of the Section 5 verdicts
from icl_lens.studies.section5_measures import (AREA_OF, BAND, MOST_TIES, QUANTITIES, chaotic, deciding_seeds, difference,  # noqa: F401
                                                find_model, markdown_rows, measured, noise_floor, number, paired,
                                                partner, raw_differences, seeds_apart, speed, speed_level,
                                                test_set_noise, time_to_level, twin_gap,
                                                variant_rows)
from icl_lens.studies.trained_layer_claims import (EQUIVALENCE_WHERE, LARGER, LESS_ACCURATE, LOW_LEVEL,  # noqa: F401
                                                   MAJORITY, MEASURES, equivalence_claims, exact_claim,
                                                   larger_values_claim, low_level_claim, low_rank_claim,
                                                   majority_claim, random_feature_claim,
                                                   random_weights_equivalence_claim, rank_claim, seed_counts,
                                                   transformer_equivalence_claim)

RULES = {
    "final": "test MSE at the end of training (the learning rate decays to 0 over the last fifth of "
             "the steps), divided by the label variance of the seed's test set; paired with the model the "
             "claim names, of the same seed, as the log ratio log(variant / other)",
    "speed": "time to level: the epoch at which the running minimum of the normalised test loss first "
             "reaches a level fixed in advance per task (linear 0.03, early 0.08, late 0.015; trigonometric "
             "0.9; exponential 0.1 of the label variance), interpolated between checkpoints, in the "
             "constant-rate phase; paired as log(variant / other); a run that never reaches the level is "
             "the slower of its pair, two that never do are a tie. The area under the normalised log test "
             "curve (the mean log loss before the decay) is a note beside the row",
    "no effect": f"+-log(1.1) = {BAND:.3f} on either measure: a tenth of the loss either way",
    "seeds": "a seed votes unless its task draw fails the screen, decided before training "
             "(Nadaraya-Watson must beat the context mean by 5% of the label variance); the round-off "
             "twin of each seed's normal model gives the noise floor each claim reports",
    "decision": "icl_lens.statistics: sign-test bounds and p-values, one-sided at 0.05; directional, "
                "slightly, comparable and not-beyond kinds; every setting (each agreeing at 0.05, one "
                "disagreeing at 0.05 / m) or some setting (the best of k at 0.05 / k)",
    "stability": "the verdict is computed at the end and on the same runs trained for half the epochs "
                 "(their own decay), with the same setting chosen; if they differ the claim is inconclusive",
}


def names_where(record, predicate):
    """Names of the models (one seed's worth) whose modification satisfies ``predicate``."""
    seed = record["models"][0]["seed"]
    return [m["name"] for m in record["models"] if m["seed"] == seed and m["group"] not in ("normal", "twin")
            and predicate(m["group"], m["modification"])]


def regularized(form, sign):
    return lambda g, m: g == "regularized" and m["alpha_form"] == form and m["renormalise"] and m["alpha"] * sign > 0


def is_alpha(value, form=None, renormalise=None):
    return lambda g, m: (g == "regularized" and abs(m["alpha"] - value) < 1e-9
                         and (form is None or m["alpha_form"] == form)
                         and (renormalise is None or m["renormalise"] == renormalise))


def augmented(value_map, key_map):
    return lambda g, m: g == "augmented" and (m["value_map"], m["key_map"]) == (value_map, key_map)


def negative(k=None, beta=None):
    return lambda g, m: g == "negative" and (k is None or m["negative_k"] == k) and (beta is None or m["beta"] == beta)


def combination(lambda_check=None):
    return lambda g, m: g == "combination" and (lambda_check is None or lambda_check(m))


# the pairs a claim is judged on: record -> alternatives, each a list of (variant, comparator) where
# comparator None is the normal model of the variant's seed and learning rate

def every(predicate):
    """Every setting ``predicate`` takes, each against the normal model."""
    return lambda record: [[(name, None) for name in names_where(record, predicate)]]


def some(predicate):
    """Some setting ``predicate`` takes (the best, at alpha / k), against the normal model."""
    return lambda record: [[(name, None)] for name in names_where(record, predicate)]


def against_each(predicate, comparators):
    """Every setting ``predicate`` takes, against each model of ``comparators`` (names)."""
    return lambda record: [[(name, other) for name in names_where(record, predicate)
                            for other in (comparators(record) if callable(comparators) else comparators)]]


def against_own_parts(predicate):
    """Some combination ``predicate`` takes, against each of its own parts (the models its name joins
    with ' + ', trained on their own)."""
    def pairs(record):
        known = {m["name"] for m in record["models"]}
        alternatives = []
        for name in names_where(record, predicate):
            parts = [p for p in name.split(" + ") if p in known]
            if len(parts) == len(name.split(" + ")):
                alternatives.append([(name, part) for part in parts])
        return alternatives
    return pairs


def against_own_parts_of(predicate, group):
    """Every combination ``predicate`` takes, against each of its own parts that is a model of
    ``group`` (the parts its name joins with ' + ', trained on their own)."""
    def pairs(record):
        groups = {m["name"]: m["group"] for m in record["models"]}
        return [[(name, part) for name in names_where(record, predicate) for part in name.split(" + ")
                 if groups.get(part) == group]]
    return pairs


def with_negatives_added(predicate):
    """Some combination ``predicate`` takes with negative samples added, against the combination."""
    def pairs(record):
        known = {m["name"] for m in record["models"]}
        return [[(added, name)] for name in names_where(record, predicate)
                for added in sorted(known) if added.startswith(name + " + k=")]
    return pairs


@dataclass(frozen=True)
class Claim:
    """One claim of the paper as data. ``kind`` and ``direction`` are those of
    :func:`icl_lens.statistics.decide` ("lower": the variant's loss or speed measure is lower than
    the comparator's, i.e. better or faster); ``scope`` "every" or "some" setting; ``pairs`` maps a
    task record to the alternatives to judge (see :func:`every`, :func:`some`); ``other_reading``
    the same for another reading of the sentence (alpha's constant form, or g2's "other cases" with
    g2+: a sensitivity note, outside the counts, named by ``other_label``); ``sentence``
    quotes the paper."""

    id: str
    where: str
    task: str
    claim: str
    kind: str
    direction: str
    pairs: object
    quantity: str = "final"
    scope: str = "every"
    sentence: str = ""
    other_reading: object = None
    other_label: str = "constant reading of alpha"   # what ``other_reading`` reads, as the notes name it
    note: str = ""

    def __post_init__(self):
        if self.kind not in statistics.KINDS + ("unstable",):
            raise ValueError(f"claim {self.id}: kind must be one of {statistics.KINDS + ('unstable',)}, "
                             f"got {self.kind!r}")
        if self.direction not in statistics.DIRECTIONS:
            raise ValueError(f"claim {self.id}: direction must be one of {statistics.DIRECTIONS}")
        if self.scope not in ("every", "some"):
            raise ValueError(f"claim {self.id}: scope must be 'every' or 'some', got {self.scope!r}")
        if self.quantity not in QUANTITIES:
            raise ValueError(f"claim {self.id}: quantity must be one of {list(QUANTITIES)}")


ALPHA_NEGATIVE_FASTER = ("when α < 0, the model converges faster and achieves final results comparable to the "
                         "normal model without regularization (α = 0)")
G2_SENTENCE = ("when we only use g2, that is, only provide augmentation for keys, the model actually shows "
               "slightly faster convergence than other cases")
G2_PLUS = ("although the model initially converges slightly slower due to the increased number of parameters, "
           "it eventually accelerates convergence and achieves a better solution")
TRIG_AUGMENTED = ("using g1 alone and using g1 and g2 simultaneously as data augmentations significantly degrade "
                  "the model's performance, including convergence speed and final results")
E3 = ("For linear tasks, a combination of regularized and augmented modifications is sufficient. However, for "
      "the other two tasks, the results are actually worse than using regularized or augmented modification "
      "individually")
E3_WHY = ("We think this may be due to the ineffective selection of negative samples, which is amplified when "
          "combined.")
REGULARIZED_AUGMENTED = lambda m: m["alpha"] != 0 and m["negative_k"] == 0 and "gelu" in (m["value_map"], m["key_map"])

# The primary reading of alpha is "proportional": App. D's normalised form Norm(A - alpha (A o I))
# and Eq. (12)'s (1 - alpha) X_T scale the query's own score by (1 - alpha); the "constant" reading
# (A - alpha I, after Lemma D.1) is reported beside each alpha row as a sensitivity note.
CLAIMS = (
    # Sec. 5, linear task (Fig. 3), repeated in App. E.1
    Claim("linear-alpha-positive-poorer", "Sec. 5, Fig. 3", "linear",
          "every alpha > 0 converges to a poorer final result than the normal model", "directional", "higher",
          every(regularized("proportional", 1)), other_reading=every(regularized("constant", 1)),
          sentence="when α > 0, the regularized models converges to a poorer result"),
    Claim("linear-alpha-negative-faster", "Sec. 5, Fig. 3", "linear",
          "every alpha < 0 converges faster than the normal model", "directional", "lower",
          every(regularized("proportional", -1)), "speed", other_reading=every(regularized("constant", -1)),
          sentence=ALPHA_NEGATIVE_FASTER),
    Claim("linear-alpha-negative-comparable", "Sec. 5, Fig. 3", "linear",
          "every alpha < 0 reaches a final result comparable to the normal model", "comparable", "lower",
          every(regularized("proportional", -1)), other_reading=every(regularized("constant", -1)),
          sentence=ALPHA_NEGATIVE_FASTER),
    Claim("linear-alpha-full-rank", "Sec. 5, App. D", "linear",
          "an appropriate alpha gives a full-rank attention matrix, which accelerates convergence",
          "directional", "lower", None, sentence="the appropriate α contributes to achieving a full-rank "
          "attention matrix as stated in Appendix D, preserving information and accelerating convergence"),
    Claim("linear-g2-faster", "Sec. 5, Fig. 3", "linear",
          "g2 alone converges slightly faster than each other case of its panel (normal, g1, g1 + g2)",
          "slightly", "lower", against_each(augmented("none", "gelu"),
                                           ["normal lr=0.005", "g1=gelu", "g1=gelu + g2=gelu"]), "speed",
          sentence=G2_SENTENCE,
          # the paper brings g2+ in after this sentence ("Furthermore"), but it is drawn in the panel
          other_reading=against_each(augmented("none", "gelu"), ["normal lr=0.005", "g1=gelu",
                                                                 "g1=gelu + g2=gelu", "g2=mlp-gelu"]),
          other_label="with g2+ among the other cases"),
    Claim("linear-g2-plus-slower-early", "Sec. 5, Fig. 3", "linear",
          "g2+ (a two-layer MLP on the keys) converges slightly slower at first (time to the early "
          "level)", "slightly", "higher", every(augmented("none", "mlp-gelu")), "speed, early",
          sentence=G2_PLUS),
    Claim("linear-g2-plus-faster-late", "Sec. 5, Fig. 3", "linear",
          "g2+ eventually accelerates convergence (time to the late level)", "directional", "lower",
          every(augmented("none", "mlp-gelu")), "speed, late", sentence=G2_PLUS),
    Claim("linear-g2-plus-better", "Sec. 5, Fig. 3", "linear", "g2+ achieves a better solution",
          "directional", "lower", every(augmented("none", "mlp-gelu")), sentence=G2_PLUS),
    Claim("linear-negative-k3-faster", "Sec. 5, Fig. 3", "linear",
          "negative samples with k = 3, beta = 0.1 converge slightly faster", "slightly", "lower",
          every(negative(3, 0.1)), "speed",
          sentence="the model has the potential to achieve slightly faster convergence with appropriate "
                   "settings (k = 3 and β = 0.1)"),
    Claim("linear-appropriate-better", "App. E.1, Fig. 10", "linear",
          "with appropriate settings some modification of Fig. 10 (regularized, augmented, negative) ends better "
          "than the normal model", "directional",
          "lower", some(lambda g, m: g in ("augmented", "negative") or regularized("proportional", 1)(g, m)
                        or regularized("proportional", -1)(g, m)), scope="some",
          sentence="we can achieve better performance than the normal model with appropriate parameter settings"),
    Claim("linear-combination-sufficient", "App. E.3, Fig. 13", "linear",
          "a regularized + augmented combination ends no worse than each of its own parts", "not beyond",
          "higher", against_own_parts(combination(REGULARIZED_AUGMENTED)), scope="some", sentence=E3,
          note="alpha = 0.1 alone is trained at the paper's 0.003 (its rate for regularized models), the "
               "combination at 0.005: that comparison is not learning-rate matched"),
    Claim("linear-combination-negatives-no-gain", "App. E.3, Fig. 13", "linear",
          "adding negative samples to a regularized + augmented combination brings no improvement",
          "not beyond", "lower", with_negatives_added(combination(REGULARIZED_AUGMENTED)), scope="some",
          sentence=E3),
    # App. E.2.1, trigonometric task (Fig. 11)
    Claim("trigonometric-alpha-negative-faster", "App. E.2.1, Fig. 11", "trigonometric",
          "every alpha < 0 converges slightly faster", "slightly", "lower", every(regularized("proportional", -1)),
          "speed", other_reading=every(regularized("constant", -1)),
          sentence="the models when α < 0 converge slightly faster and reach better final results"),
    Claim("trigonometric-alpha-negative-better", "App. E.2.1, Fig. 11", "trigonometric",
          "every alpha < 0 reaches a better final result", "directional", "lower",
          every(regularized("proportional", -1)), other_reading=every(regularized("constant", -1)),
          sentence="the models when α < 0 converge slightly faster and reach better final results"),
    Claim("trigonometric-g1-slower", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 alone (augmented values) degrades convergence speed", "directional", "higher",
          every(augmented("gelu", "none")), "speed", sentence=TRIG_AUGMENTED),
    Claim("trigonometric-g1-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 alone degrades the final result", "directional", "higher", every(augmented("gelu", "none")),
          sentence=TRIG_AUGMENTED),
    Claim("trigonometric-g1-g2-slower", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 and g2 together degrade convergence speed", "directional", "higher",
          every(augmented("gelu", "gelu")), "speed", sentence=TRIG_AUGMENTED),
    Claim("trigonometric-g1-g2-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "g1 and g2 together degrade the final result", "directional", "higher",
          every(augmented("gelu", "gelu")), sentence=TRIG_AUGMENTED),
    Claim("trigonometric-g2-comparable", "App. E.2.1, Fig. 11", "trigonometric",
          "g2 alone gives a final result comparable with the normal model", "comparable", "lower",
          every(augmented("none", "gelu")), sentence="using g2 alone yields comparable result with the normal model"),
    Claim("trigonometric-g2-plus-faster", "App. E.2.1, Fig. 11", "trigonometric",
          "g2+ (two-layer ELU MLP on the keys) accelerates convergence", "directional", "lower",
          every(augmented("none", "mlp-elu")), "speed",
          sentence="when using g+2, the model accelerates its convergence speed"),
    Claim("trigonometric-negative-worse", "App. E.2.1, Fig. 11", "trigonometric",
          "every negative-sample setting tried ends worse than the normal model", "directional", "higher",
          every(negative()), sentence="for negative models, the performance with the selected number of negative "
          "samples k and the parameter β is worse than the normal model"),
    Claim("trigonometric-combinations-vs-regularized", "App. E.3, Fig. 13", "trigonometric",
          "every combination ends worse than each regularized model alone (alpha = 0.1, the combinations' own, "
          "is not trained on this task: the alphas trained, proportional reading)", "directional", "higher",
          against_each(combination(), lambda record: names_where(record, lambda g, m: regularized("proportional", 1)(g, m)
                                                                   or regularized("proportional", -1)(g, m))),
          sentence=E3),
    Claim("trigonometric-combinations-vs-augmented", "App. E.3, Fig. 13", "trigonometric",
          "every combination ends worse than the augmented model it is built on (g2 alone)", "directional",
          "higher", against_own_parts_of(combination(), "augmented"), sentence=E3),
    Claim("trigonometric-negatives-amplified", "App. E.3, Fig. 13", "trigonometric",
          "adding negative samples to g2 makes it worse", "directional", "higher",
          against_each(combination(lambda m: m["negative_k"] > 0 and m["key_map"] == "gelu"), ["g2=gelu"]),
          sentence=E3_WHY),
    # App. E.2.2, exponential task (Fig. 12)
    Claim("exponential-alpha-16-faster", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 16 converges faster (some reading that defines it)", "directional", "lower",
          some(is_alpha(16.0)), "speed", scope="some",
          sentence="when α = 16, the model converges faster and achieves better result"),
    Claim("exponential-alpha-16-better", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 16 achieves a better result (some reading that defines it)", "directional", "lower",
          some(is_alpha(16.0)), scope="some",
          sentence="when α = 16, the model converges faster and achieves better result"),
    Claim("exponential-alpha-sixth-faster", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 1/6 (if '16' lost a fraction bar) converges faster", "directional", "lower",
          every(is_alpha(1 / 6, "proportional")), "speed", other_reading=every(is_alpha(1 / 6, "constant")),
          sentence="when α = 16, the model converges faster and achieves better result"),
    Claim("exponential-alpha-sixth-better", "App. E.2.2, Fig. 12", "exponential",
          "alpha = 1/6 (if '16' lost a fraction bar) achieves a better result", "directional", "lower",
          every(is_alpha(1 / 6, "proportional")), other_reading=every(is_alpha(1 / 6, "constant")),
          sentence="when α = 16, the model converges faster and achieves better result"),
    Claim("exponential-g1", "App. E.2.2, Fig. 12", "exponential", "g1 alone (augmented values) ends better",
          "directional", "lower", every(augmented("gelu", "none")),
          sentence="using g1 or g2 alone as data augmentations results in better performance"),
    Claim("exponential-g2", "App. E.2.2, Fig. 12", "exponential", "g2 alone (augmented keys) ends better",
          "directional", "lower", every(augmented("none", "gelu")),
          sentence="using g1 or g2 alone as data augmentations results in better performance"),
    Claim("exponential-g1-g2-unstable", "App. E.2.2", "exponential",
          "g1 and g2 together make training unstable (diverged or worse than the mean more often than the "
          "normal model, paired by seed)", "unstable", "higher", every(augmented("gelu", "gelu")),
          sentence="when both g1 and g2 are used simultaneously, the training process becomes unstable"),
    Claim("exponential-negative-no-gain", "App. E.2.2, Fig. 12", "exponential",
          "negative samples show no significant improvement over the normal model", "not beyond", "lower",
          every(negative()), sentence="the different combinations of negative samples' number k and parameter β "
          "do not show a significant improvement over the normal model",
          note="only k = 3, beta = 0.1 is trained on this task, not the paper's grid"),
    Claim("exponential-combinations-vs-regularized", "App. E.3, Fig. 13", "exponential",
          "every combination ends worse than each regularized model alone (alpha = 0.1, the combinations' own, "
          "is not trained on this task: the alphas trained, proportional reading)", "directional", "higher",
          against_each(combination(), lambda record: names_where(record, lambda g, m: regularized("proportional", 1)(g, m)
                                                                   or regularized("proportional", -1)(g, m))),
          sentence=E3),
    Claim("exponential-combinations-vs-augmented", "App. E.3, Fig. 13", "exponential",
          "every combination ends worse than the augmented model it is built on (g2 alone)", "directional",
          "higher", against_own_parts_of(combination(), "augmented"), sentence=E3),
    Claim("exponential-negatives-amplified", "App. E.3, Fig. 13", "exponential",
          "adding negative samples to g2 makes it worse", "directional", "higher",
          against_each(combination(lambda m: m["negative_k"] > 0 and m["key_map"] == "gelu"), ["g2=gelu"]),
          sentence=E3_WHY),
)
NOT_RUN = {"linear-alpha-full-rank": "the saved records hold no attention matrices of the trained layers, so "
                                     "their rank cannot be read without training again"}
# the claims the temperature check judges again on layers without the d**-1/4 scale
TEMPERATURE_CLAIMS = tuple(c for c in CLAIMS if c.id.startswith(("linear-alpha-negative", "linear-g2-faster")))


def temperature_check(with_scale, without_scale):
    """Each of :data:`TEMPERATURE_CLAIMS` judged on the linear task's record (``with_scale``) and on
    the same models trained without the temperature (``without_scale``), side by side, each on the
    comparisons whose models both records train (the check trains the normal, alpha < 0 and g2
    models only)."""
    both = ({m["name"] for m in with_scale["models"]} & {m["name"] for m in without_scale["models"]})

    def trained_by_both(pairs):
        def kept(record):
            alternatives = [[(a, b) for a, b in alt if a in both and (b is None or b in both)] for alt in pairs(record)]
            return [alt for alt in alternatives if alt]
        return kept

    found = []
    for claim in TEMPERATURE_CLAIMS:
        shared = replace(claim, pairs=trained_by_both(claim.pairs), other_reading=None)
        if not shared.pairs(with_scale):
            continue
        pair = {}
        for key, record in (("with", with_scale), ("without", without_scale)):
            (judged,) = evaluate({"linear": record}, (shared,))
            m = judged["measurement"]
            pair[key] = {"variant": m["name"], "against": m["against"], "median_difference": m["median_difference"],
                         "interval": [judged["decision"]["lower"], judged["decision"]["upper"]],
                         "effect": judged["decision"]["effect"], "p": judged["p"], "no_effect": m["no_effect"],
                         "better": m["better"], "worse": m["worse"], "verdict": judged["verdict"]}
        changes = pair["with"]["verdict"] != pair["without"]["verdict"]
        compared = "; ".join(f"{a} against {b}" for a, b in judged["settings"])
        found.append({"id": claim.id, "claim": claim.claim, "compared": compared, **pair, "changes": changes})
    return found


def too_tied(comparison):
    """Is a speed comparison not measured at its level: more than :data:`MOST_TIES` of its pairs
    tie there (ties vote as 0)?"""
    return bool(comparison["seed_list"]) and comparison["ties"] / len(comparison["seed_list"]) > MOST_TIES


def judge(claim, record, until, choice=None, pairs=None):
    """The decision of one claim on one task record at ``until`` of training (see
    :func:`icl_lens.statistics.decide_claim`), with the comparison of the pair that decides."""
    alternatives = (pairs or claim.pairs)(record)
    if not alternatives or not all(alternatives):
        raise ValueError(f"claim {claim.id}: the {claim.task} record trains none of its settings")
    compared = [[paired(record, name, until=until, against=other, quantity=claim.quantity) for name, other in a]
                for a in alternatives]
    if claim.kind == "unstable":
        (comparison,) = compared[0]
        normal = [partner(record, find_model(record, comparison["name"], s)) for s in comparison["seed_list"]]
        flags = [v is None or v > 1 for v in comparison["variant"]]
        normal_flags = [not math.isfinite(normalised_loss(record, m, until)) or normalised_loss(record, m, until) > 1
                        for m in normal]
        decision = statistics.unstable(flags, normal_flags)
        return ({**decision, "chosen": 0, "k": 1, "level": statistics.ALPHA, "weakest": 0}, comparison, alternatives[0],
                compared[0])
    differences = [[raw_differences(c) for c in a] for a in compared]
    # read at the end of training, as the rule was declared (the check at half keeps its verdict)
    unmeasured = [[until == 1.0 and too_tied(c) for c in a] for a in compared]
    decision = statistics.decide_claim(claim.kind, differences, BAND, direction=claim.direction, scope=claim.scope,
                                       choice=choice, unmeasured=unmeasured)
    comparison = compared[decision["chosen"]][decision["weakest"]]
    return decision, comparison, alternatives[decision["chosen"]], compared[decision["chosen"]]


def every_verdict(tasks, study, compared, rank):
    """Every Section 5 / App. E verdict, in the order ``claims.json`` keeps them: Theorem 3.1 on the
    trained and on random layers, the claims of :data:`CLAIMS` (:func:`evaluate`), the random-feature
    claims on trained layers (``study``: ``fig6-8.json``; ``compared``: ``fig9.json``) and Fig. 14's
    (``rank``: ``fig14.json``)."""
    trained = study["trained layers (linear task)"]
    return [*equivalence_claims(tasks), random_weights_equivalence_claim(), *evaluate(tasks),
            *(random_feature_claim(trained, measure) for measure in MEASURES),
            low_level_claim(study), low_level_claim(study, measure="attention_mse"),
            larger_values_claim(compared), majority_claim(compared),
            rank_claim(rank), low_rank_claim(rank), transformer_equivalence_claim(rank)]


def floor_or_none(value):
    return None if value is None or not math.isfinite(value) else value


def stored(value):
    """A number as JSON keeps it: an infinite bound (a run that diverged or never reached the level)
    as +-1e300, the stand-in the measurements use."""
    if isinstance(value, float) and math.isinf(value):
        return math.copysign(1e300, value)
    return value


def plain_decision(decision):
    """What of a decision a record keeps (the weakest comparison's numbers and the claim's p)."""
    return {key: stored(value) for key, value in decision_fields(decision).items()}


def decision_fields(decision):
    if "comparisons" not in decision:
        return {k: decision[k] for k in ("verdict", "p", "p_agree", "p_disagree", "n", "only_variant", "only_normal",
                                         "upper", "band", "smallest_agree", "smallest_disagree", "cannot_decide")}
    weakest = decision["comparisons"][decision["weakest"]]
    return {"verdict": decision["verdict"], "p": decision["p"], "p_agree": decision["p_agree"],
            "p_disagree": decision["p_disagree"], "k": decision["k"], "level": decision["level"],
            "n": weakest["n"], "effect": weakest["effect"], "lower": weakest["lower"], "upper": weakest["upper"],
            "coverage": weakest["coverage"], "comparisons": len(decision["comparisons"]),
            "smallest_agree": decision["smallest_agree"], "smallest_disagree": decision["smallest_disagree"],
            "cannot_decide": decision["cannot_decide"]}


def evaluate(records, claims=CLAIMS):
    """Every claim whose task is in ``records`` (and that has runs): the decision at the end of
    training and at half of it with the same choice of setting; a verdict that differs between the
    two is inconclusive and the claim's p is the larger of the two."""
    results = []
    for claim in claims:
        if claim.task not in records or claim.pairs is None:
            continue
        record = records[claim.task]
        full, comparison, chosen_pairs, chosen_comparisons = judge(claim, record, 1.0)
        half, half_comparison, _, _ = judge(claim, record, 0.5, choice=full.get("chosen"))
        # a divergence cannot be undone by training longer: instability seen at the end stands
        stable = full["verdict"] == half["verdict"] or (claim.kind == "unstable" and full["verdict"] == "agrees")
        verdict = full["verdict"] if stable else "inconclusive"
        # a comparison most seeds cannot order at its level is not measured there (judge): it
        # keeps the claim from agreeing, and says why where no measured comparison disagrees
        unmeasured = None
        if any(too_tied(c) for c in chosen_comparisons):
            worst = max(chosen_comparisons, key=lambda c: c["ties"])
            against = "" if worst["against"].startswith("normal") else f" against {worst['against']}"
            unmeasured = (f"not measured at this level: {worst['ties']} of {len(worst['seed_list'])} pairs tie there "
                          f"({worst['name']}{against})")
        checked = half is not None and half["verdict"] == full["verdict"]
        p = max(full["p"], half["p"]) if checked else full["p"]
        other = None
        if claim.other_reading is not None:
            decision, other_comparison, _, _ = judge(claim, record, 1.0, pairs=claim.other_reading)
            other = {"decision": plain_decision(decision), "name": other_comparison["name"],
                     "median_difference": other_comparison["median_difference"], "label": claim.other_label}
        results.append({
            "id": claim.id, "where": claim.where, "task": claim.task, "claim": claim.claim, "kind": claim.kind,
            "direction": claim.direction, "scope": claim.scope, "quantity": claim.quantity,
            "sentence": claim.sentence, "rule": claim.kind,
            "settings": [[name, other_name or "normal"] for name, other_name in chosen_pairs],
            "differences": [c["difference"] for c in chosen_comparisons], "note": claim.note,
            "measurement": comparison, "at_half": half_comparison,
            "decision": plain_decision(full), "decision_at_half": plain_decision(half) if half else None,
            "verdict_at_end": full["verdict"], "verdict_at_half": half["verdict"] if half else "not applicable",
            "stable": stable, "verdict": verdict, "p": p, "not_measured": unmeasured,
            "noise_floor": floor_or_none(noise_floor(record, 1.0, claim.quantity)),
            "other_reading": other,
            "area": area_note(claim, record, full),
            "paper_learning_rate": paper_learning_rate_note(claim, record, full),
        })
    return results


def area_note(claim, record, full):
    """A speed row's area reading (the mean log loss before the decay), judged by the same rule on
    the same setting: a note beside the time to level, outside the counts."""
    if claim.quantity not in AREA_OF:
        return None
    area = replace(claim, quantity=AREA_OF[claim.quantity])
    decision, comparison, _, _ = judge(area, record, 1.0, choice=full.get("chosen"))
    return {"quantity": area.quantity, "verdict": decision["verdict"], "p": decision["p"],
            "median_difference": comparison["median_difference"], "name": comparison["name"]}


PAPER_NORMAL, MATCHED_NORMAL = "normal", "normal lr={:g}"


def paper_pairs(pairs, record):
    """``pairs`` with the learning-rate-matched normal model replaced by the paper's (its first
    normal model, at the paper's rate for normal models)."""
    matched = MATCHED_NORMAL.format(record["config"]["lr_other"])

    def swapped(record):
        return [[(name, PAPER_NORMAL if other in (None, matched) else other) for name, other in alternative]
                for alternative in pairs(record)]
    return swapped


def paper_learning_rate_note(claim, record, full):
    """Where the paper's own comparison differs from the matched one (the linear task's models at
    0.005 against its normal model at 0.003): that comparison's verdict, and whether the normal model
    at 0.005 against the one at 0.003 is itself decisive in the claim's direction (then "the
    learning rate explains the paper's result", unless the matched comparison agrees as well).
    None where the two comparisons are the same."""
    if claim.kind == "unstable" or claim.pairs is None or "lr_other" not in record.get("config", {}):
        return None
    matched = MATCHED_NORMAL.format(record["config"]["lr_other"])
    seed, lr_normal = record["models"][0]["seed"], record["config"]["lr_normal"]
    uses_matched = any(other == matched or (other is None and find_model(record, name, seed)["lr"] != lr_normal)
                       for alternative in claim.pairs(record) for name, other in alternative)
    if not uses_matched or matched not in {m["name"] for m in record["models"]}:
        return None
    swapped = paper_pairs(claim.pairs, record)
    paper, paper_comparison, _, _ = judge(claim, record, 1.0, pairs=swapped)
    rate_only = replace(claim, kind="directional", scope="every", pairs=lambda r: [[(matched, PAPER_NORMAL)]])
    rate, rate_comparison, _, _ = judge(rate_only, record, 1.0)
    # the rate explains the paper's result only where the matched comparison does not find it too
    matched_agrees = full is not None and full["verdict"] == "agrees"
    explains = rate["verdict"] == "agrees" and paper["verdict"] == "agrees" and not matched_agrees
    lr_other = record["config"]["lr_other"]
    if explains:
        said = (f"; the learning rate explains the paper's result: the normal model at {lr_other:g} against the "
                f"one at {lr_normal:g} already agrees")
    elif rate["verdict"] == "agrees" and paper["verdict"] == "agrees":
        said = (f"; the normal model at {lr_other:g} against the one at {lr_normal:g} alone agrees too, so the "
                f"paper's comparison adds the learning rate to an effect the matched one also finds")
    elif rate["verdict"] != "inconclusive":
        said = f"; the normal model at {lr_other:g} against the one at {lr_normal:g} alone {rate['verdict']}"
    else:
        said = ""
    return {"verdict": paper["verdict"], "p": paper["p"], "name": paper_comparison["name"],
            "median_difference": paper_comparison["median_difference"],
            "rate_verdict": rate["verdict"], "rate_p": rate["p"],
            "rate_median_difference": rate_comparison["median_difference"], "explains": explains,
            "sentence": f"against the paper's normal model at {lr_normal:g} the claim "
                        f"{'is inconclusive' if paper['verdict'] == 'inconclusive' else paper['verdict']}{said}"}


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
            "reading": "; ".join(readings) or "about the same context use"}


def measured_text(result):
    """What was measured for one claim, in a line (the verdict table's "our measurement")."""
    m, rule = result["measurement"], result["rule"]
    if rule == "exact":
        return f"worst squared gap {m['worst_relative_squared_gap']:.1e} over {m['layers']} trained layers"
    if rule == "falls":
        return (f"{m.get('measure', 'attention MSE')} slope {m['slope']:.2f} in log-log, log(first / last) "
                f"{m['log_fall']:.2f} against a band of {m['band']:.3f}")
    if rule == "low rank":
        return f"{m['fewest_below']} of {m['seeds']} seeds below d - 0.5 at every d_h under the paper's"
    if rule == "below":
        return (f"{m.get('measure', 'attention MAE')} at d_r = {m['features']}: {m['median']:.2g} (quartiles {m['quartiles'][0]:.2g} to "
                f"{m['quartiles'][1]:.2g}) against a low level of {m['threshold']:.2g}; random layers "
                f"{m['random_layers']:.2g}")
    if rule == "ratio":
        return f"largest tenth's median error {m['ratio']:.2g} x the rest's (threshold {m['threshold']:g})"
    if rule == "share":
        return f"{m['share']:.0%} of the weights within {m['threshold']:.2g} of the exact value"
    if rule == "saturates":
        return (f"{m['fewest_at_or_above']} of {m['seeds']} seeds reach d - 0.5 at every d_h from the paper's; "
                f"every seed from d_h = {m['every_seed_from']}")
    d = result["decision"]
    p = result.get("p", d["p"])   # the row's p: the larger of the end's and the half-run's where both decide
    # the counts below are the end's; say so where the row's p is the half-run's
    source = "" if p == d["p"] else f", at half of training; {d['p']:.2g} at the end"
    if rule == "unstable":
        return (f"`{m['name']}`: at the end of training unstable on {d['only_variant']} seeds where the normal "
                f"model is not, the reverse on {d['only_normal']}, of {d['n']} (p = {p:.2g}{source})")
    bounds = ("no bound at this n" if d["lower"] is None else
              f"[{number(d['lower'], 2)}, {number(d['upper'], 2)}]")
    against = "normal" if m["against"].startswith("normal") else f"`{m['against']}`"
    # the sign test's own counts (any margin); which way a positive difference points depends on the kind
    signs = statistics.in_direction(m["difference"], result.get("direction", "lower"))
    up, down = sum(x > 0 for x in signs), sum(x < 0 for x in signs)
    tied = f", {len(signs) - up - down} tied" if len(signs) > up + down else ""
    side, counts = SIGN_READING.get(rule, SIGN_READING["directional"])
    return (f"`{m['name']}` against {against}: effect {number(d['effect'], 2)} {bounds} {side}, "
            f"p = {p:.2g}{source}; " + counts.format(up=up, down=down) + f" of {d['n']}{tied}")


# how a positive effect (read in the claim's direction) reads, and the sign counts, per kind of claim;
# a comparable claim reads "lower" (a lower loss or time is better), as the table's "better beyond
# the band" does
SIGN_READING = {"directional": ("in the paper's direction", "{up} on the paper's side / {down} against"),
                "comparable": ("(positive: the variant better)", "{up} better / {down} worse"),
                "not beyond": ("(positive: toward what the claim rules out)", "{up} toward it / {down} away")}


PAIRED_RULES = statistics.KINDS + ("unstable",)


def markdown_claims(results):
    """The verdicts as a Markdown table."""
    lines = ["| claim | where | task | quantity | our measurement | verdict |", "|---|---|---|---|---|---|"]
    for r in results:
        verdict = r["verdict"] if r["stable"] else f"inconclusive (end: {r['verdict_at_end']}, half: {r['verdict_at_half']})"
        lines.append(f"| {r['claim']} | {r['where']} | {r['task']} | {r.get('quantity', 'final')} | "
                     f"{measured_text(r)} | **{verdict}** |")
    return "\n".join(lines)
