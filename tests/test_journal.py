"""The journal of finished jobs (icl_lens.training.journal): a Section 5 run grown by seeds, or
continued after an interruption, trains only what is missing and gives the record a fresh run
gives, byte for byte; a journal of another configuration is refused before any work."""

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from icl_lens.results import RecordError
from icl_lens.studies import section5
from icl_lens.training.ensemble import Modification
from icl_lens.training.journal import Journal

VARIANTS = [section5.Variant("normal", Modification(), 0.005),
            section5.Variant("alpha=0.1", Modification(alpha=0.1), 0.005)]


def small_config(seeds):
    return replace(section5.linear_experiment().quick(), epochs=2, checkpoints=2, seeds=seeds,
                   tokens_per_epoch=1024, quick_tokens_per_epoch=1024, test_sequences=8, final_test_sequences=8)


def run(config, journal, keep):
    records, _ = section5.run_experiments([config], progress=False, workers=2, variants=[VARIANTS],
                                          journal=journal, keep=keep)
    return json.dumps(records[0], sort_keys=True)


def job_files(folder):
    return {path.name: path.stat().st_mtime_ns for path in (folder / "linear").glob("*.json.gz")}


def test_growing_by_a_seed_trains_only_that_seed_and_gives_a_fresh_runs_record(tmp_path):
    first = run(small_config((0, 1)), tmp_path / "journal", keep=False)
    before = job_files(tmp_path / "journal")
    assert len(before) == 4 and {name.split("-")[0] for name in before} == {"seed0", "seed1"}
    grown = run(small_config((0, 1, 2)), tmp_path / "journal", keep=True)
    after = job_files(tmp_path / "journal")
    # the two saved seeds' jobs were read back, not written again; seed 2's two jobs are new
    assert {name: after[name] for name in before} == before
    assert sorted(set(after) - set(before)) and all(name.startswith("seed2-") for name in set(after) - set(before))
    fresh = run(small_config((0, 1, 2)), tmp_path / "other", keep=False)
    assert grown == fresh
    # and the grown record holds the first record's models of seeds 0 and 1 unchanged
    old = [m for m in json.loads(first)["models"]]
    assert [m for m in json.loads(grown)["models"] if m["seed"] in (0, 1)] == old


def test_a_lost_job_is_trained_again_and_only_it(tmp_path):
    whole = run(small_config((0, 1)), tmp_path / "journal", keep=False)
    files = sorted((tmp_path / "journal" / "linear").glob("*.json.gz"))
    lost = files[1]
    lost.unlink()    # the job in flight when a run was killed
    kept = {path.name: path.stat().st_mtime_ns for path in files if path != lost}
    assert run(small_config((0, 1)), tmp_path / "journal", keep=True) == whole
    assert lost.exists()
    assert {name: job_files(tmp_path / "journal")[name] for name in kept} == kept


def test_a_new_run_without_keep_starts_a_new_journal(tmp_path):
    run(small_config((0,)), tmp_path / "journal", keep=False)
    stamps = job_files(tmp_path / "journal")
    time.sleep(0.01)
    run(small_config((0,)), tmp_path / "journal", keep=False)
    again = job_files(tmp_path / "journal")
    assert again.keys() == stamps.keys() and all(again[name] != stamps[name] for name in stamps)


def test_a_journal_of_another_configuration_is_refused_before_any_work(tmp_path):
    Journal(tmp_path, {"config": {"epochs": 2, "test_sequences": 8}}, keep=False)
    with pytest.raises(ValueError, match=r"another configuration \(config.epochs: 2 -> 4\)"):
        Journal(tmp_path, {"config": {"epochs": 4, "test_sequences": 8}}, keep=True)
    # without keep the old journal is replaced, not refused
    Journal(tmp_path, {"config": {"epochs": 4, "test_sequences": 8}}, keep=False)
    assert json.loads((tmp_path / "configuration.json").read_text())["config"]["epochs"] == 4


