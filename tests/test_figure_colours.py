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

    from icl_lens.figures.theory import LEGEND_CURVES, sgd_error_panel

    for count, entries in ((3, 3), (LEGEND_CURVES + 10, 1)):
        figure, axis = plt.subplots()
        sgd_error_panel(axis, {f"seed {i}": [1.0, 0.1, 1e-30] for i in range(count)}, title="t", ylabel="y",
                        fontsize=8)
        labels = [text.get_text() for text in axis.get_legend().get_texts()]
        assert len(labels) == entries and len(axis.get_lines()) == count
        plt.close(figure)
    assert labels == [f"{LEGEND_CURVES + 10} seeds"]
