"""The one style of the book's figures: the column width, fonts, resolution, and the decorator that
builds a figure inside them.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
weight_shifting, experiments, across_tasks, closeness_experiment, bert.
"""

import functools
import math

import matplotlib.pyplot as plt
import torch
from cycler import cycler
from matplotlib.ticker import MaxNLocator

COLUMN = 8.0   # inches: the book's text column shows a figure this wide at about 100 px an inch
# fonts sized for that column: 9 pt on an 8-inch figure reads as about 12 px on the page
# the curves' colours: matplotlib's tab10 without its grey, which the baselines use
CURVES = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
# one colour a kind of attention layer wherever the book draws it (across tasks, Li et al.)
LAYER_COLOURS = {"linear": CURVES[0], "softmax": CURVES[1], "random-features": CURVES[2]}
STYLE = {"font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 8,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.titlesize": 10,
         "axes.prop_cycle": cycler(color=CURVES)}
DPI = 160   # saved figures: sharp when the browser scales them to the column

# log axes cannot show 0: a normalised loss below this (an exact fit) is drawn here; the axes
# otherwise extend to the smallest value shown, so nothing above it is clamped
FLOOR = 1e-12


# past this many seeds, a line, a colour and a legend entry each would repeat the nine colours and
# bury the panel under its legend: the seeds then share one pale colour and one entry
LEGEND_CURVES = 10


def seed_line(index, count, label, folded_label=None):
    """Keywords for the line of seed number ``index`` of ``count`` drawn one line a seed: its own
    colour and legend ``label`` up to :data:`LEGEND_CURVES` seeds, past it one shared colour and a
    single entry, ``folded_label`` or "``count`` seeds" (a figure whose panels count their own
    seeds names the line "one seed")."""
    if count <= LEGEND_CURVES:
        return {"label": label}
    return {"color": "C0", "alpha": 0.4, "label": (folded_label or f"{count} seeds") if index == 0 else None}


def styled(draw):
    """Build the figure inside :data:`STYLE` (matplotlib's settings are global: a context keeps
    them from leaking into a reader's own plots)."""
    @functools.wraps(draw)
    def build(*args, **kwargs):
        with plt.rc_context(STYLE):
            return draw(*args, **kwargs)
    return build


def integer_ticks(axis, which="x", most=None):
    """Ticks at whole numbers only, for axes that count things (epochs, steps, tokens, layers);
    ``most`` caps their number (narrow panels, whose labels would run together)."""
    locator = MaxNLocator(integer=True) if most is None else MaxNLocator(nbins=most, integer=True)
    (axis.xaxis if which == "x" else axis.yaxis).set_major_locator(locator)


def as_numpy(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


def median_band(axis, epochs, losses, **style):
    """Median over seeds (line) and interquartile range (band) of a (seeds, points) tensor."""
    finite = losses.nan_to_num(nan=math.inf)
    median = finite.median(0).values
    line, = axis.plot(epochs, median.clamp(min=FLOOR), **style)
    if losses.shape[0] > 2:
        low, high = torch.quantile(finite, 0.25, dim=0), torch.quantile(finite, 0.75, dim=0)
        axis.fill_between(epochs, low.clamp(min=FLOOR), high.clamp(min=FLOOR, max=1e3), color=line.get_color(),
                          alpha=0.15, linewidth=0)
    return median
