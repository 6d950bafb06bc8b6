"""The one style of the book's figures: the column width, fonts, resolution, and the decorator that
builds a figure inside them.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
weight_shifting, experiments, across_tasks, closeness_experiment, bert.
"""

import functools
import math

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import MaxNLocator

COLUMN = 8.0   # inches: the book's text column shows a figure this wide at about 100 px an inch
# fonts sized for that column: 9 pt on an 8-inch figure reads as about 12 px on the page
STYLE = {"font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 7.5,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.titlesize": 10}
DPI = 160   # saved figures: sharp when the browser scales them to the column

FLOOR = 1e-3   # normalised losses below this (an exact in-context fit) are drawn at the floor


def styled(draw):
    """Build the figure inside :data:`STYLE` (matplotlib's settings are global: a context keeps
    them from leaking into a reader's own plots)."""
    @functools.wraps(draw)
    def build(*args, **kwargs):
        with plt.rc_context(STYLE):
            return draw(*args, **kwargs)
    return build


def integer_ticks(axis, which="x"):
    """Ticks at whole numbers only, for axes that count things (epochs, steps, tokens, layers)."""
    (axis.xaxis if which == "x" else axis.yaxis).set_major_locator(MaxNLocator(integer=True))


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
