"""Every empirical claim of both papers in one table: the verdicts each study saved beside its
record, read into one set of fields and one vocabulary (agrees, disagrees, partly, inconclusive).

Chapters: claims, intro.

A row (:class:`Row`) says where the paper makes the claim, the claim in our words, what was
measured and by which rule, the verdict, the effect with its interval and the band an effect must
leave, the margin by which the verdict's condition held (negative: by how much the nearest
decisive condition was missed), the seeds, and for an inconclusive paired comparison a rough
count of the seeds a decisive verdict would need. Nothing here judges a claim: the studies did
(:mod:`icl_lens.verdicts` holds their rules); this module only reads what they saved.
"""

import json
import math
from pathlib import Path
from typing import TypedDict

import torch

from icl_lens.results import load_result, repository_root, save_result
from icl_lens.studies import across_tasks, li_et_al, section5, section5_claims, table1
from icl_lens import verdicts
from icl_lens.verdicts import improvement_interval

VOCABULARY = ("agrees", "disagrees", "partly", "inconclusive")
FIELDS = ("id", "paper", "where", "claim", "quantity", "rule", "verdict", "effect", "unit", "interval",
          "band", "margin", "seeds", "seeds_apart", "seeds_needed", "section", "reading", "context",
          "without_temperature")
Z = 1.96   # the 95% level of the studies' intervals
RULE_FORMS = ("helps", "hurts", "no gain", "not worse", "comparable")
# Section 5's rules that compare against another model than the normal one, by the rule they apply
SECTION5_RULES = {"worse-than-single": "hurts", "not-worse-than-more": "not worse"}


class Row(TypedDict):
    id: str
    paper: str                     # "R&L" or "Li et al."
    where: str                     # section, figure or table of the paper
    claim: str                     # the claim in our words
    quantity: str                  # what is measured: "final" (end of training) or "speed"
    rule: str                      # the rule that turned the measurement into the verdict
    verdict: str                   # one of VOCABULARY
    effect: float | None           # the measured effect, in ``unit``
    unit: str
    interval: list | None          # 95% interval of the effect (paired comparisons only)
    band: float | None             # the no-effect band (or tolerance) the rule reads against
    margin: float | None           # slack of the verdict's condition (< 0: how far it was missed);
                                   # Section 5: of the verdict at the end of training
    seeds: int | None              # the seeds that decide the verdict
    seeds_apart: dict | None       # Section 5: {seed: why it cannot decide} (screen, chaos)
    seeds_needed: int | None       # inconclusive paired comparisons: seeds to settle it
    section: str                   # the chapter that shows it
    reading: str                   # the measurement in the study's own words
    context: str | None            # Section 5: how the variant differs in context use
    without_temperature: str | None   # Section 5: the verdict with q and k left unscaled


def margin(rule, interval, band, *, lower_is_better=True, verdict=None, effect=None):
    """The slack of the condition that gave ``verdict`` under ``rule`` (see
    :mod:`icl_lens.verdicts`), in the effect's units; for an inconclusive verdict, the largest
    (negative) slack among the decisive conditions: how far the nearest one was missed. With the
    median ``effect``, "agrees" under helps / hurts also needs it beyond the band."""
    if interval is None or None in interval or any(math.isinf(x) for x in interval):
        return None
    low, high = improvement_interval(interval, lower_is_better)
    spread = max(abs(low), abs(high))
    gain = None if effect is None else (-effect if lower_is_better else effect)
    if rule == "hurts":
        low, high = -high, -low
        gain = None if gain is None else -gain
    if rule in ("helps", "hurts"):
        agree = low if gain is None else min(low, gain - band)
        slack = {"agrees": [agree], "disagrees": [-high, band - spread]}
    elif rule == "no gain":
        slack = {"disagrees": [low], "agrees": [band - high]}
    elif rule == "not worse":
        slack = {"disagrees": [-high], "agrees": [low + band]}
    elif rule == "comparable":
        slack = {"agrees": [band - spread], "disagrees": [low - band, -band - high]}
    else:
        raise ValueError(f"rule must be one of helps, hurts, no gain, not worse, comparable; got {rule!r}")
    if verdict in slack:
        return max(slack[verdict])
    return max(x for found in slack.values() for x in found)


