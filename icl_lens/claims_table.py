"""Every empirical claim of both papers in one table: the decisions each study saved beside its
record (all made by :mod:`icl_lens.statistics`), read into one set of fields, with the family
correction across every row and, for each inconclusive row, the seeds it would need.

Chapters: claims, intro.

A row (:class:`Row`) says where the paper makes the claim and quotes it, the claim in our words,
its kind (directional, slightly, comparable, not beyond, or a threshold of its own) and whether it
is about every setting it names or some one; the verdict; the effect in the paper's direction
(positive: as the paper says) with its one-sided 95% sign-test bounds and their achieved
coverage; n; the p-value of the test that decided it (or came nearest); the Benjamini-Yekutieli
adjusted p over the family of all rows that can pass (:func:`icl_lens.statistics.family_adjusted`);
for an inconclusive row why, and the seeds a decision would need by simulation (a lower bound).
Nothing here judges a claim: the studies did; this module only collects and corrects.
"""

import json
import math
from pathlib import Path
from typing import TypedDict

from icl_lens import statistics
from icl_lens.results import load_result, repository_root, save_result
from icl_lens.studies import (across_tasks, li_et_al, modifications_across_tasks, section5, section5_claims, table1,
                              trained_layer_claims)

VOCABULARY = statistics.VERDICTS
FIELDS = ("id", "paper", "where", "claim", "sentence", "task", "quantity", "kind", "scope", "compared", "verdict",
          "effect", "lower", "upper", "coverage", "unit", "band", "n", "p", "p_family", "survives_family",
          "cannot_decide", "why", "seeds_needed", "seeds_apart", "noise_floor", "at_budget", "other_reading",
          "area_reading", "paper_learning_rate", "section", "reading", "context", "without_temperature")
KIND_TEXT = {"directional": "directional: L > 0 and effect >= band agrees, U < band disagrees",
             "slightly": "slightly: L > 0 agrees, U <= 0 disagrees",
             "comparable": "comparable: -band < L and U < band agrees (two one-sided tests), L > band or U < -band "
                           "disagrees (each at 0.025)",
             "not beyond": "not beyond the band: U < band agrees, L > 0 and effect >= band disagrees",
             "unstable": "unstable: exact McNemar test agrees; share of seeds unstable only with the variant "
                         "below 0.1 (exact upper bound) disagrees"}
SECTIONS = {"linear": "experiments", "trigonometric": "experiments", "exponential": "experiments"}


class Row(TypedDict):
    id: str
    paper: str                     # "R&L" or "Li et al."
    where: str                     # section, figure or table of the paper (and its version for Li et al.)
    claim: str                     # the claim in our words
    sentence: str                  # the paper's sentence, quoted ("" where the claim reads a figure)
    task: str
    quantity: str                  # "final", "speed", "speed, early", "speed, late", "over training"
    kind: str                      # a kind of :mod:`icl_lens.statistics`, "unstable", or a threshold's name
    scope: str | None              # "every" or "some" setting (comparative rows)
    compared: str | None           # the models that decide the row
    verdict: str                   # one of VOCABULARY
    effect: float | None           # in the paper's direction (positive: as the paper says), in ``unit``
    lower: float | None            # one-sided 95% sign-test bounds of the effect (None below 5 seeds)
    upper: float | None
    coverage: float | None         # achieved coverage of each bound at n (>= 0.95)
    unit: str
    band: float | None             # the no-effect band (or the threshold) the rule reads against
    n: int | None                  # the seeds (or layers) that decide
    p: float | None                # the p-value of the test that decided the row (or came nearest)
    p_family: float | None         # Benjamini-Yekutieli adjusted p (None: outside the family)
    survives_family: bool | None   # a decisive row whose adjusted p is <= 0.05
    cannot_decide: bool            # the smallest p attainable at n (and the Bonferroni factor) exceeds 0.05
    why: str | None                # for an inconclusive row: why
    seeds_needed: int | None       # inconclusive comparative rows: simulated seeds (lower bound; None: > 100)
    seeds_apart: dict | None       # Section 5: {seed: why it cannot vote}, decided before training
    noise_floor: float | None      # Section 5: median |twin - normal| on the claim's measure
    at_budget: str | None          # a final result on a task whose normal model has not converged
    other_reading: str | None      # Section 5: another reading's verdict (alpha constant; g2 with g2+), a note
    area_reading: str | None       # Section 5 speed rows: the area reading's verdict (a note, outside the counts)
    paper_learning_rate: str | None   # linear rows: the paper's own comparison (its normal at 0.003), a note
    section: str                   # the chapter (and anchor) that shows it
    reading: str                   # the measurement in the study's own words
    context: str | None            # Section 5: how the variant differs in context use
    without_temperature: str | None   # Section 5: the verdict with q and k left unscaled, and its seeds


def blank(**row):
    """A row with every field, None where ``row`` does not say."""
    found = {field: None for field in FIELDS}
    found.update(cannot_decide=False, sentence="", quantity="final")
    found.update(row)
    return found


