"""One kind of attention layer has one colour in every figure that draws it; the settings of one
figure never share a colour."""

from icl_lens.figures.prompt_layers import setting_colours
from icl_lens.figures.style import CURVES, LAYER_COLOURS

SETTINGS = ["paper task (linear)", "paper task (linear, 2 heads)", "paper task (paper's SGD)",
            "paper task (random-features)", "paper task (softmax)", "von Oswald (linear attention)"]


def test_the_paper_tasks_layers_take_their_layers_colours_and_no_two_settings_share_one():
    colours = setting_colours(SETTINGS)
    for layer in ("linear", "softmax", "random-features"):
        assert colours[f"paper task ({layer})"] == LAYER_COLOURS[layer]
    assert len(set(colours.values())) == len(SETTINGS)
    assert set(colours.values()) <= set(CURVES)
    # the others take the colours no layer has, in order
    spare = [c for c in CURVES if c not in LAYER_COLOURS.values()]
    assert [colours[name] for name in SETTINGS if colours[name] not in LAYER_COLOURS.values()] == spare[:3]


def test_the_across_tasks_figure_is_drawn_in_the_books_style():
    """Every figure function is built inside the book's style (fonts sized for the column); a
    decorator that slipped onto a helper once left this one in matplotlib's defaults."""
    import json
    from pathlib import Path

    import matplotlib.pyplot as plt

    from icl_lens.figures.prompt_layers import across_tasks_figure
    from icl_lens.figures.style import STYLE

    record = json.loads((Path(__file__).resolve().parents[1] / "book" / "data" / "multitask"
                         / "multitask.json").read_text())
    figure = across_tasks_figure(record, title="t")
    assert figure.axes[0].title.get_fontsize() == STYLE["axes.titlesize"]
    assert figure.axes[0].xaxis.label.get_fontsize() == STYLE["axes.labelsize"]
    plt.close(figure)


def test_the_equivalence_panel_folds_a_long_legend():
    """Past LEGEND_CURVES seeds the equivalence panel's legend is one entry, so it cannot cover the
    last SGD steps; with few seeds every seed keeps its own entry."""
    import matplotlib.pyplot as plt

    from icl_lens.figures.style import LEGEND_CURVES
    from icl_lens.figures.theory import sgd_error_panel

    for count, entries in ((3, 3), (LEGEND_CURVES + 10, 1)):
        figure, axis = plt.subplots()
        sgd_error_panel(axis, {f"seed {i}": [1.0, 0.1, 1e-30] for i in range(count)}, title="t", ylabel="y",
                        fontsize=8)
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert len(labels) == entries and len(axis.get_lines()) == count
        plt.close(figure)
    assert labels == [f"{LEGEND_CURVES + 10} seeds"]


def test_the_context_use_figure_folds_many_seeds_under_their_median():
    """Past LEGEND_CURVES seeds the context-use panels draw every seed in one colour under a black
    median, with one legend ("one seed", "median") and each panel's count in its title; with few
    seeds each seed keeps its colour and entry, and no median is drawn."""
    import matplotlib.pyplot as plt
    import torch

    from icl_lens.figures.section5 import CONTEXT_LOSSES, context_use_figure
    from icl_lens.figures.style import LEGEND_CURVES

    generator = torch.Generator().manual_seed(0)

    def seeds(count):
        return {str(s): {key: float(torch.rand(1, generator=generator)) + 0.1 for key, _ in CONTEXT_LOSSES}
                for s in range(count)}

    many = LEGEND_CURVES + 2
    record = {"tasks": {"linear": {"normal": seeds(many)}}, "across_tasks": {"paper task (softmax)": seeds(2)}}
    figure = context_use_figure(record)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["one seed", "median"]
    linear, across = figure.axes[0], figure.axes[1]
    assert linear.get_title().endswith(f"({many} seeds)") and across.get_title().endswith("(2 seeds)")
    median = [line for line in linear.get_lines() if line.get_label() == "median"][0]
    expected = torch.tensor([[m[key] for key, _ in CONTEXT_LOSSES] for m in record["tasks"]["linear"]["normal"].values()])
    assert torch.allclose(torch.as_tensor(median.get_ydata(), dtype=torch.float32), expected.median(0).values)
    assert len({line.get_color() for line in linear.get_lines() if line.get_label() != "median"} - {"grey"}) == 1
    plt.close(figure)
    figure = context_use_figure({"tasks": {"linear": {"normal": seeds(3)}}, "across_tasks": {}})
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["seed 0", "seed 1", "seed 2"]
    plt.close(figure)


def test_the_convergence_figure_folds_many_seeds_and_counts_each_panel():
    """The saved convergence study (more than LEGEND_CURVES seeds on some task): one colour, one
    legend entry "one seed", and each panel's own seed count in its title (the tasks draw different
    numbers of seeds); cut to three seeds a task, every seed keeps its colour and entry."""
    import json
    from pathlib import Path

    import matplotlib.pyplot as plt

    from icl_lens.figures.section5 import convergence_figure
    from icl_lens.figures.style import LEGEND_CURVES

    studies = json.loads((Path(__file__).resolve().parents[1] / "book" / "data" / "experiments"
                          / "convergence.json").read_text())
    counts = {kind: len(study["record"]["config"]["seeds"]) for kind, study in studies.items()}
    assert max(counts.values()) > LEGEND_CURVES
    figure = convergence_figure(studies)
    assert [t.get_text() for t in figure.legends[0].get_texts()] == ["one seed", "saved run ends"]
    titles = {axis.get_title().split(":")[0]: axis.get_title() for axis in figure.axes}
    assert all(titles[kind].endswith(f"({count} seeds)") for kind, count in counts.items())
    plt.close(figure)

    def cut(study, keep=3):
        record = study["record"]
        seeds = record["config"]["seeds"][:keep]
        return {**study, "record": {**record, "config": {**record["config"], "seeds": seeds},
                                    "models": [m for m in record["models"] if m["seed"] in seeds]}}

    figure = convergence_figure({kind: cut(study) for kind, study in studies.items()})
    labels = [t.get_text() for t in figure.legends[0].get_texts()]
    first = studies["linear"]["record"]["config"]["seeds"][:3]
    assert labels[:3] == [f"seed {s}" for s in first] and "one seed" not in labels
    assert not any(axis.get_title().endswith("seeds)") for axis in figure.axes)
    plt.close(figure)