def seeds_needed(differences, effect, band):
    """Seeds an inconclusive paired comparison would need for its 95% interval to leave zero (an
    effect beyond the band) or to fit inside the band (an effect within it), from the spread of
    the per-seed ``differences``: a robust standard deviation (1.4826 x their median absolute
    deviation) and the standard error of a median, 1.2533 sigma / sqrt(n). None where the effect
    sits on that threshold or the differences do not spread."""
    kept = torch.tensor([d for d in differences if d is not None and math.isfinite(d)], dtype=torch.float64)
    if effect is None or len(kept) < 2:
        return None
    sigma = 1.4826 * float((kept - kept.median()).abs().median())
    sigma = sigma or float(kept.std())
    room = abs(effect) if abs(effect) > band else band - abs(effect)
    if room <= 0 or sigma == 0:
        return None
    return max(len(kept) + 1, math.ceil((Z * 1.2533 * sigma / room) ** 2))


def section5_rows(saved, records, context, temperature=None):
    """Rows of the Section 5 / App. E claims (``claims.json`` of ``reproduce all``), with the context
    note of each (``context_use.json``) and, where the temperature check ran, its verdict."""
    unscaled = {c["id"]: c["without"]["verdict"] for c in (temperature or {}).get("claims", [])}
    rows = []
    for claim in saved["claims"]:
        m = claim["measurement"]
        named = claim["claim"] if claim["task"] == "all" else f"{claim['task']}: {claim['claim']}"
        row = {"id": claim["id"], "paper": "R&L", "where": claim["where"], "claim": named,
               "quantity": claim.get("quantity", "final"), "rule": claim["rule"], "verdict": claim["verdict"],
               "section": "experiments", "context": None, "interval": None, "band": None, "margin": None,
               "seeds_apart": None, "seeds_needed": None, "without_temperature": unscaled.get(claim["id"])}
        if "median_difference" in m:          # a paired comparison of normalised test losses
            rule = SECTION5_RULES.get(claim["rule"], claim["rule"])
            interval = None if None in m["interval"] else m["interval"]
            unit = ("log(variant / other) of the loss at the end" if row["quantity"] == "final"
                    else "mean log(variant / other) of the loss before the decay")
            apart = {seed: entry["reason"] for seed, entry in m["seeds_apart"].items()}
            row.update(effect=m["median_difference"], unit=unit,
                       interval=interval, band=m["no_effect"], seeds=m["seeds"], seeds_apart=apart,
                       reading=f"{m['name']} against {m['against']}: better / worse / diverged "
                               f"{m['better']} / {m['worse']} / {m['diverged']} of {m['seeds']}")
            at_end = claim.get("verdict_at_end", claim["verdict"])
            task = records.get(claim["task"])
            if row["quantity"] == "final" and task is not None and not task["convergence"]["converged"]:
                row["reading"] += ("; this task's normal model has not converged (training twice as long still "
                                   "moves its loss by more than a tenth), so the final result is one at a fixed "
                                   "budget of training")
            if at_end != claim["verdict"]:
                row["reading"] += (f"; {at_end} at the end of training, {claim['verdict_at_half']} at half of "
                                   "it, so inconclusive")
            if rule in RULE_FORMS and interval is not None:
                effect = m["median_difference"] if rule in ("helps", "hurts") else None
                row["margin"] = margin(rule, interval, m["no_effect"], verdict=at_end, effect=effect)
                if at_end == "inconclusive":
                    row["seeds_needed"] = seeds_needed(m["difference"], m["median_difference"],
                                                       m["no_effect"])
            if rule == "unstable":
                losses = [math.inf if v is None else v for v in m["variant"]]
                row.update(effect=max(losses), unit="worst seed's loss / label variance", band=1.0,
                           interval=None, margin=max(losses) - 1.0 if math.isfinite(max(losses)) else None,
                           reading=f"{m['name']}: {m['diverged']} of {m['seeds']} seeds diverged")
            note = section5_claims.context_note(claim, records, context)
            row["context"] = note["reading"] if note else None
        elif claim["rule"] == "exact":
            worst, tolerance = m["worst_relative_squared_gap"], m["tolerance"]
            row.update(effect=worst, unit="relative squared gap", band=tolerance,
                       margin=tolerance - worst, seeds=m["layers"],
                       reading=f"worst relative squared gap {worst:.2g} over {m['layers']} trained layers, one "
                               f"prompt each (tolerance {tolerance:g}); the seeds column counts layers")
        elif claim["rule"] == "falls":
            row.update(effect=m["log_fall"], unit="log(attention MSE at the smallest d_r / at the largest)",
                       band=m["band"], margin=m["log_fall"] - m["band"], seeds=None,
                       reading=f"log-log slope {m['slope']:.2f}; falls at every step: {m['monotone']}")
        elif claim["rule"] == "below":
            row.update(effect=m["median"], unit=f"attention MAE of trained layers at d_r = {m['features']} (median)",
                       band=m["threshold"], interval=m["quartiles"], seeds=None,
                       margin=m["threshold"] - m["quartiles"][1] if claim["verdict"] == "agrees"
                       else m["quartiles"][0] - m["threshold"] if claim["verdict"] == "disagrees"
                       else -min(m["quartiles"][1] - m["threshold"], m["threshold"] - m["quartiles"][0]),
                       reading=f"{m['ratio_to_random']:.0f} x the random layers' attention MAE (medians) at the "
                               "same d_r")
        elif claim["rule"] == "ratio":
            row.update(effect=m["ratio"], unit="median error of the largest tenth of the weights / the rest's",
                       band=m["threshold"], seeds=None,
                       margin=m["ratio"] - m["threshold"] if claim["verdict"] == "agrees" else
                       1 - m["ratio"] if claim["verdict"] == "disagrees" else m["ratio"] - m["threshold"],
                       reading=f"one trained layer (seed 0), d_r = 1200: ratio {m['ratio']:.2f}")
        elif claim["rule"] == "low rank":
            row.update(effect=m["fewest_below"], unit="seeds whose bound stays below d - 0.5, fewest over the "
                       "widths under the paper's", band=None, seeds=m["seeds"], margin=None,
                       reading=f"seeds below d - 0.5 by width: {m['seeds_below']}")
        elif claim["rule"] == "saturates":
            row.update(effect=m["fewest_at_or_above"], unit="seeds whose bound reaches d - 0.5, fewest over "
                       "the widths from the paper's", band=None, seeds=m["seeds"],
                       margin=None,   # a count of whole seeds: the effect itself is the margin
                       reading=f"every seed saturates from d_h = {m['every_seed_from']}")
        rows.append(row)
    return rows


