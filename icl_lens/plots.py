"""The book's figures. Each function takes numbers (as computed elsewhere) and returns a figure."""

import functools
import math

import matplotlib.pyplot as plt
import torch
from matplotlib.ticker import MaxNLocator

from icl_lens import claims, closeness, experiments, multitask

COLUMN = 8.0   # inches: the book's text column shows a figure this wide at about 100 px an inch
# fonts sized for that column: 9 pt on an 8-inch figure reads as about 12 px on the page
STYLE = {"font.size": 9, "axes.titlesize": 9.5, "axes.labelsize": 9, "legend.fontsize": 7.5,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "figure.titlesize": 10}
DPI = 160   # saved figures: sharp when the browser scales them to the column


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


def _as_numpy(value):
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value


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
    exact, estimate = _as_numpy(exact), _as_numpy(estimate)
    exact_output, estimate_output = _as_numpy(exact_output), _as_numpy(estimate_output)
    figure, axes = plt.subplots(2, 3, figsize=(COLUMN, 5.6))
    rows = (("attention", exact, estimate, "viridis", "key token", "query token"),
            ("output", exact_output, estimate_output, "coolwarm", "output dimension", "token"))
    for row, (part, truth, guess, colours, xlabel, ylabel) in zip(axes, rows):
        low, high = min(truth.min(), guess.min()), max(truth.max(), guess.max())
        for axis, matrix, name in zip(row[:2], (truth, guess), ("exact softmax", f"$d_r$ = {num_features}")):
            image = axis.imshow(matrix, vmin=low, vmax=high, cmap=colours)
            axis.set(title=f"{part}: {name}", xlabel=xlabel, ylabel=ylabel)
            integer_ticks(axis, "x")
            integer_ticks(axis, "y")
        figure.colorbar(image, ax=row[:2], shrink=0.85)
        difference = guess - truth
        bound = abs(difference).max()
        image = row[2].imshow(difference, vmin=-bound, vmax=bound, cmap="PiYG")
        row[2].set(title=f"{part}: estimate - exact", xlabel=xlabel)
        integer_ticks(row[2], "x")
        integer_ticks(row[2], "y")
        figure.colorbar(image, ax=row[2], shrink=0.85)
    return figure


@styled
def sgd_error_figure(curves, title="Fig. 3 (left): dual model trained one demonstration at a time",
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
    for label, errors in curves.items():
        values = torch.as_tensor(errors, dtype=torch.float64).clamp(min=1e-35)
        axis.plot(range(len(values)), values, marker=".", label=label)
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
    axis.set(xlabel="$d_h$ (FFN width)", ylabel="min($d$, active ReLUs)", title="Fig. 14 (right): rank bound of $W_F$")
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


BASELINES = {   # key in a record's baselines: (legend label, line style)
    "context_mean": ("context mean (uniform attention)", ":"),
    "nadaraya_watson": ("Nadaraya-Watson (softmax on raw inputs)", "-."),
    "least_squares": ("least squares on the prompt", (0, (5, 2, 1, 2))),
    "log_least_squares": ("least squares on log s", (0, (1, 1))),
}
FLOOR = 1e-3   # normalised losses below this (an exact in-context fit) are drawn at the floor


def _median_band(axis, epochs, losses, **style):
    """Median over seeds (line) and interquartile range (band) of a (seeds, points) tensor."""
    finite = losses.nan_to_num(nan=math.inf)
    median = finite.median(0).values
    line, = axis.plot(epochs, median.clamp(min=FLOOR), **style)
    if losses.shape[0] > 2:
        low, high = torch.quantile(finite, 0.25, dim=0), torch.quantile(finite, 0.75, dim=0)
        axis.fill_between(epochs, low.clamp(min=FLOOR), high.clamp(min=FLOOR, max=1e3), color=line.get_color(),
                          alpha=0.15, linewidth=0)
    return median


def _partner_curves(result, group, seed=None):
    """The normal model's curves at the learning rate of ``group`` (its lr-matched control)."""
    lr = next(m["lr"] for m in result["models"] if m["group"] == group)
    name = next(m["name"] for m in result["models"] if m["group"] == "normal" and m["lr"] == lr)
    return experiments.curves(result, "normal", seed)[name]


def _test_panel(axis, result, named_curves, normal, *, legend=True):
    """Normalised test loss (test MSE / label variance) at the checkpoints: median over seeds and
    interquartile band of each variant, the normal model dashed, the baselines as horizontal lines
    (median over seeds), the decay of the learning rate shaded; 1 is predicting the mean."""
    epochs = result["checkpoint_epochs"]
    medians = [_median_band(axis, epochs, normal, color="black", linestyle="--", linewidth=1.4,
                            label="normal (same lr)")]
    for name, losses in named_curves.items():
        medians.append(_median_band(axis, epochs, losses, label=name))
    axis.axhline(1.0, color="grey", linewidth=1.0, label="predict the mean")
    config = result["config"]
    if config.get("schedule") == "decay":
        axis.axvspan(config["epochs"] * (1 - config["decay_fraction"]), config["epochs"], color="grey", alpha=0.12,
                     linewidth=0, label="learning rate decays")
    for key, values in experiments.normalised_baselines(result).items():
        label, style = BASELINES[key]
        value = float(values.median())
        axis.axhline(max(value, FLOOR), color="grey", linestyle=style, linewidth=1.0,
                     label=label + (" (exact: 0)" if value < FLOOR else ""))
    finite = torch.cat([m[torch.isfinite(m)] for m in medians])
    low = max(FLOOR, 0.5 * float(finite.min())) if finite.numel() else FLOOR
    axis.set_ylim(low * 0.8, max(2.0, 1.5 * float(finite.max())) if finite.numel() else 2.0)
    axis.set(yscale="log", xlabel="epoch (16384 tokens)", ylabel="test MSE / label variance")
    integer_ticks(axis)
    axis.grid(True, which="both", alpha=0.3)
    if legend:
        # below the panel: the curves it would hide are the point of the figure
        axis.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)


