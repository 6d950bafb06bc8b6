"""The figure of the offline Table 1 study (R&L Table 1 on the WordNet stand-in).

Chapters: bert.
"""

import matplotlib.pyplot as plt
from icl_lens.figures.style import COLUMN, integer_ticks, styled
from icl_lens.studies.table1 import NO_EFFECT


@styled
def table1_figure(record, *, title):
    """Table 1 offline: (a) every setting's validation metric, one dot a seed, the median as a bar,
    with the baselines; (b) each setting minus the normal model of its seed, the median and its
    95% sign-test interval (from 6 seeds); (c) the normal model's validation metric after each epoch, trained for
    the study's epochs and for longer (the convergence checks)."""
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
            if low is not None:     # a 95% sign-test interval exists from 6 seeds
                axis.hlines(y + shift, low, high, color=colour, linewidth=2, zorder=3)
            axis.plot(measured["against_normal"]["median"], y + shift, "o", color=colour, zorder=4,
                      label=None if label in labelled else label)
            labelled.add(label)
    axis.axvline(0, color="0.2", linewidth=0.8)
    axis.axvspan(-NO_EFFECT, NO_EFFECT, color="0.9", zorder=0)   # the study's no-effect band
    axis.set_yticks(range(len(shown)), shown)
    axis.invert_yaxis()
    axis.set(xlabel=f"{metric} - normal model's (same seed)", title="(b) against the normal model")
    axis.legend(loc="lower right")
    axis = figure.add_subplot(grid[1, 1])
    lengths = (study["epochs"], study["longer_epochs"], study.get("check_epochs"))
    for epochs, colour in zip([e for e in lengths if e], ("C1", "C2", "C4")):
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