def table1_rows(saved, record):
    """Rows of the Table 1 claims (``table1_claims.json``): accuracy differences on the stand-in at
    the length that decides (the longer runs where only they have converged, else the study's
    epochs). Where the row's verdict is inconclusive only because the two lengths disagree or the
    longer one was not run, the margin is the shorter length's."""
    rows = []
    summary, study = record["summary"], record["study"]
    at_longer = table1.deciding_length(record) == "longer"
    for claim in saved["claims"]:
        definition = next(c for c in table1.CLAIMS if c.id == claim["id"])
        (first, _), (second, _) = (pick(record) for pick in definition.select)
        deciding = at_longer and claim["longer"] is not None
        m = claim["longer"] if deciding else claim["measured"]
        epochs = study["longer_epochs"] if deciding else None
        values, reference = table1.mean_of(record, first, epochs), table1.mean_of(record, second, epochs)
        differences = table1.compare(values, reference)["differences"]
        longer = claim["longer"]["verdict"] if claim["longer"] else "not run"
        row = {"id": claim["id"], "paper": "R&L", "where": claim["where"], "claim": claim["claim"],
               "quantity": "final", "rule": definition.rule, "verdict": claim["verdict"],
               "effect": m["median"], "unit": "accuracy, first - second", "interval": m["interval"],
               "band": table1.NO_EFFECT,
               "margin": margin(definition.rule, m["interval"], table1.NO_EFFECT, lower_is_better=False,
                                verdict=m["verdict"]),
               "seeds": len(differences), "seeds_apart": None, "seeds_needed": None, "section": "bert",
               "context": None,
               "without_temperature": None,
               "reading": f"{claim['compared']}: {claim['measured']['verdict']} after {study['epochs']} "
                          f"epochs, {longer} after {study['longer_epochs']}"}
        checks = [summary[key] for key in ("convergence", "convergence_longer") if key in summary]
        if not any(check["converged"] for check in checks):
            moves = " and ".join(f"{c['median_move']:.3f} from {c['epochs']} to {c['against_epochs']}"
                                 for c in checks if "median_move" in c)
            row["reading"] += (f"; the normal model has converged at no length (median move {moves}, against "
                               f"{table1.NO_EFFECT}), so the verdict must hold at both") if moves else ""
        if deciding:
            check = summary["convergence_longer"]
            row["reading"] += (f"; decided at {study['longer_epochs']} epochs, where the normal model has "
                               f"converged ({check['against_epochs']} epochs move it by "
                               f"{check['median_move']:.3f} in the median)")
        if m["verdict"] == "inconclusive":
            row["seeds_needed"] = seeds_needed(differences, m["median"], table1.NO_EFFECT)
        rows.append(row)
    return rows