@styled
def experiment_figure(result, groups, *, title, seed=None, equivalence=True):
    """The equivalence curve (Fig. 3, left), then one test-loss panel per group (normal model dashed
    in each, baselines as horizontal lines), two a row; ``seed=None`` pools the seeds."""
    count = len(groups) + int(equivalence)
    rows = math.ceil(count / 2)
    figure, axes = plt.subplots(rows, 2, figsize=(COLUMN, 5.2 * rows), squeeze=False)
    axes = list(axes.ravel())
    for unused in axes[count:]:
        unused.set_visible(False)
    if equivalence:
        shown = result["equivalence"] if seed is None else {str(seed): result["equivalence"][str(seed)]}
        sgd_error_panel(axes.pop(0), {f"seed {s}": curve["squared_error"] for s, curve in shown.items()},
                        title="equivalence (Theorem 3.1)", ylabel="$\\|f(x) - h'\\|^2$", fontsize=7)
    for axis, group in zip(axes, groups):
        _test_panel(axis, result, experiments.curves(result, group, seed), _partner_curves(result, group, seed))
        axis.set_title(group)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def seeds_figure(result, groups, seeds, *, title):
    """Fig. 10: one row per seed, one test-loss panel per group."""
    figure, axes = plt.subplots(len(seeds), len(groups), figsize=(COLUMN, 2.6 * len(seeds) + 1.8), squeeze=False)
    for row, seed in zip(axes, seeds):
        for axis, group in zip(row, groups):
            _test_panel(axis, result, experiments.curves(result, group, seed), _partner_curves(result, group, seed),
                        legend=seed == seeds[0])
            axis.set_title(f"{group}, seed {seed}")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def combinations_figure(results, *, title="Fig. 13: combinations of modifications"):
    """One test-loss panel per task: the combinations against the normal model and the baselines."""
    figure, axes = plt.subplots(len(results), 1, figsize=(COLUMN, 4.6 * len(results)), squeeze=False)
    for axis, (task, result) in zip(axes[:, 0], results.items()):
        _test_panel(axis, result, experiments.curves(result, "combination"), _partner_curves(result, "combination"))
        axis.set_title(task)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def variants_figure(result, group, names, *, title):
    """Test curves of the chosen variants of one group against the normal model (an explorer frame)."""
    figure, axis = plt.subplots(figsize=(6.4, 5.0))
    chosen = {name: losses for name, losses in experiments.curves(result, group).items() if name in names}
    _test_panel(axis, result, chosen, _partner_curves(result, group))
    axis.set_title(title)
    figure.tight_layout()
    return figure


OFF_SCALE = 3.0   # paired differences beyond this (diverging runs) are drawn at the edge with an arrow


