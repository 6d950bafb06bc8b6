"""Li et al.'s experiment rebuilt (icl_lens.studies.li_et_al): the task, the one-step comparator against
autograd, the labels that give nothing away, and the theorem measured on real updates."""

import json

import pytest
import torch

from icl_lens.studies import li_et_al
from icl_lens.training import prompt_layer
from icl_lens import softmax_regression as sr
from icl_lens.device import generator
from icl_lens.results import repository_root, to_plain


def prompts(task=li_et_al.SoftmaxRegressionTask(25, 20), count=64, seed=0):
    return task.sample(count, generator=generator(seed), dtype=torch.float64)


def test_labels_are_n_softmax_minus_one_and_average_to_zero():
    task = li_et_al.SoftmaxRegressionTask(25, 20)
    x_context, y_context, x_query, y_query = prompts(task)
    assert x_context.shape == (64, 25, 20) and y_context.shape == (64, 25)
    assert torch.allclose(y_context.mean(-1), torch.zeros(64, dtype=torch.float64), atol=1e-12)
    assert (y_context > -1).all() and (y_query > -1).all()


def test_the_query_label_is_not_given_away_by_the_context_labels():
    x_context, y_context, _, y_query = prompts(count=512)
    # inside the document the normalisation gives a label away: y_0 = -(sum of the others) ...
    assert torch.allclose(y_context[:, 0], -y_context[:, 1:].sum(-1), atol=1e-10)
    # ... but the query is not a row of the document: the same formula misses its label
    leak = -y_context.sum(-1)
    assert ((y_query - leak) ** 2).mean() > 0.5 * (y_query ** 2).mean()


def test_gd_step_is_one_autograd_step_on_the_softmax_regression_loss():
    task = li_et_al.SoftmaxRegressionTask(25, 20)
    x_context, y_context, x_query, _ = prompts(task, count=8)
    x = torch.zeros(8, 20, dtype=torch.float64, requires_grad=True)
    loss = 0.5 * ((25 * sr.f(x_context, x) - 1 - y_context) ** 2).sum()
    (gradient,) = torch.autograd.grad(loss, x)
    lr = 0.05
    assert torch.allclose(task.gd_step(x_context, y_context, x_query, lr), -lr * gradient, atol=1e-12)
    # wrong input: another prompt's labels give another step
    assert not torch.allclose(task.gd_step(x_context, y_context.roll(1, 0), x_query, lr), -lr * gradient,
                              atol=1e-3)


def test_one_step_prediction_extends_f_to_the_query_row():
    task = li_et_al.SoftmaxRegressionTask(25, 20)
    x_context, y_context, x_query, _ = prompts(task, count=8)
    x_1 = task.gd_step(x_context, y_context, x_query, 0.1)
    logits = torch.cat([sr.logits(x_context, x_1), (x_query * x_1).sum(-1, keepdim=True)], dim=-1)
    expected = 25 * torch.exp(logits[:, -1]) / torch.exp(logits[:, :-1]).sum(-1) - 1
    assert torch.allclose(task.one_step(x_context, y_context, x_query, 0.1), expected, atol=1e-12)


def test_best_lr_beats_its_neighbours_on_the_grid():
    task = li_et_al.SoftmaxRegressionTask(25, 20)
    test = prompts(task, count=512)
    best = task.best_lr(test)

    def error(lr):
        return float(((task.one_step(*test[:3], lr) - test[3]) ** 2).mean())

    assert all(error(best) <= error(lr) for lr in li_et_al.LEARNING_RATES)
    assert error(best) < float((test[3] ** 2).mean())   # better than predicting the mean (0)


def test_theorem_ratios_are_at_most_one_on_updates():
    task = li_et_al.SoftmaxRegressionTask(25, 20)
    test = prompts(task, count=64)
    layer = prompt_layer.PromptAttentionLayer(21, prompt_layer.PromptLayerConfig(attention="softmax"), dtype=torch.float64)
    measured = li_et_al.theorem_on_steps(task, layer, test, task.best_lr(test))
    for side in ("x", "A"):
        assert 0 < measured[side]["ratio_tight"] <= 1.0
        assert measured[side]["log10_ratio_M"] < -10   # M is far from tight


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="n must"):
        li_et_al.SoftmaxRegressionTask(1, 20)
    with pytest.raises(ValueError, match="num_demos"):
        li_et_al.SoftmaxRegressionTask().sample(4, num_demos=3)
    with pytest.raises(ValueError, match="reference_steps"):
        li_et_al.StudyConfig(reference_steps=(100,))


def test_saved_full_run_is_complete_and_its_verdicts_recompute():
    saved = repository_root() / "book" / "data" / "closeness" / "closeness.json"
    assert saved.exists(), "the saved full run: python -m icl_lens reproduce softmax-regression --out book/data/closeness"
    record = json.loads(saved.read_text())
    assert tuple(record["study"]["lengths"]) == (25, 200) and record["study"]["d"] == 20
    for n, layers in record["lengths"].items():
        assert set(layers) == set(li_et_al.LAYERS)
        for runs in layers.values():
            assert len(runs) == 5
            assert li_et_al.summary(runs)["converged"], n
        for run in layers["softmax"]:
            for side in ("x", "A"):
                assert 0 < run["theorem"][side]["ratio_tight"] <= 1
    assert sorted(int(d) for d in record["dims"]) == [5, 10, 20, 40]
    found = li_et_al.claims(record)
    # per length: the loss and the alignment halves of closeness, and Model Cos rising; then two more
    assert len(found) == 3 * len(record["lengths"]) + 2
    # judged again from the saved runs, every claim (verdict, interval, values) is the saved one
    saved_claims = json.loads((saved.parent / "closeness_claims.json").read_text())["claims"]
    assert json.loads(json.dumps(to_plain(found))) == saved_claims


def test_closeness_verdict_reads_the_seeds_sign_tests():
    """Six seeds at 1.06 x GD*'s loss, aligned: partly (beyond the 5% band needs the sign test at
    0.025, six of six); five such seeds cannot show it; the seeds spread across the band:
    inconclusive; within 2% everywhere: agrees; far off and not aligned on six seeds: disagrees."""
    def runs(ratios, cosines):
        return [{"schedule": "decay", "loss": [0.5 * q], "model_cos": [c],
                 "baselines": {"one GD step (lr*)": 0.5}} for q, c in zip(ratios, cosines)]

    aligned = [0.96, 0.97, 0.98, 0.96, 0.99]
    summary = {"trained layer": 0.53, "one GD step (lr*)": 0.5, "model_cos": 0.97}
    assert li_et_al.closeness_verdict(summary, runs([1.06, 1.07, 1.06, 1.08, 1.06, 1.07],
                                                    aligned + [0.97])).startswith("partly")
    assert li_et_al.closeness_verdict(summary, runs([1.06, 1.07, 1.06, 1.08, 1.06], aligned)).startswith("inconclusive")
    spread = li_et_al.closeness_verdict(summary, runs([0.98, 1.06, 1.03, 1.09, 1.01], aligned))
    assert spread.startswith("inconclusive") and "loss ratio" in spread
    assert li_et_al.closeness_verdict(summary, runs([1.01, 0.99, 1.02, 1.0, 0.98], aligned)) == "agrees"
    assert li_et_al.closeness_verdict(summary, runs([1.2, 1.3, 1.25, 1.4, 1.2, 1.3], [0.5] * 6)) == "disagrees"