def ratio_row(claim, summary, seeds, section, paper):
    """A row for a claim read from one trained layer's loss against one GD step's (GD*)."""
    ratio = summary["trained layer"] / summary["one GD step (lr*)"]
    return {"id": claim["id"], "paper": paper, "where": claim["where"], "claim": claim["claim"],
            "quantity": "final", "rule": "matches", "effect": ratio, "unit": "trained / GD* loss",
            "interval": None, "band": li_et_al.MATCH, "margin": li_et_al.MATCH - abs(ratio - 1),
            "seeds": seeds, "seeds_apart": None, "seeds_needed": None, "section": section, "context": None,
            "without_temperature": None, "reading": f"{claim['setting']}: {claim['measured']}"}


def li_rows(saved, record):
    """Rows of Li et al.'s claims (``closeness_claims.json``); their verdicts read into the
    vocabulary ("partly: ..." is partly, "holds" agrees, "does not hold" disagrees)."""
    seeds = len(record["study"]["seeds"])
    rows = []
    for claim in saved["claims"]:
        verdict = claim["verdict"]
        if claim["id"].startswith("li-closeness-n"):
            n = claim["id"][len("li-closeness-n"):]
            runs = record["lengths"][n]["softmax"]
            row = ratio_row(claim, li_et_al.summary(runs), seeds, "closeness_experiment", "Li et al.")
            # the loss condition as the study reads it: the seeds' interval of the log ratio
            match = li_et_al.loss_match(runs)
            row.update(effect=verdicts.median(li_et_al.log_loss_ratios(runs)), interval=match["interval"],
                       band=match["band"], unit="log(trained / GD* loss), median over seeds",
                       margin=margin("comparable", match["interval"], match["band"], verdict=match["verdict"]))
            row["rule"] = (f"loss within {li_et_al.MATCH:.0%} of GD*'s (the seeds' interval) and Model Cos >= "
                           f"{li_et_al.ALIGNED} (the seeds' interval)")
            row["claim"] += f" ({claim['setting']})"
        elif claim["id"] == "li-loss-against-d":
            ratios = [li_et_al.summary(layers["softmax"]) for layers in record["dims"].values()]
            worst = max((r["trained layer"] / r["one GD step (lr*)"] for r in ratios), key=lambda x: abs(x - 1))
            row = ratio_row(claim, {"trained layer": worst, "one GD step (lr*)": 1.0}, seeds,
                            "closeness_experiment", "Li et al.")
            row["unit"] = "trained / GD* loss, the d farthest from 1"
        elif claim["id"].startswith("li-model-cos-rises-n"):
            n = claim["id"][len("li-model-cos-rises-n"):]
            rise = li_et_al.model_cos_rise(record["lengths"][n]["softmax"])
            row = {"id": claim["id"], "paper": "Li et al.", "where": claim["where"],
                   "claim": f"{claim['claim']} ({claim['setting']})", "quantity": "over training", "rule": "helps",
                   "effect": rise["median"], "unit": "Model Cos, last checkpoint - first",
                   "interval": rise["interval"], "band": li_et_al.COSINE_BAND,
                   "margin": margin("helps", rise["interval"], li_et_al.COSINE_BAND, lower_is_better=False,
                                    verdict=vocabulary(verdict), effect=rise["median"]),
                   "seeds": seeds, "seeds_apart": None, "seeds_needed": None,
                   "section": "closeness_experiment", "context": None, "without_temperature": None,
                   "reading": claim["measured"]}
        else:
            row = {"id": claim["id"], "paper": "Li et al.", "where": claim["where"], "claim": claim["claim"],
                   "quantity": "final", "rule": "share of prompts inside the condition >= 0.5",
                   "effect": None, "unit": "", "interval": None, "band": 0.5, "margin": None,
                   "seeds": seeds, "seeds_apart": None, "seeds_needed": None, "section": "closeness_experiment",
                   "context": None,
                   "without_temperature": None, "reading": claim["measured"]}
        row["where"] = row["where"].replace("Li et al., ", "")
        row["verdict"] = vocabulary(verdict)
        if row["verdict"] == "disagrees" and row["id"] == "li-loss-against-d":   # the slack of the miss
            row["margin"] = -row["margin"]
        if row["verdict"] != verdict:
            row["reading"] += f" ({verdict})"
        rows.append(row)
    return rows


