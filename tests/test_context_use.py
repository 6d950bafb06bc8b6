"""Does a trained layer read its context (icl_lens.context_use)? The prompt changes on hand-built
prompts, the measurements on predictors that do and do not read their context, and the saved
run's measurements against its records."""

import json
import math

import pytest
import torch

from icl_lens import context_use
from icl_lens.device import generator
from icl_lens.results import repository_root

SAVED = repository_root() / "book" / "data" / "experiments"


def prompts(count=256, demonstrations=15, d=4, seed=0):
    """Linear tasks as rows [x ; y], the query's label 0: tokens (P, N + 1, d + 1), targets (P, 1)."""
    g = generator(seed)
    x = torch.rand(count, demonstrations + 1, d, generator=g, dtype=torch.float64) * 2 - 1
    w = torch.randn(d, generator=g, dtype=torch.float64)
    y = x @ w
    tokens = torch.cat([x, y.unsqueeze(-1)], dim=-1)
    tokens[:, -1, -1] = 0.0
    return tokens, y[:, -1:].clone(), w


def test_prompt_changes_touch_the_demonstrations_labels_only():
    tokens, _, _ = prompts(count=8)
    labels = torch.full((8, 15, 1), 7.0, dtype=torch.float64)
    changed = context_use.with_demonstration_labels(tokens, labels)
    assert torch.equal(changed[:, :, :-1], tokens[:, :, :-1]) and torch.equal(changed[:, -1], tokens[:, -1])
    assert (changed[:, :-1, -1] == 7.0).all()
    order = context_use.random_orders(8, 15, generator(1))
    shuffled = context_use.shuffled_labels(tokens, order, 1)
    assert torch.equal(shuffled[:, :, :-1], tokens[:, :, :-1])
    assert torch.equal(shuffled[:, :-1, -1].sort(-1).values, tokens[:, :-1, -1].sort(-1).values)
    assert not torch.equal(shuffled, tokens)


def measured(predict, tokens, targets):
    other = torch.randn(tokens.shape[0], tokens.shape[1] - 1, 1, generator=generator(2), dtype=torch.float64)
    order = context_use.random_orders(tokens.shape[0], tokens.shape[1] - 1, generator(3))
    weight = lambda t: torch.full(t.shape[:-2], 1.0 / t.shape[-2], dtype=torch.float64)   # noqa: E731
    return context_use.measure(predict, weight, tokens, targets, other_labels=other, order=order,
                               label_variance=float(targets.var(unbiased=False)))


def test_a_layer_that_stores_the_task_loses_nothing_without_its_context():
    tokens, targets, w = prompts()
    found = measured(lambda t: (t[..., -1, :-1] @ w).unsqueeze(-1), tokens, targets)
    assert found["intact"] < 1e-20
    for key in ("other_task_labels", "shuffled_labels", "query_alone"):
        assert found[key] == found["intact"], key


def test_a_layer_that_reads_its_context_is_hurt_without_it():
    """Least squares on the demonstrations (a reader of its context) is exact with the prompt
    intact, wrong with another task's or shuffled labels, and at the mean's loss or worse alone."""
    tokens, targets, _ = prompts()

    def least_squares(t):
        if t.shape[-2] == 1:              # no demonstration: predict the mean label, 0
            return torch.zeros(t.shape[0], 1, dtype=t.dtype)
        x, y = t[..., :-1, :-1], t[..., :-1, -1:]
        fitted = torch.linalg.lstsq(x, y).solution
        return (t[..., -1:, :-1] @ fitted).squeeze(-2)

    found = measured(least_squares, tokens, targets)
    assert found["intact"] < 1e-20
    assert found["other_task_labels"] > 0.5 and found["shuffled_labels"] > 0.5
    assert found["query_alone"] > 0.9


def test_label_row_cosine_finds_the_stored_task_weight():
    w = torch.tensor([[1.0, -2.0, 0.5]], dtype=torch.float64)
    W_V = torch.zeros(4, 4, dtype=torch.float64)
    W_V[-1, :3] = 3 * w
    assert float(context_use.label_row_cosine(W_V, w)) == pytest.approx(1.0)
    assert float(context_use.label_row_cosine(-W_V, w)) == pytest.approx(-1.0)
    W_V[-1, :3] = torch.tensor([2.0, 1.0, 0.0])     # orthogonal to w
    assert float(context_use.label_row_cosine(W_V, w)) == pytest.approx(0.0, abs=1e-12)


def test_medians_leave_out_diverged_seeds():
    by_seed = {"0": dict.fromkeys(context_use.MEASURES, 1.0), "1": dict.fromkeys(context_use.MEASURES, 3.0),
               "2": dict.fromkeys(context_use.MEASURES, None)}
    assert context_use.medians(by_seed)["intact"] == 1.0       # torch: the lower of two middles
    assert context_use.medians(by_seed, seeds={"2"})["intact"] is None