def why_inconclusive(decision, end, half, lengths=("the end", "half of training"), kind=None, band=None):
    """Why a row is inconclusive, in a line."""
    if end != half and half not in (None, "not applicable") and end != "inconclusive":
        return f"{end} at {lengths[0]}, {half} at {lengths[1]}"
    k = decision.get("k") or 1
    if decision.get("cannot_decide"):
        return (f"cannot decide at n = {decision['n']}" + (f" with {k} settings to choose from" if k > 1 else "")
                + f": neither test can reach 0.05 (agreeing at best p = {decision['smallest_agree']:.2g}, "
                f"disagreeing {decision['smallest_disagree']:.2g})")
    if decision.get("smallest_agree", 0) > statistics.ALPHA:
        return (f"agreeing cannot reach 0.05 at n = {decision['n']}" + (f" with {k} settings to choose from"
                                                                        if k > 1 else "")
                + f" (at best p = {decision['smallest_agree']:.2g}), and the data do not disagree")
    low, high = decision.get("lower"), decision.get("upper")
    if low is None:
        return f"no one-sided bound at n = {decision['n']}"
    if band is not None and kind == "directional" and low > 0 and decision["effect"] < band:
        return (f"every bound on the paper's side (L = {low:.3g}), but the median effect {decision['effect']:.3g} "
                f"is within the band {band:.3g}")
    if kind == "comparable" and (low > band or high < -band):
        side = "better" if low > band else "worse"
        return (f"{side} beyond the band (bounds [{low:.3g}, {high:.3g}]); disagreeing needs p <= 0.025 (six seeds "
                "or more)")
    return f"the bounds [{low:.3g}, {high:.3g}] reach both sides of a threshold"


def section5_rows(saved, records, context, temperature=None):
    """Rows of the Section 5 / App. E claims (``claims.json`` of ``reproduce all``), with the context
    note of each (``context_use.json``) and, where the temperature check ran, its verdict."""
    # the check is a study of its own seeds: its verdict says how many, beside a row read at others
    checked = len((temperature or {}).get("record", {}).get("config", {}).get("seeds", ()))
    unscaled = {c["id"]: f"{c['without']['verdict']} (at its {checked} seeds)"
                for c in (temperature or {}).get("claims", [])}
    rows = []
    for claim in saved["claims"]:
        row = blank(id=claim["id"], paper="R&L", where=claim["where"], claim=claim["claim"],
                    sentence=claim.get("sentence", ""), task=claim["task"], quantity=claim.get("quantity", "final"),
                    kind=claim["rule"], verdict=claim["verdict"], section="experiments",
                    without_temperature=unscaled.get(claim["id"]))
        if "decision" in claim:           # a comparative claim, decided by icl_lens.statistics
            row.update(comparative_section5(claim, records))
            note = section5_claims.context_note(claim, records, context)
            row["context"] = note["reading"] if note else None
        else:
            row.update(threshold_row(claim))
        rows.append(row)
    return rows


TINY = 0.1   # an effect under this share of the band is read "barely differs"