def across_rows(saved, record):
    """The across-tasks chapter's one claim of the papers (R&L Sec. 5's remark on training across
    tasks); its other rows are readings of the chapter or of von Oswald et al., not of the papers."""
    rows = []
    for claim in saved["claims"]:
        if not claim["where"].startswith("Ren & Liu"):
            continue
        sgd = across_tasks.summary(record, "paper task (paper's SGD)")
        rows.append({"id": claim["id"], "paper": "R&L", "where": claim["where"].replace("Ren & Liu, ", ""),
                     "claim": claim["claim"], "quantity": "final",
                     "rule": f"the paper's SGD leaves the loss at >= {across_tasks.NO_LEARNING} of the "
                             "label variance",
                     "verdict": vocabulary(claim["verdict"]), "effect": sgd["trained layer"],
                     "unit": "loss / label variance", "interval": None, "band": across_tasks.NO_LEARNING,
                     "margin": sgd["trained layer"] - across_tasks.NO_LEARNING, "seeds": None,
                     "seeds_apart": None, "seeds_needed": None, "section": "across_tasks", "context": None,
                     "without_temperature": None,
                     "reading": f"{claim['measured']} ({claim['verdict']})"})
    return rows


def vocabulary(verdict):
    """A study's verdict in the table's words."""
    if verdict in VOCABULARY:
        return verdict
    if verdict.startswith("inconclusive"):
        return "inconclusive"
    if verdict.startswith("partly") or verdict.startswith("agrees for"):
        return "partly"
    if verdict == "holds":
        return "agrees"
    if verdict == "does not hold" or verdict.startswith("disagrees"):
        return "disagrees"
    raise ValueError(f"verdict {verdict!r} has no word in the table's vocabulary {VOCABULARY}")


