"""The pilot of the modifications across tasks: prompts with a task weight of their own, the
baselines against a direct computation, and Adam on the stacked ensemble giving each model the run
it would have alone (so models of one ensemble are independent runs)."""

import math
from dataclasses import replace

import pytest
import torch

from icl_lens.device import generator
from icl_lens.studies import modifications_across_tasks as study
from icl_lens.tasks import RegressionTask
from icl_lens.training.ensemble import Modification


def test_every_prompt_has_its_own_task_weight():
    task = RegressionTask.linear()
    tokens, targets = study.new_task_sequences(task, 6, generator=generator(3))
    assert tokens.shape == (6, task.num_tokens, task.token_dim) and targets.shape == (6, 1)
    assert torch.all(tokens[:, -1, task.input_dim:] == 0)            # the query's label is masked
    # each prompt's labels are a linear map of its inputs: least squares recovers it exactly, and
    # the recovered maps differ from prompt to prompt
    recovered = []
    for i in range(6):
        x, y = tokens[i, :-1, : task.input_dim], tokens[i, :-1, task.input_dim]
        w = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
        assert float(tokens[i, -1, : task.input_dim] @ w) == pytest.approx(float(targets[i, 0]), abs=1e-9)
        recovered.append(w)
    assert min(float((a - b).norm()) for i, a in enumerate(recovered) for b in recovered[i + 1:]) > 0.1
    # the exponential link: labels are exp(W t)
    exponential = RegressionTask.exponential()
    tokens, targets = study.new_task_sequences(exponential, 3, generator=generator(4))
    assert torch.all(tokens[:, :-1, exponential.input_dim] > 0) and torch.all(targets > 0)


def test_baselines_match_a_direct_computation():
    task = RegressionTask.linear()
    tokens, targets = study.new_task_sequences(task, 200, generator=generator(1))
    tuning = study.new_task_sequences(task, 200, generator=generator(2))
    found = study.baseline_losses(task, tokens, targets, *tuning)
    y = targets[:, 0]
    x, labels, query = tokens[:, :-1, :11], tokens[:, :-1, 11], tokens[:, -1, :11]
    assert found["zero"] == pytest.approx(float((y ** 2).mean()))
    assert found["context mean"] == pytest.approx(float(((labels.mean(1) - y) ** 2).mean()))
    # one step from w = 0: w1 = lr / N sum_i y_i x_i, the prediction w1 . x_q
    step = found["lr_star"] / labels.shape[1] * (labels.unsqueeze(-1) * x).sum(1)
    assert found["one GD step (lr*)"] == pytest.approx(float((((step * query).sum(-1) - y) ** 2).mean()))
    assert found["least squares"] < 1e-20                             # 15 demonstrations, 11 inputs, no noise
    assert found["one GD step (lr*)"] < found["zero"]


def test_a_model_in_the_ensemble_trains_as_it_would_alone():
    """Adam is elementwise and no weight is shared, so the normal model of seed 0 trained beside a
    g2 model and another seed ends where it ends alone (float64)."""
    config = replace(study.PilotConfig().quick(), dtype="float64", steps=6, checkpoints=3, num_features=24)
    together = study.run_pilot(config)
    alone = study.run_pilot(replace(config, variants=(Modification(),), seeds=(0,)))
    (mine,) = [m for m in together["models"] if m["name"] == "normal" and m["seed"] == 0]
    assert mine["test_curve"] == pytest.approx(alone["models"][0]["test_curve"], rel=1e-10)
    assert mine["train_loss"] == pytest.approx(alone["models"][0]["train_loss"], rel=1e-10)
    # and the modified model is another run: it does not end where the normal one does
    (g2,) = [m for m in together["models"] if m["name"] == "g2=gelu" and m["seed"] == 0]
    assert not math.isclose(g2["test_curve"][-1], mine["test_curve"][-1], rel_tol=1e-6)
    assert together["checkpoint_steps"] == [2, 4, 6] and together["seconds_per_step"] > 0


@pytest.mark.parametrize("field, value", [("batch", 0), ("steps", -1), ("lr", 0.0), ("lr", float("nan")),
                                          ("checkpoints", 1.5), ("seeds", (1, 1)), ("dtype", "float16"),
                                          ("variants", ())])
def test_a_bad_setting_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=field if field != "variants" else "variants"):
        replace(study.PilotConfig(), **{field: value})