def comparative_section5(claim, records):
    """The fields of a Section 5 comparative row."""
    m, d, record = claim["measurement"], claim["decision"], records[claim["task"]]
    speed = claim["quantity"].startswith("speed")
    unit = ("log(other / variant) of the time to level" if speed and claim["direction"] == "lower" else
            "log(variant / other) of the time to level" if speed else
            "log(other / variant) of the final loss" if claim["direction"] == "lower" else
            "log(variant / other) of the final loss")
    compared = "; ".join(f"{a} against {b}" for a, b in claim["settings"])
    sides = (d["p_agree"], d["p_disagree"], d["smallest_agree"], d["smallest_disagree"])
    found = {"_sides": sides, "scope": claim["scope"], "compared": compared, "unit": unit, "band": section5_claims.BAND,
             "n": d["n"], "p": claim["p"], "cannot_decide": bool(d["cannot_decide"]),
             "effect": d.get("effect"), "lower": d.get("lower"), "upper": d.get("upper"),
             "coverage": d.get("coverage"), "noise_floor": claim.get("noise_floor"),
             "seeds_apart": {seed: entry["reason"] for seed, entry in m["seeds_apart"].items()} or None,
             "section": f"experiments-{claim['task']}" if claim["task"] in SECTIONS else "experiments"}
    if claim["rule"] == "unstable":
        found.update(effect=d["only_variant"] - d["only_normal"], unit="seeds unstable only with the variant "
                     "minus only with the normal model", band=d["band"], lower=None, upper=None, coverage=None)
        found["reading"] = section5_claims.measured_text(claim)
    else:
        # a speed's infinite value is a run that never reached the level (diverged or not)
        unfinished = "never reached the level" if claim["quantity"].startswith("speed") else "diverged"
        found["reading"] = (f"{section5_claims.measured_text(claim)}; {m['better']} better / {m['worse']} worse "
                            f"by more than the band, {m['diverged']} {unfinished}")
    if claim["kind"] == "slightly" and claim["verdict"] == "agrees" and 2 * m["diverged"] > d["n"]:
        # the rule reads the direction; "slightly" has no upper bound in it, so say when it fails plainly
        found["reading"] += (f"; the direction holds, not \"slightly\": {m['diverged']} of {d['n']} of its runs "
                             f"never reach the level")
    if (claim["kind"], claim["verdict"]) in (("directional", "disagrees"), ("not beyond", "agrees")) \
            and d.get("lower") is not None and d["lower"] > 0:
        found["reading"] += "; the effect is real (L > 0) but smaller than the band"
    if claim["kind"] == "comparable" and claim["verdict"] == "disagrees":
        found["reading"] += "; " + ("better" if d["effect"] > 0 else "worse") + " beyond the band, not comparable"
    if claim["kind"] == "not beyond" and claim["verdict"] == "agrees" and d.get("upper") is not None \
            and d["upper"] < 0:
        found["reading"] += "; the change goes the other way (U < 0)"
    effect = d.get("effect")
    if claim["verdict"] == "disagrees" and effect is not None and abs(effect) < TINY * section5_claims.BAND:
        # a disagreement of this size is "no change", not an opposite effect
        found["reading"] += "; the variant barely differs from its partner (|effect| under a tenth of the band)"
    if claim.get("note"):
        found["reading"] += f"; note: {claim['note']}"
    if claim["verdict"] == "inconclusive":
        found["why"] = claim.get("not_measured") or why_inconclusive(
            d, claim["verdict_at_end"], claim["verdict_at_half"], kind=claim["kind"], band=section5_claims.BAND)
        if claim["rule"] == "unstable" and claim["verdict_at_end"] == claim["verdict_at_half"]:
            found["why"] = (f"{d['only_variant']} seeds unstable only with the variant, {d['only_normal']} only "
                            f"with the normal model, of {d['n']}: McNemar p = {d['p_agree']:.2g}; the exact upper "
                            f"bound of the share, {d['upper']:.2f}, is not below {d['band']}")
        # a level most pairs never reach is not read by more seeds: no count is simulated for it
        found["seeds_needed"] = None if claim.get("not_measured") else simulated_seeds(claim, record)
    converged = section5.convergence(record)   # by the current criterion, whatever the record saved
    if claim["quantity"] == "final" and not converged["converged"]:
        normal = [section5.normalised_loss(record, model) for model in record["models"]
                  if model["group"] == "normal" and model["lr"] == record["config"]["lr_normal"]]
        level = (math.exp(section5_claims.BAND) - 1) * statistics.median(normal)
        found["at_budget"] = (f"at this budget: on the {claim['task']} task neither convergence criterion holds "
                              f"(relative: {converged['relative']}, absolute: {converged['absolute']}; training "
                              f"twice as long moves the normal model's loss by {converged['median_move']:.2f} in "
                              f"log, median); the band is {level:.2g} of the label variance there")
    area = claim.get("area")
    if area:
        found["area_reading"] = (f"area under the log test curve ({area['name']}): {area['verdict']}, median "
                                 f"difference {number(area['median_difference'])}, p = {area['p']:.2g}")
    paper = claim.get("paper_learning_rate")
    if paper:
        found["paper_learning_rate"] = paper["sentence"] + f" (p = {paper['p']:.2g})"
    other = claim.get("other_reading")
    if other:
        found["other_reading"] = (f"{other['label']} ({other['name']}): {other['decision']['verdict']}, "
                                  f"p = {other['decision']['p']:.2g}")
    return found


def not_measured(row):
    """Is ``row`` inconclusive because most pairs tie at its speed level (no seed count helps)?"""
    return (row.get("why") or "").startswith("not measured")


def simulated_seeds(claim, record):
    """The simulated seeds an inconclusive Section 5 row would need (see
    :func:`icl_lens.statistics.seeds_needed`), from the comparison that decides it."""
    d, m = claim["decision"], claim["measurement"]
    if claim["rule"] == "unstable":
        normal = [section5_claims.partner(record, section5_claims.find_model(record, m["name"], s))
                  for s in m["seed_list"]]
        flags = [v is None or v > 1 for v in m["variant"]]
        normal_flags = [section5.normalised_loss(record, x) > 1 for x in normal]
        return statistics.seeds_needed_unstable(flags, normal_flags)
    # every comparison of the chosen setting must decide: the largest of their estimates
    needed = [statistics.seeds_needed(claim["kind"], section5_claims.raw_differences({"difference": differences}),
                                      section5_claims.BAND, direction=claim["direction"], choices=d.get("k") or 1,
                                      comparisons=len(claim["differences"]))
              for differences in claim["differences"]]
    return None if None in needed else max(needed)


THRESHOLD_UNITS = {"exact": "relative squared gap", "falls": "log(error at the smallest d_r / at the largest)",
                   "below": "attention MAE of trained layers at the largest d_r (median)",
                   "ratio": "median error of the largest tenth of the weights / the rest's",
                   "share": "share of attention weights estimated within a tenth of the mean weight",
                   "low rank": "seeds whose bound stays below d - 0.5, fewest over the widths under the paper's",
                   "saturates": "seeds whose bound reaches d - 0.5, fewest over the widths from the paper's"}