def every_claim(data=None):
    """Every row, from the saved records under ``data`` (default ``book/data``)."""
    data = Path(data) if data is not None else repository_root() / "book" / "data"
    experiments = data / "experiments"
    records = {kind: load_result(experiments, f"task_{kind}") for kind in section5.EXPERIMENTS}
    temperature = load_result(experiments, "temperature") if (experiments / "temperature.json").exists() \
        else None
    rows = section5_rows(load_result(experiments, "claims"), records,
                         load_result(experiments, "context_use"), temperature)
    rows += across_rows(load_result(data / "multitask", "multitask_claims"),
                        load_result(data / "multitask", "multitask"))
    rows += table1_rows(load_result(data / "table1", "table1_claims"), load_result(data / "table1", "table1"))
    rows += li_rows(load_result(data / "closeness", "closeness_claims"), load_result(data / "closeness", "closeness"))
    for row in rows:
        if row["verdict"] not in VOCABULARY:
            raise ValueError(f"claim {row['id']}: verdict {row['verdict']!r} is not in {VOCABULARY}")
    return [{field: row[field] for field in FIELDS} for row in rows]


def counts(rows):
    """{verdict: number of rows}, in the vocabulary's order."""
    return {verdict: sum(row["verdict"] == verdict for row in rows) for verdict in VOCABULARY}


def number(value, digits=2):
    """A cell: "–" where there is no value, a count as it is, a float as the Section 5 tables
    print it (:func:`icl_lens.studies.section5_claims.number`, "diverged" included)."""
    if value is None:
        return "–"
    return section5_claims.number(value, digits) if isinstance(value, float) else str(value)


def effect_text(row):
    text = number(row["effect"])
    if row["interval"] is not None:
        text += f" [{number(row['interval'][0])}, {number(row['interval'][1])}]"
    return text


def markdown(rows, *, links=True):
    """The table as Markdown; with ``links`` each claim links to the chapter that shows it."""
    lines = ["| claim (where in the paper) | verdict (measure) | effect [95% interval] | band | margin | "
             "deciding seeds (needed) |", "|---|---|---|---|---|---|"]
    for row in rows:
        claim = f"[{row['claim']}]({row['section']}.md)" if links else row["claim"]
        seeds = number(row["seeds"])
        if row["seeds_apart"]:
            seeds += f" + {len(row['seeds_apart'])} apart"
        if row["seeds_needed"] is not None:
            seeds += f" ({row['seeds_needed'] if row['seeds_needed'] <= 1000 else '> 1000'})"
        lines.append(f"| {claim} ({row['paper']} {row['where']}) | **{row['verdict']}** ({row['quantity']}) | "
                     f"{effect_text(row)} | {number(row['band'])} | {number(row['margin'])} | {seeds} |")
    return "\n".join(lines)


def save(rows, path=None):
    """Write ``book/data/claims.json`` (or ``path``): {"fields": ..., "claims": rows}."""
    path = Path(path) if path is not None else repository_root() / "book" / "data" / "claims.json"
    return save_result(path.parent, path.stem, {"vocabulary": list(VOCABULARY), "claims": rows})["json"]


def saved(path=None):
    """The saved table, checked against the table read again from the records: a page that shows
    it fails if the saved verdicts no longer follow from them."""
    path = Path(path) if path is not None else repository_root() / "book" / "data" / "claims.json"
    stored = json.loads(path.read_text())["claims"]
    fresh = json.loads(json.dumps(every_claim(path.parent)))
    if stored != fresh:
        changed = [a["id"] for a, b in zip(stored, fresh) if a != b] or ["the number of rows"]
        raise ValueError(f"{path} is out of date ({', '.join(changed)} differ); "
                         "rewrite it with python -m icl_lens claims --write")
    return stored
