"""The machinery every study shares, on hand-built inputs: the paired summary and the convergence
criterion (icl_lens.verdicts; the decisions are tested in test_statistics.py), the loop toolkit (icl_lens.training.loop), and the package's shape (no study
imports another; each mechanism has one home)."""

import ast
import math
import pathlib

import pytest
import torch

from icl_lens import verdicts
from icl_lens.device import generator
from icl_lens.training import loop

from conftest import RecordingPool

ROOT = pathlib.Path(__file__).resolve().parents[1]
BAND = 0.01


def test_paired_comparison_counts_seeds_beyond_their_own_band_and_leaves_out_nan():
    differences = [-0.3, -0.05, 0.2, math.nan, -0.001]
    bands = [0.1, 0.01, 0.1, 0.1, 0.01]
    found = verdicts.paired_comparison(differences, bands)          # a loss: negative is better
    assert (found["better"], found["worse"]) == (2, 1)
    assert found["median"] == pytest.approx((-0.05 - 0.001) / 2)   # of the four kept: the middle two's mean
    assert found["interval"] == [None, None] and found["coverage"] is None     # no 95% interval below 6
    six = verdicts.paired_comparison([0.3, -0.2, 0.1, 0.05, -0.4, 0.0], [0.1] * 6)
    assert six["interval"] == [-0.4, 0.3] and six["coverage"] == pytest.approx(1 - 2 / 64)
    flipped = verdicts.paired_comparison(differences, bands, lower_is_better=False)
    assert (flipped["better"], flipped["worse"]) == (1, 2)
    with pytest.raises(ValueError, match="bands"):
        verdicts.paired_comparison(differences, bands[:2])


def test_convergence_criterion_one_and_two_sided():
    gains = [0.001, 0.002, -0.05, 0.004, 0.5]          # one seed got worse, one still moves
    one_sided = verdicts.converged(gains, 0.01)
    assert one_sided["converged"] and one_sided["seeds_converged"] == 4
    assert not verdicts.converged([0.02, 0.03, 0.001], 0.01)["converged"]
    worse = [-0.05, -0.04, 0.0]                         # longer training made it worse
    assert verdicts.converged(worse, 0.01)["converged"]
    assert not verdicts.converged(worse, 0.01, two_sided=True)["converged"]
    assert not verdicts.converged([math.nan, math.nan, math.nan], 0.01)["converged"]


def test_decay_schedule_and_its_fork_point():
    """A run of 10 units decays over its last 2: the fork point 8 is the first unit where it may
    differ from a longer run, and every step before it has the full rate."""
    assert loop.fork_point(10, 0.2) == 8
    assert all(loop.decay_factor(step, 10, 0.2) == 1.0 for step in range(8))
    assert loop.decay_factor(9, 10, 0.2) == pytest.approx(0.5) and loop.decay_factor(10, 10, 0.2) == 0.0
    assert loop.fork_point(5, 0.2) == 4 and loop.fork_point(7, 0.25) == 5


def test_fork_copies_model_stream_and_optimiser_state_without_sharing():
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    optimizer.step()
    stream = generator(7)
    copy, copied_stream, state = loop.fork(model, stream, optimizer)
    assert torch.equal(torch.rand(4, generator=copied_stream), torch.rand(4, generator=stream))
    with torch.no_grad():
        copy.weight += 1
    assert not torch.equal(copy.weight, model.weight)
    state["state"][0]["exp_avg"] += 1
    assert not torch.equal(state["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_sgd_step_takes_one_rate_or_one_per_model():
    weights = torch.nn.Parameter(torch.ones(3, 2, 2))
    weights.grad = torch.ones(3, 2, 2)
    loop.sgd_step([weights], torch.tensor([0.1, 0.2, 0.3]))
    assert torch.allclose(weights[:, 0, 0], torch.tensor([0.9, 0.8, 0.7])) and weights.grad is None
    weights.grad = torch.ones(3, 2, 2)
    loop.sgd_step([weights], 0.5)
    assert torch.allclose(weights[:, 0, 0], torch.tensor([0.4, 0.3, 0.2]))


def _scaled(value, scale, *, device):
    return value * scale


def test_run_jobs_gives_the_same_results_in_worker_processes():
    jobs = [(torch.arange(3.0), 2.0), (torch.ones(2), -1.0)]
    alone = loop.run_jobs(_scaled, jobs)
    pooled = loop.run_jobs(_scaled, jobs, workers=2)
    assert all(torch.equal(a, b) for a, b in zip(alone, pooled))
    with pytest.raises(ValueError, match="workers"):
        loop.run_jobs(_scaled, jobs, workers=0)


def test_run_jobs_hands_out_the_longest_jobs_first(monkeypatch):
    """With costs, the pool is given the jobs longest first (it hands them out in that order) and
    the results keep the jobs' order; without one, it is given them as they come."""
    monkeypatch.setattr(loop, "ProcessPoolExecutor", RecordingPool)
    jobs = [(torch.ones(1), 1.0), (torch.ones(1), 3.0), (torch.ones(1), 2.0), (torch.ones(1), 3.0)]
    with pytest.raises(ValueError, match="costs"):
        loop.run_jobs(_scaled, jobs, workers=2, costs=[1.0])
    results = loop.run_jobs(_scaled, jobs, workers=2, costs=[job[1] for job in jobs])
    assert [job[1] for job in RecordingPool.submitted] == [3.0, 3.0, 2.0, 1.0]
    assert RecordingPool.submitted[0] is jobs[1]   # equal costs keep their order
    assert [float(r) for r in results] == [1.0, 3.0, 2.0, 3.0]
    loop.run_jobs(_scaled, jobs, workers=2)
    assert [job[1] for job in RecordingPool.submitted] == [1.0, 3.0, 2.0, 3.0]
    for workers in (1, 2):   # each job's result is handed on as it ends, with its place in jobs
        ended = []
        loop.run_jobs(_scaled, jobs, workers=workers, done=lambda i, result: ended.append((i, float(result))))
        assert sorted(ended) == [(0, 1.0), (1, 3.0), (2, 2.0), (3, 3.0)]


def imported_modules(path):
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_study_imports_another_study():
    studies = ROOT / "icl_lens" / "studies"
    # a study's own modules: its claims, measurements and threshold claims belong to section5, and
    # so does the same study under its other protocol (a new task per prompt)
    family = {"section5_claims": "section5", "section5_measures": "section5", "section5_readings": "section5",
              "trained_layer_claims": "section5", "modifications_across_tasks": "section5"}
    for path in studies.glob("*.py"):
        if path.stem == "__init__":
            continue
        own = family.get(path.stem, path.stem)
        for module in imported_modules(path):
            if module.startswith("icl_lens.studies."):
                other = module.split(".")[2]
                assert family.get(other, other) == own, f"{path.name} imports {module}"


def test_each_shared_mechanism_is_defined_once():
    """The SGD step, the decay schedule, the fork, the paired comparison, the decisions of claims,
    their bounds and the convergence criterion each have one definition in the package."""
    names = ("sgd_step", "decay_factor", "fork_point", "fork", "run_jobs", "paired_comparison", "decide",
             "decide_claim", "one_sided_bounds", "two_sided_interval", "family_adjusted", "seeds_needed",
             "converged", "median", "lower_median")
    defined = {}
    for path in (ROOT / "icl_lens").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.col_offset == 0:
                defined.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    for name in names:
        homes = defined.get(name, [])
        # prompt_layer.converged applies verdicts.converged to one run's record; it is not a second rule
        homes = [h for h in homes if not (name == "converged" and h.endswith("prompt_layer.py"))]
        assert len(homes) == 1, (name, homes)