def test_a_damaged_job_file_names_itself(tmp_path):
    journal = Journal(tmp_path, {"a": 1}, keep=False)
    journal.save((3,), {"b": 2}, {"loss": [float("nan"), 1.5]})
    found = journal.finished((3,), {"b": 2})
    assert found["loss"][1] == 1.5 and found["loss"][0] != found["loss"][0]   # nan survives
    assert journal.finished((3,), {"b": 3}) is None
    journal.path((3,), {"b": 2}).write_bytes(gzip.compress(b"{not json"))
    with pytest.raises(RecordError, match=r"seed3-.*cannot be read back"):
        journal.finished((3,), {"b": 2})


def test_a_killed_command_line_run_continues_with_grow(tmp_path):
    """``reproduce fig3 --quick --workers 2`` killed once its first job is saved, then run again with
    --grow: the record is the one an uninterrupted run writes."""
    command = [sys.executable, "-m", "icl_lens", "reproduce", "fig3", "--quick", "--workers", "2", "--no-compile",
               "--seeds", "0"]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    killed = subprocess.Popen(command + ["--out", str(tmp_path / "a")], env=environment,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    folder = tmp_path / "a" / "journal" / "linear"
    deadline = time.monotonic() + 300
    while not list(folder.glob("*.json.gz")) and time.monotonic() < deadline and killed.poll() is None:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait()
    saved = sorted(path.name for path in folder.glob("*.json.gz"))
    assert len(saved) == 1 and not (tmp_path / "a" / "task_linear.json").exists()
    subprocess.run(command + ["--out", str(tmp_path / "a"), "--grow"], check=True, capture_output=True)
    subprocess.run(command + ["--out", str(tmp_path / "b")], check=True, capture_output=True)
    assert (tmp_path / "a" / "task_linear.json").read_bytes() == (tmp_path / "b" / "task_linear.json").read_bytes()
    assert set(saved) <= {path.name for path in folder.glob("*.json.gz")}


def test_grow_refuses_a_saved_record_of_another_configuration(tmp_path):
    record = {"config": {**section5.journal_config(small_config((0,))), "epochs": 99}}
    from icl_lens.reproduce import Run
    (tmp_path / "task_linear.json").write_text(json.dumps(record))
    run_ = Run(tmp_path, quick=True, device=None, seeds=None, compile=False, reuse=False, workers=2, log=None,
               grow=True)
    with pytest.raises(ValueError, match=r"--grow: .*task_linear.json was trained with another configuration "
                                         r"\(epochs: 99 -> 2\)"):
        run_.check_growable("linear", small_config((0,)))


def test_the_training_time_is_read_from_the_jobs_kept(tmp_path):
    from icl_lens.training.journal import training_time

    for task, seconds in (("linear", (12.5, 7.5)), ("exponential", (100.0,))):
        journal = Journal(tmp_path / task, {"workers": 2}, keep=False)
        for seed, spent in enumerate(seconds):
            journal.save((seed,), {"seed": seed}, {"seconds": spent, "numbers": [1.0]})
    (tmp_path / "not-a-journal").mkdir()
    assert training_time(tmp_path) == {"exponential": {"jobs": 1, "seconds": 100.0, "workers": 2},
                                       "linear": {"jobs": 2, "seconds": 20.0, "workers": 2}}


def test_the_training_time_of_a_record_counts_only_its_own_run(tmp_path):
    """A journal growing in the folder of a saved record (another configuration, or more seeds) is
    not that record's cost: the book showed a 20-seed sweep's jobs under the five-seed records."""
    from icl_lens.training.journal import training_time

    journal = Journal(tmp_path / "linear", {"workers": 2, "config": {"epochs": 4, "test_sequences": 256}},
                      keep=False)
    for seed, spent in ((0, 10.0), (1, 20.0), (7, 40.0)):
        journal.save((seed,), {"seed": seed}, {"seconds": spent, "seeds": [seed]})
    same = {"linear": {"config": {"epochs": 4, "test_sequences": 256, "seeds": [0, 1]}}}
    assert training_time(tmp_path, same) == {"linear": {"jobs": 2, "seconds": 30.0, "workers": 2}}
    other = {"linear": {"config": {"epochs": 4, "test_sequences": 64, "seeds": [0, 1]}}}
    assert training_time(tmp_path, other) == {}
    assert training_time(tmp_path, {}) == {}
    assert training_time(tmp_path)["linear"]["jobs"] == 3       # without records: every job kept
