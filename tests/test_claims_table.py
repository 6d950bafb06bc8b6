"""The one table of every empirical claim: its rows, its margins and seed counts against the rules
they describe, the saved file kept in step with the records, and the command line."""

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import claims_table, verdicts
from icl_lens.__main__ import main
from icl_lens.results import repository_root

DATA = repository_root() / "book" / "data"
RULES = {"helps": verdicts.helps, "hurts": verdicts.hurts, "no gain": verdicts.no_gain,
         "not worse": verdicts.not_worse, "comparable": verdicts.comparable}


def test_every_row_has_the_fields_and_a_verdict_in_the_vocabulary():
    rows = claims_table.every_claim()
    assert all(tuple(row) == claims_table.FIELDS for row in rows)
    assert {row["verdict"] for row in rows} <= set(claims_table.VOCABULARY)
    assert {row["paper"] for row in rows} == {"R&L", "Li et al."}
    assert {row["section"] for row in rows} == {"experiments", "across_tasks", "bert", "closeness_experiment"}
    assert len({row["id"] for row in rows}) == len(rows) and len(rows) >= 35
    assert sum(row["quantity"].startswith("speed") for row in rows) >= 5
    # a decisive verdict held its condition: its margin is not negative
    assert all(row["margin"] >= 0 for row in rows
               if row["verdict"] in ("agrees", "disagrees") and row["margin"] is not None)
    # an inconclusive paired comparison says how many seeds it would need; a decisive one does not
    for row in rows:
        if row["seeds_needed"] is not None:
            assert row["verdict"] == "inconclusive" and row["seeds_needed"] > row["seeds"]


def test_saved_table_is_the_table_of_the_saved_records():
    assert claims_table.saved() == json.loads(json.dumps(claims_table.every_claim()))


def test_a_stale_saved_table_is_refused_with_the_claim_named(tmp_path):
    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("*.png"))
    path = tmp_path / "data" / "claims.json"
    table = json.loads(path.read_text())
    table["claims"][1]["verdict"] = "disagrees" if table["claims"][1]["verdict"] != "disagrees" else "agrees"
    path.write_text(json.dumps(table))
    with pytest.raises(ValueError, match=table["claims"][1]["id"]):
        claims_table.saved(path)


intervals = st.tuples(st.floats(-1, 1), st.floats(0, 1)).map(lambda pair: [pair[0], pair[0] + pair[1]])


@settings(max_examples=600, deadline=None)
@given(intervals, st.floats(0.001, 0.5), st.sampled_from(sorted(RULES)), st.booleans(), st.floats(0, 1))
def test_margin_is_positive_exactly_when_the_rule_decides(interval, band, rule, lower_is_better, where):
    effect = None
    if rule in ("helps", "hurts"):    # with the median inside the interval, which must pass the band
        effect = interval[0] + where * (interval[1] - interval[0])
        verdict = RULES[rule](interval, band, lower_is_better=lower_is_better, effect=effect)
    elif rule == "comparable":
        verdict = RULES[rule](interval, band)
    else:
        verdict = RULES[rule](interval, band, lower_is_better=lower_is_better)
    found = claims_table.margin(rule, interval, band, lower_is_better=lower_is_better, verdict=verdict,
                                effect=effect)
    if verdict == "inconclusive":
        assert found <= 0
    else:
        assert found >= 0


def test_margin_on_hand_built_intervals():
    # helps on a loss: agreeing by 0.02 (the interval's upper end at -0.02)
    assert claims_table.margin("helps", [-0.1, -0.02], 0.01, verdict="agrees") == pytest.approx(0.02)
    # straddling zero, beyond the band: 0.03 short of leaving zero upwards, 0.04 downwards
    assert claims_table.margin("helps", [-0.04, 0.03], 0.01, verdict="inconclusive") == pytest.approx(-0.03)
    # inside the band: disagrees with room band - largest |end|
    assert claims_table.margin("helps", [-0.004, 0.002], 0.01, verdict="disagrees") == pytest.approx(0.006)
    # the same interval read as an accuracy (higher is better) for a no-gain claim
    assert claims_table.margin("no gain", [-0.004, 0.002], 0.01, lower_is_better=False,
                               verdict="agrees") == pytest.approx(0.008)
    with pytest.raises(ValueError, match="rule"):
        claims_table.margin("better", [0.0, 1.0], 0.1)


def test_seeds_needed_grows_with_the_spread_and_has_no_answer_on_the_threshold():
    narrow = [0.02, 0.03, 0.025, -0.01, 0.04]
    wide = [0.2 * d for d in (1, -1, 2, -2, 0.5)]
    few = claims_table.seeds_needed(narrow, 0.025, 0.01)
    assert few is not None and few > len(narrow)
    many = claims_table.seeds_needed([0.025 + w for w in wide], 0.025, 0.01)
    assert many > few
    assert claims_table.seeds_needed(narrow, 0.01, 0.01) is None   # effect exactly at the band
    # an effect inside the band: seeds to fit the interval in the band
    assert claims_table.seeds_needed([0.001, -0.002, 0.004, 0.0, 0.003], 0.001, 0.01) > 5


def test_a_verdict_outside_the_vocabulary_is_refused():
    assert claims_table.vocabulary("partly: aligned, but 1.06 x GD*'s loss") == "partly"
    assert claims_table.vocabulary("does not hold") == "disagrees"
    with pytest.raises(ValueError, match="maybe"):
        claims_table.vocabulary("maybe")


def test_claims_command_prints_the_table_and_refuses_a_missing_folder(capsys, tmp_path):
    main(["claims"])
    printed = capsys.readouterr().out
    rows = claims_table.every_claim()
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    assert len(table) == len(rows) + 1          # the header and one line a claim
    assert all(row["claim"] in printed for row in rows)
    with pytest.raises(SystemExit) as stopped:
        main(["claims", "--data", str(tmp_path / "nowhere")])
    assert stopped.value.code == 2
    assert "--data" in capsys.readouterr().err


def test_claims_rerun_judges_one_study_again_from_its_saved_record(capsys, tmp_path):
    """--rerun table1 rewrites that study's saved claims from its record (no training): a verdict
    tampered with in the copy comes back; --train without --rerun is refused."""
    shutil.copytree(DATA, tmp_path / "data", ignore=shutil.ignore_patterns("*.png"))
    claims = tmp_path / "data" / "table1" / "table1_claims.json"
    before = claims.read_text()
    tampered = json.loads(before)
    tampered["claims"][0]["verdict"] = "tampered"
    claims.write_text(json.dumps(tampered))
    main(["claims", "--data", str(tmp_path / "data"), "--rerun", "table1"])
    assert json.loads(claims.read_text()) == json.loads(before)
    assert "The best regularized setting does not beat" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["claims", "--train"])
    assert "--rerun" in capsys.readouterr().err