@styled
def paired_figure(results, *, title):
    """Per task, every variant's median paired difference to the normal model (normalised test
    loss, variant - normal) with its bootstrap 95% interval; each row's no-effect band (a share of
    the normal model's loss) is shaded. ``results`` maps a task to rows of
    :func:`icl_lens.claims.variant_rows`."""
    heights = [max(2.5, 0.24 * len(rows) + 1.0) for rows in results.values()]
    figure, axes = plt.subplots(len(results), 1, figsize=(COLUMN, sum(heights)), squeeze=False,
                                gridspec_kw={"height_ratios": heights})
    for axis, (task, rows) in zip(axes[:, 0], results.items()):
        bands = [r["no_effect"] for r in rows if r["no_effect"]]
        for position, row in enumerate(rows):
            median, (low, high), band = row["median_difference"], row["interval"], row["no_effect"] or 0.0
            axis.fill_betweenx([position - 0.4, position + 0.4], -band, band, color="grey", alpha=0.25, linewidth=0)
            if median is None or low is None or high is None:
                axis.text(OFF_SCALE, position, "diverged", fontsize=7, va="center", ha="right", color="red")
                continue
            no_effect = claims.inside_band(row)
            color = "tab:grey" if no_effect else ("tab:green" if high < 0 else ("tab:red" if low > 0 else "tab:grey"))
            shown = [min(x, OFF_SCALE) for x in (low, median, high)]
            axis.errorbar(shown[1], position, xerr=[[shown[1] - shown[0]], [shown[2] - shown[1]]], fmt="o",
                          color=color, markersize=4, capsize=2)
            if high > OFF_SCALE:
                axis.annotate("", (OFF_SCALE * 1.6, position), (OFF_SCALE, position),
                              arrowprops={"arrowstyle": "->", "color": color})
        axis.axvline(0, color="black", linewidth=0.8)
        axis.set_yticks(range(len(rows)), [r["name"] for r in rows], fontsize=7)
        axis.invert_yaxis()
        linear_up_to = min(bands) if bands else 1e-3
        axis.set_xscale("symlog", linthresh=linear_up_to)
        axis.set_xlim(-1.2, OFF_SCALE * 2)
        # powers of ten outside the linear part only: inside it their labels would overlap
        powers = [10.0 ** k for k in range(-6, 1) if 10.0 ** k >= linear_up_to]
        axis.set_xticks(sorted([0.0, *powers, *(-x for x in powers)]))
        axis.set(xlabel="variant - normal (test MSE / label variance)", title=task)
        axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def convergence_figure(studies):
    """Per task, each seed's normal model: normalised test loss against the epochs of a long run
    (line; its last fifth decays) and at the end of each shorter run copied off it (dots, where the
    step size has decayed to 0), the saved run's epoch count marked."""
    figure, axes = plt.subplots(len(studies), 1, figsize=(COLUMN, 3.0 * len(studies)), squeeze=False)
    kinds = [kind for kind in experiments.EXPERIMENTS if kind in studies]   # JSON sorts its keys
    for axis, (kind, study) in zip(axes[:, 0], ((k, studies[k]) for k in kinds)):
        record = study["record"]
        curves = experiments.curves(record, "normal")["normal"]
        normal = [m for m in record["models"] if m["group"] == "normal"]
        for seed, losses, model in zip(record["config"]["seeds"], curves, normal):
            line, = axis.plot(record["checkpoint_epochs"], losses.clamp(min=FLOOR), linewidth=1.0, alpha=0.7,
                              label=f"seed {seed}")
            ends = [experiments.normalised_loss(record, model, length / len(record["epochs"]))
                    for length in record["run_lengths"]]
            axis.plot(record["run_lengths"], [max(x, FLOOR) for x in ends], "o", color=line.get_color(),
                      markersize=5)
        axis.axvline(study["saved_run_epochs"], color="black", linestyle=":", label="saved run ends")
        axis.axhline(1.0, color="grey", linewidth=1.0)
        axis.set(yscale="log", xlabel="epoch (16384 tokens)", ylabel="test MSE / label variance",
                 title=f"{kind}: normal model, long run")
        integer_ticks(axis)
        axis.grid(True, which="both", alpha=0.3)
    # the colours are the seeds on every panel: one legend, where the top panel has room
    axes[0, 0].legend(fontsize=7, loc="lower left", ncol=3)
    figure.tight_layout()
    return figure


BASELINE_STYLES = {"zero": ":", "context mean": "-.", "one GD step (lr*)": "--", "least squares": (0, (1, 3))}