def threshold_row(claim):
    """The fields of a Section 5 row read against a threshold of its own (no seeds to test)."""
    m, rule = claim["measurement"], claim["rule"]
    unit = THRESHOLD_UNITS[rule]
    if rule == "below":   # the claim names its error measure (MAE or MSE)
        unit = unit.replace("attention MAE", m["measure"])
    found = {"unit": unit, "reading": section5_claims.measured_text(claim),
             "section": "experiments-random-features" if claim["id"].startswith("random-features") else
             "experiments-rank" if claim["id"].startswith("rank") else
             "theorem_3_1" if claim["id"] == "equivalence-random-weights" else "experiments"}
    if rule == "exact":
        found.update(effect=m["worst_relative_squared_gap"], band=m["tolerance"], n=m["layers"])
    elif rule == "falls":
        found.update(effect=m["log_fall"], band=m["band"])
    elif rule == "below":
        found.update(effect=m["median"], band=m["threshold"])
    elif rule == "ratio":
        found.update(effect=m["ratio"], band=m["threshold"])
    elif rule == "share":
        found.update(effect=m["share"], band=m["majority"])
    elif rule in ("low rank", "saturates"):
        found.update(effect=m["fewest_below" if rule == "low rank" else "fewest_at_or_above"], n=m["seeds"])
    if claim["verdict"] == "inconclusive":
        found["why"] = "between the rule's two thresholds"
        if rule == "falls" and not m["monotone"]:
            rises = trained_layer_claims.rising_steps(m["feature_counts"], m["errors"])
            found["why"] = ("it falls by more than the band overall but not at every step: " + "; ".join(
                f"{x:.3g} at d_r = {a} to {y:.3g} at {b}" for a, b, x, y in rises))
    return found


def table1_rows(saved, record):
    """Rows of the Table 1 claims (``table1_claims.json``), decided on the WordNet entailment
    stand-in with MiniLM (not BERT on RTE), accuracy differences with a band of one point."""
    study = record["study"]
    rows = []
    for claim in saved["claims"]:
        m, other = claim["measured"], claim["other_length"]
        sign = 1 if claim["direction"] == "higher" else -1
        row = blank(id=claim["id"], paper="R&L", where=claim["where"], claim=claim["claim"],
                    sentence=claim.get("sentence", ""), task="entailment stand-in (MiniLM)", kind=claim["kind"],
                    scope=claim["scope"], compared=claim["compared"], verdict=claim["verdict"], effect=m["effect"],
                    lower=m["lower"], upper=m["upper"], coverage=m["coverage"], n=m["n"], p=claim["p"],
                    cannot_decide=bool(m["cannot_decide"]), band=table1.NO_EFFECT, section="bert",
                    _sides=(m["p_agree"], m["p_disagree"], m["smallest_agree"], m["smallest_disagree"]),
                    unit="accuracy, " + ("first - second" if sign > 0 else "second - first"),
                    reading=f"{claim['compared']}: {m['verdict']} after {claim['epochs']} epochs, "
                            f"{other['verdict'] if other else 'not run'} after "
                            f"{other['epochs'] if other else study['longer_epochs']}")
        if claim["verdict"] == "inconclusive":
            row["why"] = why_inconclusive(m, m["verdict"], other["verdict"] if other else None,
                                          (f"{claim['epochs']} epochs", f"{other['epochs'] if other else '-'} epochs"),
                                          kind=claim["kind"], band=table1.NO_EFFECT)
            row["seeds_needed"] = statistics.seeds_needed(claim["kind"], m["differences"], table1.NO_EFFECT,
                                                          direction=claim["direction"], choices=m.get("k", 1),
                                                          comparisons=m["comparisons"])
        rows.append(row)
    for key, (sentence, reason) in table1.NOT_RUN.items():
        rows.append(not_run_row(key, "App. E.5, text after Table 1", sentence, reason, "bert"))
    return rows


def not_run_row(id, where, sentence, reason, section, paper="R&L"):
    """A claim the runs cannot test, listed apart (outside the counts and the family)."""
    return blank(id=id, paper=paper, where=where, claim=sentence, sentence=sentence, verdict="not run",
                 kind="not run", why=reason, section=section, reading=reason, unit="")


LI_UNITS = {"comparable": "log(trained / GD* loss), median over seeds", "slightly": "Model Cos - 0.95, median",
            "directional": "Model Cos, last checkpoint - first, median"}


