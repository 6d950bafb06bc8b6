"""The forest plot of every claim (the claims page): each comparative claim's effect in the paper's
direction with its one-sided 95% sign-test bounds, against its no-effect band, grouped by paper,
section and task, coloured by verdict.

Chapters: claims.
"""

import matplotlib.pyplot as plt

from icl_lens.figures.style import COLUMN, styled

VERDICT_COLOURS = {"agrees": "#2ca02c", "disagrees": "#d62728", "inconclusive": "0.45"}
EDGE = 3.0    # effects beyond this (in their unit) are drawn at the edge with an arrow


@styled
def forest_figure(rows, groups):
    """One panel per group of ``groups`` ((title, member test) pairs, as
    :data:`icl_lens.claims_table.GROUPS`) that holds comparative rows: a dot at the effect (the
    median, positive as the paper says), a bar from the lower to the upper bound where the seeds
    give them, the band shaded from -band to +band, and a line at 0. A directional claim agrees
    where the bar lies right of 0 and the dot beyond the band; a "comparable" or "not beyond" claim
    where the bar stays inside the band."""
    panels = [(title, [r for r in rows if belongs(r) and r["p"] is not None and r["effect"] is not None
                       and r["kind"] != "unstable"])      # a count of seeds, drawn in no panel's unit
              for title, belongs in groups]
    panels = [(title, members) for title, members in panels if members]
    heights = [0.22 * len(members) + 0.9 for _, members in panels]
    figure, axes = plt.subplots(len(panels), 1, figsize=(COLUMN, sum(heights)), squeeze=False,
                                gridspec_kw={"height_ratios": heights})
    for axis, (title, members) in zip(axes[:, 0], panels):
        reach = [abs(x) for row in members for x in (row["effect"], row["lower"], row["upper"], row["band"])
                 if x is not None]
        edge = min(EDGE, 1.2 * max(reach))
        for position, row in enumerate(members):
            band = row["band"] or 0.0
            axis.fill_betweenx([position - 0.4, position + 0.4], -band, band, color="0.88", linewidth=0)
            colour = VERDICT_COLOURS[row["verdict"]]
            if row["lower"] is not None:
                low, high = max(row["lower"], -edge), min(row["upper"], edge)
                axis.plot([low, high], [position, position], color=colour, linewidth=1.6)
            effect = max(min(row["effect"], edge), -edge)
            axis.plot(effect, position, "o", color=colour, markersize=4.5)
            if abs(row["effect"]) > edge or (row["upper"] or 0) > edge or (row["lower"] or 0) < -edge:
                side = 1 if row["effect"] > 0 or (row["upper"] or 0) > edge else -1
                axis.annotate("", (side * edge * 1.08, position), (side * edge, position),
                              arrowprops={"arrowstyle": "->", "color": colour})
        axis.axvline(0, color="0.2", linewidth=0.8)
        axis.set_yticks(range(len(members)), [row["id"] for row in members], fontsize=7)
        axis.invert_yaxis()
        axis.set_xlim(-edge * 1.15, edge * 1.15)
        axis.set_title(title, loc="left")
        axis.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("the difference read in the claim's direction (better, faster or worse, as the claim "
                           "says); grey: the no-effect band")
    handles = [plt.Line2D([], [], color=c, marker="o", linewidth=1.6, label=v) for v, c in VERDICT_COLOURS.items()]
    figure.legend(handles=handles, loc="upper right", fontsize=8, ncol=3)
    figure.tight_layout(rect=(0, 0, 1, 1 - 0.3 / sum(heights)))
    return figure