def _steps_panel(axis, entry, key, *, scale, label, colour):
    """Median and interquartile band over seeds of one recorded measure against training steps."""
    runs = entry["runs"]
    steps = runs[0]["steps"]
    values = torch.tensor([[math.nan if x is None else x / scale for x in r[key]] for r in runs],
                          dtype=torch.float64)
    _median_band(axis, steps, values, color=colour, label=label)


@styled
def multitask_figure(record, *, title):
    """Across tasks: (a) von Oswald's setting, test loss and Model Cos against steps; (b) the paper's
    task drawn per prompt, every layer's test loss; (c) loss against the number of demonstrations;
    (d) the paper's own optimiser. Losses are divided by the label variance; lines are baselines."""
    figure, axes = plt.subplots(2, 2, figsize=(COLUMN, 7.0))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    settings = record["settings"]
    panels = (("(a) von Oswald et al.'s setting (d = 10, N = 10)", ["von Oswald (linear attention)"]),
              ("(b) the paper's linear task, a new $w$ per prompt",
               [n for n in settings if n.startswith("paper task (") and "SGD" not in n]),
              (None, None),
              ("(d) SGD at lr 0.003, one prompt a step", ["paper task (paper's SGD)"]))
    for axis, (panel_title, names) in zip(axes.flat, panels):
        if names is None:
            continue
        for name, colour in zip(names, colours):
            entry = settings[name]
            _steps_panel(axis, entry, "loss", scale=entry["label_variance"], label=name.split("(")[-1].rstrip(")"),
                         colour=colour)
        entry = settings[names[0]]
        for baseline, style in BASELINE_STYLES.items():
            level = float(torch.tensor([r["baselines"][baseline] for r in entry["runs"]]).median())
            axis.axhline(level / entry["label_variance"], color="0.35", linestyle=style, linewidth=1, label=baseline)
        axis.set(title=panel_title, xlabel="training step", ylabel="test loss / label variance", ylim=(-0.03, 1.25))
        integer_ticks(axis)
        axis.legend(fontsize=7, loc="lower right", ncol=2)
    axis = axes[1, 0]
    curves = [r["demos_curve"] for n in panels[1][1] for r in settings[n]["runs"] if "demos_curve" in r]
    scale = settings["paper task (linear)"]["label_variance"]
    counts = sorted(int(n) for n in curves[0])
    for name, colour in zip(panels[1][1], colours):
        runs = [r for r in settings[name]["runs"] if "demos_curve" in r]
        if runs:
            values = torch.tensor([[r["demos_curve"][str(n)]["trained layer"] / scale for n in counts] for r in runs])
            _median_band(axis, counts, values, color=colour, label=name.split("(")[-1].rstrip(")"))
    for baseline, style in BASELINE_STYLES.items():
        values = torch.tensor([[c[str(n)][baseline] / scale for n in counts] for c in curves])
        axis.plot(counts, values.median(0).values.tolist(), color="0.35", linestyle=style, linewidth=1, label=baseline)
    axis.axvline(settings["paper task (linear)"]["distribution"]["num_demos"], color="0.7", linewidth=0.8)
    axis.set(title="(c) against N (layers trained at N = 15)", xlabel="demonstrations N",
             ylabel="test loss / label variance", ylim=(-0.03, 1.6))
    integer_ticks(axis)
    axis.legend(fontsize=7, loc="upper right")
    figure.suptitle(title)
    figure.tight_layout()
    return figure


CLOSENESS_MEASURES = (("loss", "test loss / label variance"), ("preds_diff", "Preds Diff"),
                      ("model_diff", "Model Diff"), ("model_cos", "Model Cos"))