def li_rows(saved, record):
    """Rows of Li et al.'s claims (``closeness_claims.json``): the experiments of the NeurIPS 2024
    version, decided by :mod:`icl_lens.statistics`, and the arXiv v1 theorem's assumption."""
    rows = []
    for claim in saved["claims"]:
        verdict = {"holds": "agrees", "does not hold": "disagrees"}.get(claim["verdict"], claim["verdict"])
        row = blank(id=claim["id"], paper="Li et al.", where=claim["where"].replace("Li et al., ", ""),
                    claim=f"{claim['claim']} ({claim['setting']})", task=claim["setting"], verdict=verdict,
                    section="closeness_experiment", reading=claim["measured"])
        d = claim.get("decision")
        if d is not None:
            band = {"comparable": math.log(1 + li_et_al.MATCH)}.get(claim["kind"], li_et_al.COSINE_BAND)
            row.update(_sides=(d["p_agree"], d["p_disagree"], d["smallest_agree"], d["smallest_disagree"]),
                       kind=claim["kind"], scope="every", effect=d["effect"], lower=d["lower"], upper=d["upper"],
                       coverage=d["coverage"], n=d["n"], p=d["p"], cannot_decide=bool(d["cannot_decide"]),
                       band=band, unit=LI_UNITS[claim["kind"]],
                       quantity="over training" if claim["kind"] == "directional" else "final")
            row["reading"] += ("; the 5% and 0.95 thresholds are ours: the paper reports the similarity without "
                               "a threshold")
            if verdict == "inconclusive":
                row["why"] = why_inconclusive(d, verdict, None, kind=claim["kind"], band=band)
                row["seeds_needed"] = statistics.seeds_needed(claim["kind"], d["values"], band, direction="higher")
        elif claim["id"] == "li-loss-against-d":
            ratios = [li_et_al.summary(layers["softmax"]) for layers in record["dims"].values()]
            worst = max((r["trained layer"] / r["one GD step (lr*)"] for r in ratios), key=lambda x: abs(x - 1))
            row.update(kind="within", effect=worst, band=li_et_al.MATCH, unit="trained / GD* loss, the d farthest "
                       "from 1", n=len(record["study"]["seeds"]))
        else:
            share = max(r["theorem"][side]["small"] for layers in record["lengths"].values()
                        for r in layers["softmax"] for side in ("x", "A"))
            row.update(kind="share", band=0.5, effect=share, unit="largest share of test prompts inside the "
                       "condition", n=len(record["study"]["seeds"]))
        rows.append(row)
    return rows


def across_rows(saved, record):
    """The paper's remark on training across tasks (R&L App. E.1), as two rows: with the paper's
    SGD the single layer does not learn (its loss stays at >= NO_LEARNING of the label variance);
    and no single attention layer learns the task (read against the same layer trained with Adam
    on batches of prompts)."""
    rows = []
    for claim in saved["claims"]:
        if not claim["where"].startswith("Ren & Liu"):
            continue
        sgd = across_tasks.summary(record, "paper task (paper's SGD)")["trained layer"]
        adam = across_tasks.summary(record, "paper task (random-features)")["trained layer"]
        where = claim["where"].replace("Ren & Liu, ", "")
        sentence = ("we find it challenging for a single attention layer to effectively learn the multi-task "
                    "scenario, resulting in disordered predictions")
        rows.append(blank(id="across-disordered-paper-sgd", paper="R&L", where=where, sentence=sentence,
                          claim="with a new task weight per prompt, the single layer trained with the paper's SGD "
                                "(lr 0.003, one prompt a step) does not learn", task="linear, new task per prompt",
                          kind="threshold", verdict="agrees" if sgd >= across_tasks.NO_LEARNING else "disagrees",
                          effect=sgd, band=across_tasks.NO_LEARNING, unit="loss / label variance",
                          section="across_tasks", reading=claim["measured"]))
        rows.append(blank(id="across-disordered-any-optimiser", paper="R&L", where=where, sentence=sentence,
                          claim="with a new task weight per prompt, a single attention layer cannot learn the task "
                                "(read: with any optimiser; here Adam on batches of 256 prompts)",
                          task="linear, new task per prompt", kind="threshold",
                          verdict="agrees" if adam >= across_tasks.NO_LEARNING else "disagrees",
                          effect=adam, band=across_tasks.NO_LEARNING, unit="loss / label variance",
                          section="across_tasks", reading=claim["measured"]))
    return rows


def new_task_rows(data):
    """The linear claims judged again with a new task per prompt
    (:mod:`icl_lens.studies.modifications_across_tasks`), from the study's saved verdicts, checked
    against its record; none where the study has not been saved."""
    folder = Path(data) / "modifications_across_tasks"
    if not (folder / "modifications_across_tasks.json").exists():
        return []
    saved = load_result(folder, "modifications_across_tasks_claims")["claims"]
    record = load_result(folder, "modifications_across_tasks")
    check_saved(saved, modifications_across_tasks.claims(record), folder / "modifications_across_tasks_claims.json",
                f"python -m icl_lens reproduce modifications-across-tasks --reuse --out {folder}")
    rows = []
    for claim in saved:
        row = blank(id=claim["id"], paper="R&L", where=claim["where"], claim=f"{claim['claim']} (new task per prompt)",
                    sentence=claim.get("sentence", ""), task=claim["task"], quantity=claim.get("quantity", "final"),
                    kind=claim["rule"], verdict=claim["verdict"])
        row.update(comparative_section5(claim, {claim["task"]: record["record"]}))
        row["section"] = "modifications_across_tasks"
        rows.append(row)
    return rows


