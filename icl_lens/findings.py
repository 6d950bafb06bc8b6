"""What holds, at a glance: the book's headline findings as sentences, every number read from the
saved claims table and records, each linked to the page that shows it.

Chapters: intro, claims.
"""

import math
import statistics

from icl_lens import context_use
from icl_lens.claims_table import counts, in_family, not_measured, surviving
from icl_lens.results import load_result, repository_root

SECTION5_TASKS = ("linear", "trigonometric", "exponential")


def decided_text(rows):
    """The decided comparisons in a sentence: Section 5's counted per task, naming the
    disagreements that survive the correction for all claims (where our runs and the paper part
    most firmly; the table lists every row); Table 1's and Li et al.'s comparisons counted."""
    section5 = [row for row in rows if row["task"] in SECTION5_TASKS]
    parts = []
    if section5:
        by_task = {task: counts([row for row in section5 if row["task"] == task]) for task in SECTION5_TASKS}
        counted = ", ".join(f"{task} {found['agrees']} agree / {found['disagrees']} disagree"
                            for task, found in by_task.items() if sum(found.values()))
        kept = [row for row in section5 if row["verdict"] == "disagrees" and row.get("survives_family")]
        parts.append(f"Section 5: {counted}" + ("; the disagreements that survive the correction for all "
                                                "claims: " + "; ".join(f"{row['claim']} ({row['task']})"
                                                                       for row in kept) if kept else ""))
    for name, belongs in (("Table 1's stand-in", lambda r: r["id"].startswith("table1")),
                          ("Li et al.'s comparisons", lambda r: r["paper"] == "Li et al.")):
        group = [row for row in rows if belongs(row)]
        if group:
            parts.append(f"{name}: {sum(r['verdict'] == 'agrees' for r in group)} agree, "
                         f"{sum(r['verdict'] == 'disagrees' for r in group)} disagree")
    return ". ".join(parts)


def seeds_text(rows):
    """The seed counts the comparative ``rows`` are decided at, in words: "5 seeds", "5 or 20 seeds"."""
    counts = sorted({row["n"] for row in rows if row["n"] is not None})
    if not counts:
        return "no seeds"
    listed = ", ".join(str(n) for n in counts[:-1]) + (" or " if len(counts) > 1 else "") + str(counts[-1])
    return f"{listed} seeds"


def needed_text(needed, comparative, unread=0):
    """The seeds the inconclusive comparisons would need (``needed``: simulated counts, None beyond
    100), in a sentence; ``unread``: the inconclusive speed rows whose level most pairs never reach
    (no seed count decides them)."""
    known = sorted(n for n in needed if n is not None)
    apart = (f" {unread} more {'is' if unread == 1 else 'are'} not measured (most pairs tie at the speed level): "
             "no seed count helps." if unread else "")
    if not needed:
        return f"**Every comparison is decided** at {seeds_text(comparative)}.{apart}" if not unread else \
            f"**No seed count decides the rest.**{apart}"
    text = (f"**What the inconclusive rows would need.** For the {len(needed)} inconclusive comparisons (at "
            f"{seeds_text(comparative)}), simulation puts the seeds a decision needs ")
    if known:
        text += f"at {known[0]} to {known[-1]} (median {statistics.median(known):.0f})"
        if len(known) < len(needed):
            text += f", and beyond 100 for {len(needed) - len(known)} of them"
    else:
        text += "beyond 100 for every one of them"
    return text + "." + apart


def smallness_text(share):
    """Li et al.'s smallness assumption, from the share of prompts that meet it."""
    if share == 0:
        return "the theorem's smallness assumption is met on none of the prompts."
    return f"the theorem's smallness assumption is met on at most {share:.0%} of the prompts."


def findings(rows, data=None):
    """[(sentence, link)] for the judged ``rows`` of the claims table (``claims_table.saved()``
    without the rows not run) and the saved Section 5 record under ``data`` (default
    ``book/data``). A link is a book label (``#...``) or a chapter file."""
    data = repository_root() / "book" / "data" if data is None else data
    rows = in_family(rows)   # the new-task protocol's family is read on its own page
    by_id = {row["id"]: row for row in rows}
    found, kept = counts(rows), surviving(rows)
    family = sum(row["p_family"] is not None for row in rows)
    identities = [row for row in rows if row["kind"] == "exact" and row["id"] != "equivalence-random-weights"]
    comparative = [row for row in rows if row["p"] is not None]
    unread = [row for row in comparative if row["verdict"] == "inconclusive" and not_measured(row)]
    needed = [row["seeds_needed"] for row in comparative if row["verdict"] == "inconclusive" and row not in unread]
    decided = [row for row in comparative if row["verdict"] != "inconclusive"]
    # the threshold claims (no seeds to test) that disagree, Section 5's: the random-feature study
    thresholds = [row for row in rows if row["p"] is None and row["verdict"] == "disagrees"
                  and row["id"].startswith("random-features") and row["band"] is not None]
    linear = load_result(data / "experiments", "context_use")["tasks"]["linear"]
    normal = context_use.medians(linear["normal"])
    found_list = [
        (f"**The identities hold on trained layers.** Theorem 3.1 on the Section 5 layers of all three tasks "
         f"and Theorem B.1 on trained Transformer layers: the layer's output and its dual model's prediction "
         f"differ by at most {max(row['effect'] for row in identities):.1e} (relative squared gap) over "
         f"{sum(row['n'] for row in identities)} layers.", "#experiments-linear"),
        (f"**{len(rows)} empirical claims, one design.** Each is judged on the models its sentence names, a "
         f"comparison of models by exact sign tests over seeds, a measurement against its own threshold: "
         f"{found['agrees']} agree, {found['disagrees']} disagree, {found['inconclusive']} are inconclusive"
         + (f"; {kept['agrees'] + kept['disagrees']} decisive verdicts survive the correction for all claims "
            "together." if family else
            f"; at {seeds_text(comparative)} no verdict can survive the correction for all claims together, so "
            "every verdict is provisional."), "#claims-design"),
        (needed_text(needed, comparative, unread=len(unread)), "#claims-seeds"),
        (f"**The linear task's Section 5 layers answer from the query's own token.** Trained on one fixed "
         f"task per seed, the linear task's normal layer predicts from the query alone with a median loss of "
         f"{normal['query_alone']:.3f} of the label variance (with its prompt: {normal['intact']:.3f}), so "
         "the modifications are tested on fitting one map more than on learning in context.", "#context-use"),
        (f"**The comparisons the seeds decide**: {decided_text(decided)}.", "#experiments-verdicts"),
        (f"**Measurements that miss the paper's claim**: " + "; ".join(
            f"{row['claim'].split(' (read:')[0]} (measured {row['effect']:.2g} against {row['band']:.2g})"
            for row in thresholds)
         + ".", "#experiments-random-features"),
        (f"**Li et al.'s trained softmax layer** aligns with one gradient step "
         f"({by_id['li-closeness-cos-n200']['verdict']} at n = 200, Model Cos above 0.95 on every seed) "
         f"while its loss is {math.exp(by_id['li-closeness-loss-n200']['effect']):.1f} times GD*'s (one "
         f"gradient step at its best learning rate) at n = 200; "
         + smallness_text(by_id["li-smallness"]["effect"]), "closeness_experiment.md"),
    ]
    return found_list


def markdown(rows, data=None):
    """The findings as a numbered Markdown list, each ending with a link to where it is shown."""
    return "\n".join(f"{i}. {text} [Shown here.]({link})"
                     for i, (text, link) in enumerate(findings(rows, data), 1))