@styled
def softmax_layer_figure(record, *, title):
    """Li et al.'s panels, rebuilt: for each document length, the trained layers' test loss and
    the three measures against GD* over training (median and quartiles over seeds), with the
    baselines as lines; below, the final test loss against d."""
    lengths = list(closeness.in_numeric_order(record["lengths"]))
    figure = plt.figure(figsize=(COLUMN, 2.6 * (2 * len(lengths) + 1)))
    grid = figure.add_gridspec(2 * len(lengths) + 1, 2)
    colours = dict(zip(("softmax", "linear"), plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for row, n in enumerate(lengths):
        for place, (key, label) in enumerate(CLOSENESS_MEASURES):
            axis = figure.add_subplot(grid[2 * row + place // 2, place % 2])
            for attention, runs in record["lengths"][n].items():
                scales = [r["label_variance"] if key == "loss" else 1.0 for r in runs]
                values = torch.tensor([[math.nan if x is None else x / s for x in r[key]]
                                       for r, s in zip(runs, scales)], dtype=torch.float64)
                if key == "model_cos":   # a cosine may be negative: no floor
                    low, mid, high = torch.quantile(values, torch.tensor([0.25, 0.5, 0.75], dtype=torch.float64), dim=0)
                    line, = axis.plot(runs[0]["steps"], mid, color=colours[attention], label=f"{attention} layer")
                    axis.fill_between(runs[0]["steps"], low, high, color=line.get_color(), alpha=0.15, linewidth=0)
                    axis.set_ylim(-0.05, 1.05)
                else:
                    _median_band(axis, runs[0]["steps"], values, color=colours[attention], label=f"{attention} layer")
            if key == "loss":
                runs = next(iter(record["lengths"][n].values()))
                for name, style in (("one GD step (lr*)", "--"), ("linearised GD step", "-."), ("zero", ":")):
                    level = float(torch.tensor([r["baselines"][name] / r["label_variance"] for r in runs]).median())
                    axis.axhline(level, color="0.35", linestyle=style, linewidth=1, label=name)
                axis.set_ylim(0, 1.2)
            axis.set(title=f"$n$ = {n}: {label}", xlabel="training step")
            integer_ticks(axis)
            if place == 0:
                axis.legend(fontsize=6.5)
    axis = figure.add_subplot(grid[2 * len(lengths), :])
    dims = list(closeness.in_numeric_order(record["dims"]))
    for attention in layer_names(record):
        values = torch.tensor([[multitask.final(r, "loss") / r["label_variance"] for r in record["dims"][d][attention]]
                               for d in dims], dtype=torch.float64).T
        _median_band(axis, [int(d) for d in dims], values, color=colours[attention], label=f"{attention} layer",
                     marker="o")
    gd = torch.tensor([[r["baselines"]["one GD step (lr*)"] / r["label_variance"]
                        for r in record["dims"][d]["softmax"]] for d in dims], dtype=torch.float64).T
    linear = torch.tensor([[r["baselines"]["linearised GD step"] / r["label_variance"]
                            for r in record["dims"][d]["softmax"]] for d in dims], dtype=torch.float64).T
    _median_band(axis, [int(d) for d in dims], linear, color="0.6", linestyle="-.", label="linearised GD step",
                 marker="^")
    _median_band(axis, [int(d) for d in dims], gd, color="0.35", linestyle="--", label="one GD step (lr*)", marker="s")
    axis.set(title=f"final test loss against $d$ ($n$ = {record['study']['lengths'][0]})", xlabel="$d$",
             ylabel="test loss / label variance",
             ylim=(0, 1.2))
    axis.set_xticks([int(d) for d in dims], [d for d in dims])
    axis.legend(fontsize=7)
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 0.98))   # room for the title
    return figure


def layer_names(record):
    """The layers a closeness record holds, in the order they were run."""
    return list(next(iter(record["dims"].values())))


@styled
def seed_runs_figure(runs, scales, baselines, *, title):
    """One setting, every seed (an explorer frame): test loss divided by ``scales[i]`` (left) and
    Model Cos against one GD step (right) over training; ``baselines`` maps a name to the key in
    each run's ``baselines`` drawn as a dotted level (median over seeds)."""
    figure, axes = plt.subplots(1, 2, figsize=(COLUMN, 3.2))
    for index, (run, scale) in enumerate(zip(runs, scales)):
        seed = run.get("config", {}).get("seed", index)   # closeness runs are stored in seed order
        line, = axes[0].plot(run["steps"], [math.nan if x is None else x / scale for x in run["loss"]],
                             linewidth=1, label=f"seed {seed}")
        axes[1].plot(run["steps"], [math.nan if x is None else x for x in run["model_cos"]], linewidth=1,
                     color=line.get_color())
    for (name, key), style in zip(baselines.items(), (":", "--", "-.", (0, (1, 3)))):
        level = float(torch.tensor([r["baselines"][key] / s for r, s in zip(runs, scales)]).median())
        axes[0].axhline(level, color="0.35", linestyle=style, linewidth=1, label=name)
    axes[0].set(xlabel="training step", ylabel="test loss / label variance", ylim=(0, 1.3), title="test loss")
    axes[1].set(xlabel="training step", ylabel="Model Cos", ylim=(-0.05, 1.05), title="Model Cos against GD*")
    axes[0].legend(fontsize=6.5, ncol=2, loc="upper right")
    for axis in axes:
        integer_ticks(axis)
        axis.grid(True, alpha=0.3)
    figure.suptitle(title)
    figure.tight_layout()
    return figure


@styled
def table1_figure(record, *, title):
    """Table 1 offline: (a) every setting's validation metric, one dot a seed, the median as a bar,
    with the baselines; (b) each setting minus the normal model of its seed, the median and its
    bootstrap 95% interval; (c) the normal model's validation metric after each epoch, trained for
    the study's epochs and for longer (the convergence check)."""
    figure = plt.figure(figsize=(COLUMN, 7.2))
    grid = figure.add_gridspec(2, 2, height_ratios=(1.25, 1))
    top = figure.add_subplot(grid[0, :])
    study, metric, summary = record["study"], record["metric"], record["summary"]
    settings = study["settings"]
    positions = range(len(settings))
    for x, setting in zip(positions, settings):
        values = [run["validation"][-1][metric] for run in record["runs"]
                  if run["setting"] == setting and run["epochs"] == study["epochs"]]
        top.scatter([x] * len(values), values, s=12, color="C0", alpha=0.6, zorder=3)
        top.hlines(summary["settings"][setting]["median"], x - 0.3, x + 0.3, color="C0", linewidth=2)
    for (name, level), style in zip(record["baselines"].items(), (":", "--")):
        top.axhline(level, color="0.35", linestyle=style, linewidth=1, label=name)
    top.axhline(summary["settings"]["normal"]["median"], color="C1", linewidth=1, label="normal model (median)")
    top.set_xticks(list(positions), settings, rotation=30, ha="right")
    epochs = f"{study['epochs']} epoch{'s' if study['epochs'] > 1 else ''}"
    top.set(ylabel=f"validation {metric}", title=f"(a) each setting after {epochs} (dots: seeds)")
    low, high = top.get_ylim()
    top.set_ylim(low, high + 0.25 * (high - low))   # room for the legend above the dots
    top.legend(loc="upper left", ncol=3)
    axis = figure.add_subplot(grid[1, 0])
    shown = [s for s in settings if s != "normal"]
    labelled = set()
    for y, setting in enumerate(shown):
        entry = summary["settings"][setting]
        comparison = entry["against_normal"]
        axis.scatter(comparison["differences"], [y] * len(comparison["differences"]), s=10, color="0.6", zorder=2)
        lengths = [(entry, 0.0, "C0", f"{study['epochs']} epochs")]
        if "longer" in entry:   # the same comparison after the longer run, just below
            lengths.append((entry["longer"], 0.3, "C2", f"{study['longer_epochs']} epochs"))
        for measured, shift, colour, label in lengths:
            low, high = measured["against_normal"]["interval"]
            axis.hlines(y + shift, low, high, color=colour, linewidth=2, zorder=3)
            axis.plot(measured["against_normal"]["median"], y + shift, "o", color=colour, zorder=4,
                      label=None if label in labelled else label)
            labelled.add(label)
    axis.axvline(0, color="0.2", linewidth=0.8)
    axis.axvspan(-0.01, 0.01, color="0.9", zorder=0)
    axis.set_yticks(range(len(shown)), shown)
    axis.invert_yaxis()
    axis.set(xlabel=f"{metric} - normal model's (same seed)", title="(b) against the normal model")
    axis.legend(loc="lower right")
    axis = figure.add_subplot(grid[1, 1])
    for epochs, colour in ((study["epochs"], "C1"), (study["longer_epochs"], "C2")):
        curves = [[v[metric] for v in run["validation"]] for run in record["runs"]
                  if run["setting"] == "normal" and run["epochs"] == epochs]
        for i, curve in enumerate(curves):
            axis.plot(range(1, epochs + 1), curve, color=colour, linewidth=1, alpha=0.7,
                      label=f"trained {epochs} epoch{'s' if epochs > 1 else ''}" if i == 0 else None)
    axis.set(xlabel="epoch", ylabel=f"validation {metric}", title="(c) the normal model, each seed")
    integer_ticks(axis)
    axis.legend(loc="lower right")
    figure.suptitle(title)
    figure.tight_layout()
    return figure
