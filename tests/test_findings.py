"""The findings at a glance (intro and claims page) say what the saved table and records say."""

import json
import math
import re
import statistics
from pathlib import Path

import pytest

from icl_lens import findings

DATA = Path(__file__).resolve().parents[1] / "book" / "data"


@pytest.fixture(scope="module")
def rows():
    return json.loads((DATA / "claims.json").read_text())["claims"]


def test_each_number_is_the_one_the_saved_files_give(rows):
    text = findings.markdown(rows, DATA)
    # the findings count the main family (the new-task protocol's rows are read in their chapter)
    main = [row for row in rows if not row["id"].endswith("-new-task")]
    verdicts = [row["verdict"] for row in main]
    assert (f"{len(main)} empirical claims" in text and f"{verdicts.count('agrees')} agree, "
            f"{verdicts.count('disagrees')} disagree, {verdicts.count('inconclusive')} are inconclusive" in text)
    # the linear normal layer's context use: the median over its seeds, read here from the raw file
    seeds = json.loads((DATA / "experiments" / "context_use.json").read_text())["tasks"]["linear"]["normal"]
    alone = statistics.median(seed["query_alone"] for seed in seeds.values())
    assert f"median loss of {alone:.3f} of the label variance" in text
    # the seeds a decision needs: the smallest and largest over the inconclusive comparisons
    needed = sorted(row["seeds_needed"] for row in rows if row["verdict"] == "inconclusive"
                    and row["p"] is not None and row["seeds_needed"] is not None)
    assert f"at {needed[0]} to {needed[-1]} " in text
    # every finding links somewhere, and is numbered
    assert [int(n) for n in re.findall(r"^(\d+)\. ", text, flags=re.M)] == list(range(1, 8))
    assert text.count("[Shown here.](") == 7
    # every random-feature measurement that misses its threshold is named, with its numbers
    for row in rows:
        if row["id"].startswith("random-features") and row["verdict"] == "disagrees":
            said = row["claim"].split(" (read:")[0]
            assert f"{said} (measured {row['effect']:.2g} against {row['band']:.2g})" in text
    # Li et al.'s loss as a ratio: exp of the saved log ratio
    loss = next(row for row in rows if row["id"] == "li-closeness-loss-n200")
    assert f"{math.exp(loss['effect']):.1f} times GD*'s" in text


def test_a_changed_verdict_changes_the_findings(rows):
    before = findings.markdown(rows, DATA)
    changed = json.loads(json.dumps(rows))
    main = [row for row in changed if not row["id"].endswith("-new-task")]   # the family the findings count
    agree = sum(row["verdict"] == "agrees" for row in main)
    flipped = next(row for row in main if row["verdict"] == "inconclusive")
    flipped["verdict"] = "agrees"
    after = findings.markdown(changed, DATA)
    assert f"{agree} agree," in before and f"{agree + 1} agree," in after


def test_the_smallness_sentence_reads_the_share():
    assert "none of the prompts" in findings.smallness_text(0)
    assert "at most 25% of the prompts" in findings.smallness_text(0.25)


def test_the_seed_counts_and_the_seeds_needed_are_read_from_the_rows():
    rows = [{"n": 20}, {"n": 5}, {"n": 20}, {"n": None}]
    assert findings.seeds_text(rows) == "5 or 20 seeds"
    assert findings.seeds_text([{"n": 20}]) == "20 seeds"
    assert findings.seeds_text([{"n": 4}, {"n": 5}, {"n": 20}]) == "4, 5 or 20 seeds"
    assert findings.needed_text([], rows).startswith("**Every comparison is decided** at 5 or 20 seeds")
    text = findings.needed_text([30, None, 12], rows)
    assert "For the 3 inconclusive comparisons (at 5 or 20 seeds)" in text
    assert "at 12 to 30 (median 21), and beyond 100 for 1 of them." in text
    assert "beyond 100 for every one of them." in findings.needed_text([None, None], rows)


def test_the_decided_comparisons_are_counted_per_task_and_firm_disagreements_named(rows):
    """Section 5's decided comparisons: counts per task from the table, and by name only the
    disagreements that survive the family correction (the table lists the rest)."""
    decided = [row for row in rows if row["p"] is not None and row["verdict"] != "inconclusive"
               and not row["id"].endswith("-new-task")]
    text = findings.decided_text(decided)
    for task in ("linear", "trigonometric", "exponential"):
        mine = [row["verdict"] for row in decided if row["task"] == task]
        assert f"{task} {mine.count('agrees')} agree / {mine.count('disagrees')} disagree" in text
    for row in decided:
        if row["task"] in findings.SECTION5_TASKS:
            named = f"{row['claim']} ({row['task']})" in text
            assert named == (row["verdict"] == "disagrees" and bool(row["survives_family"])), row["id"]