def family(rows, alpha=statistics.ALPHA):
    """Benjamini-Yekutieli over both tests (agreeing, disagreeing) of every comparative row, with
    Tarone's exclusion of the tests that cannot pass (:func:`icl_lens.statistics.family_adjusted`);
    a row's p_family is the adjusted p of the test that decided it (an inconclusive row: the
    smaller of its two), and a decisive row survives where that is <= alpha. Sets the fields in
    place."""
    tests, owners = [], []
    for index, row in enumerate(rows):
        if row.get("_sides") is None or row["p"] is None:
            continue
        p_agree, p_disagree, smallest_agree, smallest_disagree = row["_sides"]
        if row["verdict"] == "agrees":
            p_agree = row["p"]
        elif row["verdict"] == "disagrees":
            p_disagree = row["p"]
        tests += [(p_agree, smallest_agree), (p_disagree, smallest_disagree)]
        owners += [(index, "agrees"), (index, "disagrees")]
    adjusted = statistics.family_adjusted([p for p, _ in tests], [s for _, s in tests], alpha)
    by_row = {}
    for (index, side), value in zip(owners, adjusted):
        by_row.setdefault(index, {})[side] = value
    for index, row in enumerate(rows):
        sides = by_row.get(index, {})
        if row["verdict"] in sides:
            row["p_family"] = sides[row["verdict"]]
        else:
            found = [v for v in sides.values() if v is not None]
            row["p_family"] = min(found) if found else None
        row["survives_family"] = (None if row["p_family"] is None or row["verdict"] == "inconclusive"
                                  else bool(row["p_family"] <= alpha))
    return rows


def check_saved(saved, recomputed, path, command):
    """Every saved verdict must be what its record gives now: a claim whose saved entry differs from
    the one recomputed from the record is an error naming the file, the claim, what differs and the
    command that rewrites it (the table never prints a verdict its record does not support). An
    exact identity's measurement is round-off, which moves with the machine's arithmetic (thread
    count, vector width): there only the verdict and the tolerance must match."""
    fresh = {claim["id"]: claim for claim in json.loads(json.dumps(recomputed))}
    for claim in saved:
        again = fresh.get(claim["id"])
        if again is None:
            raise ValueError(f"{path}: claim {claim['id']} is not one its record gives; rewrite it with {command}")
        if claim.get("rule") == "exact":
            compared = {"verdict": (claim["verdict"], again["verdict"]),
                        "tolerance": ((claim.get("measurement") or {}).get("tolerance"),
                                      (again.get("measurement") or {}).get("tolerance"))}
        else:
            compared = {field: (claim.get(field), again.get(field))
                        for field in ("verdict", "decision", "measured", "measurement")}
        differing = [field for field, (old, new) in compared.items() if old != new]
        if differing:
            raise ValueError(f"{path}: claim {claim['id']} says {claim['verdict']!r} but its record gives "
                             f"{again['verdict']!r} (differing: {', '.join(differing)}); rewrite it with {command}")


def every_claim(data=None):
    """Every row, from the saved records under ``data`` (default ``book/data``), each study's saved
    verdicts first checked against its record (:func:`check_saved`)."""
    data = Path(data) if data is not None else repository_root() / "book" / "data"
    experiments = data / "experiments"
    records = {kind: load_result(experiments, f"task_{kind}") for kind in section5.EXPERIMENTS}
    temperature = load_result(experiments, "temperature") if (experiments / "temperature.json").exists() \
        else None
    saved5 = load_result(experiments, "claims")
    again = section5_claims.every_verdict(records, load_result(experiments, "fig6-8"), load_result(experiments, "fig9"),
                                          load_result(experiments, "fig14"))
    check_saved(saved5["claims"], again, experiments / "claims.json",
                f"python -m icl_lens reproduce claims --reuse --out {experiments}")
    for folder, name, module in ((data / "table1", "table1", table1), (data / "closeness", "closeness", li_et_al)):
        check_saved(load_result(folder, f"{name}_claims")["claims"], module.claims(load_result(folder, name)),
                    folder / f"{name}_claims.json", f"python -m icl_lens claims --data {data} --rerun "
                    f"{'table1' if name == 'table1' else 'softmax-regression'}")
    rows = section5_rows(saved5, records, load_result(experiments, "context_use"), temperature)
    for key, reason in section5_claims.NOT_RUN.items():
        claim = next(c for c in section5_claims.CLAIMS if c.id == key)
        rows.append(not_run_row(key, claim.where, claim.sentence, reason, "experiments"))
    rows += across_rows(load_result(data / "multitask", "multitask_claims"),
                        load_result(data / "multitask", "multitask"))
    rows += table1_rows(load_result(data / "table1", "table1_claims"), load_result(data / "table1", "table1"))
    rows += li_rows(load_result(data / "closeness", "closeness_claims"), load_result(data / "closeness", "closeness"))
    for row in rows:
        if row["verdict"] not in VOCABULARY + ("not run",):
            raise ValueError(f"claim {row['id']}: verdict {row['verdict']!r} is not in {VOCABULARY}")
    judged = family([row for row in rows if row["verdict"] != "not run"])
    # the new-task protocol's rows are a family of their own, declared before that study ran
    judged += family(new_task_rows(data))
    return [{field: row[field] for field in FIELDS} for row in judged + [r for r in rows if r["verdict"] == "not run"]]


