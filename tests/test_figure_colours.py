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
