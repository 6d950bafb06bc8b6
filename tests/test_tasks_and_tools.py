import json
import math

import pytest
import sympy as sp
import torch

from icl_lens import approximation, symbolic, tasks
from icl_lens.device import generator, pick
from icl_lens.results import load_result, results_dir, save_result


@pytest.mark.parametrize("task", [tasks.RegressionTask.linear(), tasks.RegressionTask.trigonometric(), tasks.RegressionTask.exponential()])
def test_task_sequences(task):
    g = generator(0)
    weight = tasks.sample_task_weight(task, generator=g)
    tokens, targets = tasks.sample_sequences(task, 4, weight, generator=g)
    assert tokens.shape == (4, task.num_tokens, task.token_dim)
    assert targets.shape == (4, task.output_dim)
    inputs = tokens[..., : task.input_dim]
    assert (inputs >= task.input_low).all() and (inputs <= task.input_high).all()
    labels = tasks.LINKS[task.kind](inputs @ weight.T)
    assert torch.allclose(tokens[:, :-1, task.input_dim:], labels[:, :-1])
    assert (tokens[:, -1, task.input_dim:] == 0).all()
    assert torch.allclose(targets, labels[:, -1])


def test_paper_defaults():
    linear = tasks.RegressionTask()
    assert (linear.input_dim, linear.output_dim, linear.num_tokens) == (11, 1, 16)
    assert tasks.RegressionTask.trigonometric().input_high == pytest.approx(math.pi)
    assert tasks.RegressionTask.exponential().num_tokens == 512


def test_tasks_are_reproducible_from_the_seed():
    task = tasks.RegressionTask()
    draws = []
    for _ in range(2):
        g = generator(7)
        weight = tasks.sample_task_weight(task, generator=g)
        draws.append(tasks.sample_sequences(task, 3, weight, generator=g))
    assert torch.equal(draws[0][0], draws[1][0]) and torch.equal(draws[0][1], draws[1][1])


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: tasks.RegressionTask(kind="quadratic"), "kind"),
        (lambda: tasks.RegressionTask(num_tokens=1), "num_tokens"),
        (lambda: tasks.RegressionTask(input_dim=0), "input_dim"),
        (lambda: tasks.RegressionTask(input_low=1.0, input_high=0.0), "input_low"),
        (lambda: tasks.sample_sequences(tasks.RegressionTask(), 0, torch.ones(1, 11)), "num_sequences"),
        (lambda: tasks.sample_sequences(tasks.RegressionTask(), 2, torch.ones(1, 10)), "weight"),
    ],
)
def test_task_bad_input(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_pick_device():
    assert pick("cpu") == torch.device("cpu")
    assert pick("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="device"):
            pick("cuda")


def test_results_round_trip_and_are_byte_identical(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = {"b": torch.tensor([1.5, 2.0]), "a": (1, 2), "nested": {"x": 0.1}}
    first = save_result(tmp_path, "demo", data)["json"].read_bytes()
    second = save_result(tmp_path, "demo", data)["json"].read_bytes()
    assert first == second
    assert load_result(tmp_path, "demo") == {"a": [1, 2], "b": [1.5, 2.0], "nested": {"x": 0.1}}
    figure, axis = plt.subplots()
    axis.plot([0, 1])
    paths = save_result(tmp_path, "with_figure", {"n": 1}, figure)
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert json.loads(paths["json"].read_text()) == {"n": 1}


def test_results_dir_finds_the_repository_root(tmp_path, monkeypatch):
    (tmp_path / "_toc.yml").write_text("root: x\n")
    (tmp_path / "book").mkdir()
    monkeypatch.delenv("ICL_LENS_RESULTS", raising=False)
    monkeypatch.chdir(tmp_path / "book")
    assert results_dir("chapter") == tmp_path / "results" / "chapter"


def test_symbolic_identities_and_a_broken_one():
    steps = symbolic.theorem_3_1(num_demos=2, num_query_side=1, value_dim=1, num_features=2)
    assert symbolic.is_zero_matrix(steps["gradient_residual"])
    assert symbolic.is_zero_matrix(steps["prediction_residual"])
    assert symbolic.is_zero_matrix(symbolic.per_demo_sgd_equals_full_step(num_demos=2))
    # the checker is not vacuous: a step with the wrong sign does not give the attention output
    wrong_step = steps["W0"] + steps["gradient"] * sp.Symbol("eta", positive=True)
    assert not symbolic.is_zero_matrix(wrong_step * steps["phi_q"] - steps["attention"])


def test_approximation_study_quick():
    config = approximation.ApproximationConfig(feature_counts=(10, 1000), repeats=3)
    result = approximation.approximation_error(config)
    assert result["feature_counts"] == [10, 1000]
    assert result["attention_mse"][1] < result["attention_mse"][0]
    assert all(math.isfinite(v) for key in ("attention_mse", "output_mae") for v in result[key])
    assert approximation.log_log_slope([1, 10, 100], [1.0, 0.1, 0.01]) == pytest.approx(-1.0)
    with pytest.raises(ValueError, match="feature_counts"):
        approximation.ApproximationConfig(feature_counts=(0,))


def test_frame_explorer_links_slider_to_frames():
    import ipywidgets as widgets
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from icl_lens.widgets import frame_explorer

    def render(value):
        figure, axis = plt.subplots()
        axis.set_title(str(value))
        return figure

    box = frame_explorer(render, [1, 2, 3], description="n")
    slider, stack, note = box.children
    assert "Binder" in note.value
    assert isinstance(stack, widgets.Stack) and len(stack.children) == 3
    # each label with the position of its frame in the stack
    assert list(slider.options) == [("1", 0), ("2", 1), ("3", 2)]
    # the link is made in the browser (jslink); here we check what it joins
    assert box.link.source == (slider, "index")
    assert box.link.target == (stack, "selected_index")
    assert isinstance(slider, widgets.SelectionSlider)
    named = frame_explorer(render, ["n = 25, softmax", "n = 200, linear"], description="run")
    assert isinstance(named.children[0], widgets.Dropdown)   # names are not cut by a readout
    assert named.link.source == (named.children[0], "index")
    with pytest.raises(ValueError, match="options"):
        frame_explorer(render, [], description="n")