def test_saved_run_measures_every_model_and_the_intact_loss_is_its_test_loss():
    """Context use is measured on each seed's curve test set (the one the checkpoints read), so the
    intact prompt's loss is the curve's last point over that set's label variance; the final
    losses are read on a larger set of their own."""
    assert (SAVED / "context_use.json").exists(), "the saved full run: python -m icl_lens reproduce all"
    context = json.loads((SAVED / "context_use.json").read_text())
    for kind in ("linear", "trigonometric", "exponential"):
        record = json.loads((SAVED / f"task_{kind}.json").read_text())
        assert record["checkpoint_epochs"][-1] == len(record["epochs"])   # the last checkpoint ends the run
        for model in record["models"]:
            found = context["tasks"][kind][model["name"]][str(model["seed"])]
            assert set(found) == set(context_use.MEASURES)
            last = model["test_curve"][-1]
            if last is not None and math.isfinite(last):
                scale = record["baselines"][str(model["seed"])]["curve_label_variance"]
                assert found["intact"] == pytest.approx(last / scale, rel=1e-4, abs=1e-6)
    for setting, seeds in context["across_tasks"].items():
        assert len(seeds) >= 5 and all(set(v) == set(context_use.MEASURES) for v in seeds.values()), setting


def test_measure_against_a_loop():
    """Two models (a leading dimension), 3 prompts of 4 tokens, 2 label coordinates: each loss is
    sum over the label coordinates, mean over the prompts, of the squared error over the label
    variance, written out; the query weight is the mean over the prompts."""
    g = generator(4)
    tokens = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    targets = torch.randn(2, 3, 2, generator=g, dtype=torch.float64)
    other = torch.randn(2, 3, 3, 2, generator=g, dtype=torch.float64)
    order = torch.stack([torch.stack([torch.randperm(3, generator=g) for _ in range(3)]) for _ in range(2)])
    weights = torch.rand(2, 3, generator=g, dtype=torch.float64)

    def predict(prompts):   # changes with every prompt change, the order of the tokens included
        position = torch.arange(1, prompts.shape[-2] + 1, dtype=prompts.dtype).unsqueeze(-1)
        return (position * prompts).sum(-2)[..., 2:4]

    found = context_use.measure(predict, lambda t: weights, tokens, targets, other_labels=other, order=order,
                                label_variance=0.7)

    def loss(prompts, model):
        squared = [sum(float(predict(prompts)[model, p, k] - targets[model, p, k]) ** 2 for k in range(2))
                   for p in range(3)]
        return sum(squared) / 3 / 0.7

    for model in range(2):
        labels = tokens[..., :-1, -2:]
        shuffled = tokens.clone()
        for p in range(3):
            shuffled[model, p, :-1, -2:] = labels[model, p, order[model, p]]
        replaced = tokens.clone()
        replaced[..., :-1, -2:] = other
        expected = {"intact": loss(tokens, model), "other_task_labels": loss(replaced, model),
                    "shuffled_labels": loss(shuffled, model), "query_alone": loss(tokens[..., -1:, :], model),
                    "query_weight": float(weights[model].sum()) / 3}
        for key, value in expected.items():
            assert abs(float(found[key][model]) - value) < 1e-12 * max(1.0, abs(value)), key


def test_label_row_cosine_batched_against_a_loop():
    g = generator(5)
    W_V = torch.randn(3, 6, 6, generator=g, dtype=torch.float64)
    task_weight = torch.randn(3, 2, 4, generator=g, dtype=torch.float64)
    found = context_use.label_row_cosine(W_V, task_weight)
    for model in range(3):
        row, weight = W_V[model, -2:, :4].flatten(), task_weight[model].flatten()
        expected = float(row @ weight) / float(row.norm() * weight.norm())
        assert abs(float(found[model]) - expected) < 1e-14


def test_medians_are_float64_and_seeded_orders_repeat():
    by_seed = {seed: {name: value for name in context_use.MEASURES} for seed, value in ((0, 0.1), (1, 0.3), (2, 0.2))}
    assert context_use.medians(by_seed) == {name: 0.2 for name in context_use.MEASURES}   # 0.2 exactly, not float32's
    first, again = (context_use.random_orders(4, 9, generator(7)) for _ in range(2))
    assert torch.equal(first, again)
    assert torch.equal(first.sort(-1).values, torch.arange(9).expand(4, 9))
    # labels of another dtype take the tokens' dtype
    tokens = torch.zeros(2, 3, 3, dtype=torch.float32)
    changed = context_use.with_demonstration_labels(tokens, torch.ones(2, 2, 1, dtype=torch.float64))
    assert changed.dtype == torch.float32 and (changed[:, :-1, -1] == 1).all()