def in_family(rows, new_task=False):
    """The rows of the main family, or (``new_task``) those of the new-task protocol's family: each
    counted and corrected on its own, since the second judges the first's linear claims again."""
    return [row for row in rows if (row["task"] == modifications_across_tasks.FAMILY) == new_task]


def counts(rows, new_task=False):
    """{verdict: number of rows} of one family (:func:`in_family`), in the vocabulary's order ("not
    run" rows are not counted)."""
    return {verdict: sum(row["verdict"] == verdict for row in in_family(rows, new_task)) for verdict in VOCABULARY}


def surviving(rows, new_task=False):
    """{verdict: decisive rows of one family whose family-adjusted p is <= 0.05}."""
    return {verdict: sum(row["verdict"] == verdict and bool(row["survives_family"]) for row in in_family(rows, new_task))
            for verdict in VOCABULARY[:2]}


def summary_line(rows):
    """One line: the counts, how many decisive rows survive the family correction, the rows not run;
    and the new-task family's counts where it has rows."""
    found, kept = counts(rows), surviving(rows)
    not_run = sum(row["verdict"] == "not run" for row in rows)
    family = sum(row["p_family"] is not None for row in in_family(rows))
    corrected = (f"surviving Benjamini-Yekutieli at 5% over the family: agrees {kept['agrees']}, disagrees "
                 f"{kept['disagrees']}" if family else "none can survive Benjamini-Yekutieli over the family at "
                 "these seeds (no test can reach its largest threshold)")
    line = (f"{sum(found.values())} claims: agrees {found['agrees']}, disagrees {found['disagrees']}, inconclusive "
            f"{found['inconclusive']}; {corrected}; {not_run} not run (listed apart)")
    again, again_kept = counts(rows, new_task=True), surviving(rows, new_task=True)
    if sum(again.values()):
        line += (f". Again with a new task per prompt (a family of its own): {sum(again.values())} linear claims, "
                 f"agrees {again['agrees']}, disagrees {again['disagrees']}, inconclusive {again['inconclusive']}; "
                 f"surviving its correction: agrees {again_kept['agrees']}, disagrees {again_kept['disagrees']}")
    return line


