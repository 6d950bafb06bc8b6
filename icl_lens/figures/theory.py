"""Figures of the theory chapters (R&L Thm 3.1, 3.2, B.1, B.2, App. E Figs. 6-9; Li et al.'s
weight shifting). Each function takes numbers computed elsewhere and returns a figure.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
weight_shifting.
"""

import math

import matplotlib.pyplot as plt
import torch

from icl_lens.figures.style import COLUMN, as_numpy, integer_ticks, seed_line, styled


@styled
def approximation_error_figure(results, title="Random-feature approximation of softmax attention"):
    """Figs. 6-8: MSE and MAE of attention matrix and output against d_r (log-log), one line per result:
    the median over repeats and the band between the quartiles (the errors are heavy-tailed, so a
    mean +- std band would dip below zero).

    ``results`` maps a label (e.g. "iid", "orthogonal") to the dict of
    :func:`icl_lens.approximation.approximation_error`.
    """
    figure, axes = plt.subplots(2, 2, figsize=(COLUMN, 6.2))
    axes = axes.ravel()
    keys = ("attention_mse", "attention_mae", "output_mse", "output_mae")
    labels = ("attention matrix MSE", "attention matrix MAE", "output MSE", "output MAE")
    for axis, key, label in zip(axes, keys, labels):
        for name, result in results.items():
            counts = result["feature_counts"]
            median = torch.tensor(result[f"{key}_median"])
            low, high = torch.tensor(result[f"{key}_quartiles"]).T
            line, = axis.plot(counts, median, marker="o", markersize=3, label=name)
            axis.fill_between(counts, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        first = next(iter(results.values()))
        reference = torch.tensor(first["feature_counts"], dtype=torch.float64)
        slope = 1.0 if key.endswith("mse") else 0.5
        anchor = first[f"{key}_median"][0] * (reference[0] ** slope)
        axis.plot(reference, anchor / reference**slope, "k--", linewidth=0.8, label=f"$\\propto d_r^{{-{slope:g}}}$")
        axis.set(xscale="log", yscale="log", xlabel="$d_r$ (random features)", title=label)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def attention_heatmaps_figure(exact, estimate, exact_output, estimate_output, num_features):
    """Fig. 9: exact and estimated attention matrix (top) and output (bottom) on shared colour
    scales, and the estimate minus the exact values on a scale of their own (right)."""
    exact, estimate = as_numpy(exact), as_numpy(estimate)
    exact_output, estimate_output = as_numpy(exact_output), as_numpy(estimate_output)
    figure, axes = plt.subplots(2, 3, figsize=(COLUMN, 5.6), layout="constrained")
    rows = (("attention", exact, estimate, "viridis", "key token", "query token"),
            ("output", exact_output, estimate_output, "coolwarm", "output dimension", "token"))
    for row, (part, truth, guess, colours, xlabel, ylabel) in zip(axes, rows):
        low, high = min(truth.min(), guess.min()), max(truth.max(), guess.max())
        for axis, matrix, name in zip(row[:2], (truth, guess), ("exact softmax", f"$d_r$ = {num_features}")):
            image = axis.imshow(matrix, vmin=low, vmax=high, cmap=colours)
            # the second panel shares the first one's rows: its label would run into the first
            axis.set(title=f"{part}:\n{name}", xlabel=xlabel, ylabel=ylabel if axis is row[0] else "")
            integer_ticks(axis, "x")
            integer_ticks(axis, "y")
        figure.colorbar(image, ax=row[:2], shrink=0.85)
        difference = guess - truth
        bound = abs(difference).max()
        image = row[2].imshow(difference, vmin=-bound, vmax=bound, cmap="PiYG")
        # two lines: one would run into the colour bar of the middle panels
        row[2].set(title=f"{part}:\nestimate - exact", xlabel=xlabel)
        integer_ticks(row[2], "x")
        integer_ticks(row[2], "y")
        figure.colorbar(image, ax=row[2], shrink=0.85)
    return figure


@styled
def sgd_error_figure(curves, title="R&L Fig. 3 (left): dual model trained one demonstration at a time",
                     ylabel="$\\|\\hat y_{test} - h'\\|^2$"):
    """||y_test - h'||^2 against the number of SGD steps, one line per label, log scale.

    ``curves`` maps a label to a sequence of squared errors (entry t: after t steps). Exact zeros are
    drawn at the floor 1e-35 so that reaching round-off is visible on the log axis.
    """
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    sgd_error_panel(axis, curves, title=title, ylabel=ylabel, fontsize=8)
    figure.tight_layout()
    return figure


def sgd_error_panel(axis, curves, *, title, ylabel, fontsize):
    """The lines of :func:`sgd_error_figure` on a given axis (also the equivalence panel of Figs. 3, 11, 12)."""
    # a legend of every seed would cover the last steps, where the identity is checked
    for index, (label, errors) in enumerate(curves.items()):
        values = torch.as_tensor(errors, dtype=torch.float64).clamp(min=1e-35)
        axis.plot(range(len(values)), values, marker=".", **seed_line(index, len(curves), label))
    axis.set(yscale="log", xlabel="SGD steps (one demonstration each)", ylabel=ylabel, title=title)
    integer_ticks(axis)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=fontsize)


