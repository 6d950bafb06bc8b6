"""ipywidgets explorers: live ones for Jupyter and Binder, and frame ones that move in static HTML.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers, appendix_f,
modifications, experiments, across_tasks, softmax_regression, lipschitz_lemmas, weight_shifting,
closeness_experiment.

A live explorer calls Python on every change, so it needs a kernel. A frame explorer renders one
image per slider position ahead of time and links the slider to a ``Stack`` of images with
``jslink``: the browser switches frames by itself, which keeps the rendered book interactive.
"""

import io


def figure_png(figure, dpi=150):
    """PNG bytes of a matplotlib figure, which is then closed."""
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(figure)
    return buffer.getvalue()


def frame_explorer(render, options, *, description):
    """A slider over ``options`` whose frames (``render(option)`` figures) are precomputed; a
    drop-down list instead when the options are names (a slider's readout would cut them).

    Works without a kernel: the control's ``index`` is linked to the ``Stack`` on the client side.
    """
    import ipywidgets as widgets

    if not options:
        raise ValueError("options must hold at least one value")
    # frames scale down to the text column instead of scrolling sideways
    fit = widgets.Layout(max_width="100%", height="auto", margin="0")
    frames = [widgets.Image(value=figure_png(render(option)), format="png", layout=fit) for option in options]
    stack = widgets.Stack(frames, selected_index=0)
    control = widgets.Dropdown if any(isinstance(option, str) for option in options) else widgets.SelectionSlider
    slider = control(
        options=[(str(option), position) for position, option in enumerate(options)],
        description=description,
        style={"description_width": "initial"},
    )
    note = widgets.HTML(
        "<small>Frames computed when this page was built. Open the chapter in Jupyter or Binder "
        "(rocket button) to recompute with other values.</small>"
    )
    explorer = widgets.VBox([slider, stack, note])
    explorer.link = widgets.jslink((slider, "index"), (stack, "selected_index"))
    return explorer


def live_explorer(render, **controls):
    """``interactive`` over ``controls`` (ipywidgets sliders); ``render(**values)`` draws a figure.

    Needs a kernel (Jupyter, Binder): in the static book it shows the figure for the initial values.
    """
    import ipywidgets as widgets
    import matplotlib.pyplot as plt

    def show(**values):
        figure = render(**values)
        plt.show()
        return figure

    return widgets.interactive(show, **controls)