def number(value, digits=2):
    """A cell: "–" where there is no value, a count as it is, a float to ``digits`` significant
    digits."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "–"
    if not math.isfinite(value) or abs(value) >= 1e300:   # a diverged loss, or a level never reached
        return "∞" if value > 0 else "−∞"
    return f"{value:.{digits}g}"


def effect_text(row):
    text = number(row["effect"])
    if row["lower"] is not None:
        text += f" [{number(row['lower'])}, {number(row['upper'])}]"
    return text


GROUPS = (
    ("R&L Sec. 5 and App. E.1-E.3: the linear task", lambda r: r["task"] == "linear" or r["id"] == "linear-alpha-full-rank"),
    ("R&L App. E.2.1: the trigonometric task", lambda r: r["task"] == "trigonometric"),
    ("R&L App. E.2.2: the exponential task", lambda r: r["task"] == "exponential"),
    ("R&L App. E.1 and E.4: random weights, random features and the FFN layer",
     lambda r: r["id"].startswith(("random-features", "rank-", "transformer-", "equivalence-random"))),
    ("R&L Sec. 5 and App. E.1-E.3 again: the linear task with a new task per prompt (a family of its own)",
     lambda r: r["task"] == modifications_across_tasks.FAMILY),
    ("R&L App. E.1: training across tasks", lambda r: r["id"].startswith("across-")),
    ("R&L App. E.5: Table 1, on the WordNet entailment stand-in with MiniLM", lambda r: r["id"].startswith("table1")),
    ("Li et al.", lambda r: r["paper"] == "Li et al."),
)
# groups whose rows the claims page folds into a dropdown (name: the chapter that reads them)
FOLDED = {GROUPS[4][0]: "modifications_across_tasks"}
UNITS = {
    "R&L Sec. 5 and App. E.1-E.3: the linear task": "log ratios of the losses (a final result) or of the times to a "
    "level (a speed), in the paper's direction: +0.1 is about a tenth better (or faster, or worse, as "
    "the claim says)",
    "R&L App. E.2.1: the trigonometric task": "as for the linear task",
    "R&L Sec. 5 and App. E.1-E.3 again: the linear task with a new task per prompt (a family of its own)":
    "as for the linear task",
    "R&L App. E.2.2: the exponential task": "as for the linear task",
    "R&L App. E.5: Table 1, on the WordNet entailment stand-in with MiniLM": "validation accuracy, in the "
    "paper's direction",
}


def group_of(row):
    return next(name for name, belongs in GROUPS if belongs(row))


# where each row's measurement is shown: a section label of the book, or a whole chapter
ANCHORS = {"experiments": "#experiments-verdicts", "experiments-linear": "#experiments-linear",
           "experiments-trigonometric": "#experiments-trigonometric",
           "experiments-exponential": "#experiments-exponential",
           "experiments-random-features": "#experiments-random-features", "experiments-rank": "#experiments-rank"}


def link(section):
    """The link target of a row's ``section``: its label in the book where the section has one,
    else the chapter of that name."""
    return ANCHORS.get(section, f"{section}.md")


def markdown(rows, *, links=True):
    """The table as Markdown: with ``links`` grouped under a heading per paper, section and task,
    each claim linked to the section that shows it; without, one table with each row's id (the
    command line)."""
    header = ["| claim (where in the paper) | verdict | effect [one-sided 95% bounds]; band | n; p (family) | "
              "why inconclusive; seeds needed |", "|---|---|---|---|---|"]

    def line(row):
        said = row["claim"].replace("|", "\\|")   # a |alpha| in a claim would end its cell
        claim = f"[{said}]({link(row['section'])})" if links else f"`{row['id']}` {said}"
        p = "–" if row["p"] is None else f"{row['p']:.2g}"
        if row["p_family"] is not None:
            p += f" ({row['p_family']:.2g})"
        why = row["why"] or ""
        if row["verdict"] == "inconclusive" and row["p"] is not None and not_measured(row):
            why += "; no seed count helps"
        elif row["verdict"] == "inconclusive" and row["p"] is not None:
            needed = row["seeds_needed"]
            why += f"; needs >= {needed} seeds" if needed is not None else "; under 80% power even at 100 seeds"
        band = "" if row["band"] is None else f"; band {number(row['band'])}"
        if links and group_of(row) not in UNITS and row.get("unit"):   # a group of mixed units: each row says its own
            band += f" ({row['unit']})"
        flags = "".join(f" *{flag}*" for flag in (("at this budget",) if row["at_budget"] else ()))
        return (f"| {claim} ({row['paper']} {row['where']}) | **{row['verdict']}**{flags} | {effect_text(row)}{band} | "
                f"{number(row['n'])}; {p} | {why.strip('; ')} |")

    if not links:
        return "\n".join(header + [line(row) for row in rows])
    parts = []
    for name, _ in GROUPS:
        members = [row for row in rows if group_of(row) == name]
        if not members:
            continue
        unit = f" Effects: {UNITS[name]}." if name in UNITS else ""
        table = "\n".join(header + [line(r) for r in members])
        if name in FOLDED:
            # a family of its own, read side by side with the fixed-task rows in its chapter: its
            # counts show, its rows fold (the page stays short enough to take in)
            found = ", ".join(f"{number} {verdict}" for verdict, number in counts(members, new_task=True).items()
                              if number)
            parts.append(f"### {name}\n\n{len(members)} claims: {found}; side by side with the fixed-task "
                         f"verdicts in {{doc}}`{FOLDED[name]}`.{unit}\n\n:::{{admonition}} Its {len(members)} "
                         f"rows\n:class: dropdown\n\n{table}\n:::")
        else:
            parts.append(f"### {name}\n\n{len(members)} claims.{unit}\n\n{table}")
    return "\n\n".join(parts)


def save(rows, path=None):
    """Write ``book/data/claims.json`` (or ``path``): {"vocabulary": ..., "claims": the judged rows,
    "not_run": the claims listed apart}."""
    path = Path(path) if path is not None else repository_root() / "book" / "data" / "claims.json"
    table = {"vocabulary": list(VOCABULARY), "claims": [row for row in rows if row["verdict"] != "not run"],
             "not_run": [row for row in rows if row["verdict"] == "not run"]}
    return save_result(path.parent, path.stem, table)["json"]


def saved(path=None):
    """The saved table (judged rows, then the rows not run), checked against the table read again
    from the records: a page that shows it fails if the saved verdicts no longer follow from them."""
    path = Path(path) if path is not None else repository_root() / "book" / "data" / "claims.json"
    table = json.loads(path.read_text())
    stored = table["claims"] + table.get("not_run", [])
    fresh = json.loads(json.dumps(every_claim(path.parent)))
    if stored != fresh:
        changed = [a["id"] for a, b in zip(stored, fresh) if a != b] or ["the number of rows"]
        raise ValueError(f"{path} is out of date ({', '.join(changed)} differ); "
                         "rewrite it with python -m icl_lens claims --write")
    return stored


# a select above the claims page's tables that shows the rows of one verdict only: plain JavaScript
# in the static page, no server (the verdict is the text of each row's second cell)
VERDICT_FILTER = """<style>
/* a table of some 70 rows: a size smaller than the prose keeps the page a read, not a scroll */
section#the-claims table { font-size: 0.9em; }
</style>
<label style="font-size: 0.9em">Show the claims that
<select id="verdict-filter">
<option value="">have any verdict</option><option value="agrees">agree</option>
<option value="disagrees">disagree</option><option value="inconclusive">are inconclusive</option>
</select></label>
<script>
document.getElementById('verdict-filter').addEventListener('change', function (event) {
  var wanted = event.target.value;
  document.querySelectorAll('section#the-claims table tbody tr').forEach(function (row) {
    var verdict = row.cells.length > 1 ? row.cells[1].textContent.trim().split(' ')[0] : '';
    row.style.display = (!wanted || verdict === wanted) ? '' : 'none';
  });
});
</script>"""