@styled
def gap_to_softmax_figure(feature_counts, dual_gap, kernel_gap, spread=None):
    """Relative distance of the dual prediction to exact softmax attention, against d_r."""
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    axis.plot(feature_counts, dual_gap, marker="o", label="dual prediction vs softmax attention")
    axis.plot(feature_counts, kernel_gap, marker="x", linestyle=":", label="kernel attention vs softmax attention")
    if spread is not None:
        low, high = spread
        axis.fill_between(feature_counts, low, high, alpha=0.2)
    counts = torch.tensor(feature_counts, dtype=torch.float64)
    axis.plot(counts, dual_gap[0] * (counts[0] / counts) ** 0.5, "k--", linewidth=0.8, label="$\\propto d_r^{-1/2}$")
    axis.set(xscale="log", yscale="log", xlabel="$d_r$", ylabel="relative error", title="Dual model vs exact softmax attention")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@styled
def rank_bound_figure(result, paper_saturation=None):
    """Fig. 14 (right): mean of min(d, #active ReLUs) against the FFN width d_h."""
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    sizes = result["hidden_sizes"]
    mean, spread = torch.tensor(result["mean_bound"]), torch.tensor(result["std_bound"])
    axis.errorbar(sizes, mean, yerr=spread, marker="o", capsize=3, label="mean upper bound of Rank($W_F$)")
    axis.axhline(result["d"], color="k", linestyle="--", linewidth=0.8, label=f"d = {result['d']}")
    if paper_saturation is not None:
        axis.axvline(paper_saturation, color="gray", linestyle=":", label=f"paper (trained): saturated from $d_h$ = {paper_saturation}")
    axis.set(xlabel="$d_h$ (FFN width)", ylabel="min($d$, active ReLUs)", title="R&L Fig. 14 (right): rank bound of $W_F$")
    integer_ticks(axis)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@styled
def layer_error_figure(errors, title="Theorem B.2: dual pipeline vs direct forward pass"):
    """Max relative error per layer; ``errors`` maps a label (e.g. "float64, L = 6") to a list per layer."""
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    for label, values in errors.items():
        axis.plot(range(1, len(values) + 1), values, marker="o", label=label)
    axis.set(yscale="log", xlabel="layer $l$", ylabel="max relative error, all tokens", title=title)
    integer_ticks(axis)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@styled
def looseness_figure(sizes, radii, ratios, title):
    """log10 of the largest measured lhs / rhs against n, one line per R (ratios[R][n])."""
    figure, axis = plt.subplots(figsize=(6.4, 3.8))
    for R in radii:
        # math.log10: ratios near 1e-70 underflow in float32 tensors
        axis.plot(sizes, [math.log10(r) for r in ratios[R]], marker="o", label=f"R = {R}")
    axis.axhline(0, color="k", linewidth=0.8, linestyle="--", label="bound attained")
    axis.set(xscale="log", xlabel="$n$ (tokens in the document $A$)", ylabel="$\\log_{10}$(max lhs / rhs)", title=title)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    return figure


@styled
def closeness_figure(history, title="GD on x against updates of A"):
    """Losses of both trainings, and how far apart their predictions and induced shifts are;
    legends sit below the panels, off the curves."""
    figure, axes = plt.subplots(1, 2, figsize=(COLUMN, 4.0))
    steps = range(len(history["loss_x"]))
    axes[0].plot(steps, history["loss_x"], label="GD on the weights $x$")
    axes[0].plot(steps, history["loss_A"], label="updates of the document $A$")
    axes[0].set(yscale="log", xlabel="step", ylabel="$L_{\\exp}$", title="training loss")
    axes[1].plot(steps, history["shift_x"], label="$\\|\\tilde b - b\\|$, GD on $x$")
    axes[1].plot(steps, history["shift_A"], label="$\\|\\tilde b - b\\|$, updates of $A$")
    axes[1].plot(steps, history["prediction_distance"], label="$\\|f(A, x_t) - f(A_t, x)\\|$")
    twin = axes[1].twinx()
    twin.plot(steps, history["shift_cosine"], color="gray", linestyle=":", label="cosine of the two shifts")
    twin.set(ylim=(-1.05, 1.05), ylabel="cosine")
    axes[1].set(xlabel="step", ylabel="norm", title="induced shifts of $b$")
    lines = axes[1].get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), fontsize=7)
    axes[1].legend(lines, [line.get_label() for line in lines], loc="upper center", bbox_to_anchor=(0.5, -0.22),
                   fontsize=7)
    for axis in axes:
        axis.grid(True, alpha=0.3)
        integer_ticks(axis)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def bound_figure(results, title="Theorem 3.2: measured gap against the bound"):
    """Per label: every draw's measured gap L(f_hat) - L_hat(f_hat) (dots), its mean, and the bound (line)."""
    figure, axes = plt.subplots(1, 2, figsize=(COLUMN, 4.2))
    for (label, result), colour in zip(results.items(), plt.rcParams["axes.prop_cycle"].by_key()["color"]):
        sizes = result["sample_sizes"]
        for axis, measured, bound, name in ((axes[0], "gap", "gap_bound", "$L(\\hat f) - \\hat L(\\hat f)$"),
                                            (axes[1], "excess", "excess_bound", "$L(\\hat f) - L(f^*)$")):
            for N, values in zip(sizes, result[measured]):
                positive = [v for v in values if v > 0]
                axis.scatter([N] * len(positive), positive, s=4, alpha=0.25, color=colour)
            axis.plot(sizes, [max(v) for v in result[measured]], color=colour, marker="o", label=f"{label}: largest measured")
            axis.plot(sizes, [min(b) for b in result[bound]], color=colour, linestyle="--", label=f"{label}: bound (smallest over draws)")
            axis.set(xscale="log", yscale="log", xlabel="$N$ (demonstrations)", title=name)
    for axis in axes:
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=2, fontsize=7)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0.04 + 0.035 * math.ceil(len(labels) / 2), 1, 1))
    return figure
