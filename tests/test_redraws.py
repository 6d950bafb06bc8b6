"""Redraws are identical: a figure drawn from a record read back from JSON (keys sorted) is the
picture drawn from the same record in another key order (training inserts keys in its own order),
and ``reproduce fig3 fig13 --reuse`` over the committed task records gives the committed PNGs,
compared as decoded pixels."""

import io
import json
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from PIL import Image  # noqa: E402

from icl_lens.__main__ import main  # noqa: E402
from icl_lens.figures import section5 as figures  # noqa: E402
from icl_lens.reproduce import PANELS  # noqa: E402

SAVED = Path(__file__).resolve().parents[1] / "book" / "data" / "experiments"
needs_saved = pytest.mark.skipif(not (SAVED / "task_linear.json").exists(), reason="no saved full run")


def pixels(figure_or_path):
    if isinstance(figure_or_path, Path):
        return np.asarray(Image.open(figure_or_path))
    buffer = io.BytesIO()
    figure_or_path.savefig(buffer, format="png", dpi=60)
    matplotlib.pyplot.close(figure_or_path)
    return np.asarray(Image.open(buffer))


def reversed_keys(value):
    """The same record with every dict's keys in reverse order (lists kept): another insertion order."""
    if isinstance(value, dict):
        return {key: reversed_keys(value[key]) for key in reversed(list(value))}
    if isinstance(value, list):
        return [reversed_keys(v) for v in value]
    return value


def read(name):
    return json.loads((SAVED / f"{name}.json").read_text())


@needs_saved
def test_the_legend_order_does_not_follow_the_key_order():
    linear = read("task_linear")
    assert list(linear["baselines"]["0"]) != list(reversed_keys(linear)["baselines"]["0"])
    drawings = [
        lambda r: figures.experiment_figure(r, PANELS, title="fig3"),
        lambda r: figures.seeds_figure(r, PANELS, r["config"]["seeds"][:2], title="fig10"),
    ]
    for draw in drawings:
        assert np.array_equal(pixels(draw(linear)), pixels(draw(reversed_keys(linear))))
    tasks = {kind: read(f"task_{kind}") for kind in ("linear", "trigonometric", "exponential")}
    assert np.array_equal(pixels(figures.combinations_figure(tasks)),
                          pixels(figures.combinations_figure(reversed_keys(tasks))))
    context = read("context_use")
    assert np.array_equal(pixels(figures.context_use_figure(context)),
                          pixels(figures.context_use_figure(reversed_keys(context))))


@needs_saved
def test_a_redraw_from_the_saved_records_gives_the_committed_figures(tmp_path, capsys):
    for kind in ("linear", "trigonometric", "exponential"):
        shutil.copy(SAVED / f"task_{kind}.json", tmp_path)
    main(["reproduce", "fig3", "fig13", "--reuse", "--out", str(tmp_path)])
    for name in ("fig3", "fig13"):
        assert np.array_equal(pixels(tmp_path / f"{name}.png"), pixels(SAVED / f"{name}.png")), name
        assert (tmp_path / f"{name}.json").read_bytes() == (SAVED / f"{name}.json").read_bytes()


@needs_saved
def test_fig10_shows_the_first_seeds_by_number(monkeypatch):
    """R&L Fig. 10 draws one row a seed: past FIG10_ROWS it shows the first trained seeds by number
    (fixed before training) and says how many there are, instead of a page-long figure."""
    from icl_lens import reproduce

    linear = read("task_linear")
    seeds = linear["config"]["seeds"]
    saved = []

    class Run:
        def task(self, kind):
            return linear

        def save(self, *args):
            saved.append(args)

    monkeypatch.setattr(reproduce, "FIG10_ROWS", 3)
    reproduce.seeds_figure(Run())
    figure = saved[0][-1]
    titles = [axis.get_title() for axis in figure.axes if axis.get_title()]
    assert titles == [f"{group}, seed {seed}" for seed in seeds[:3] for group in PANELS]
    assert f"seeds {seeds[0]}-{seeds[2]} of {len(seeds)}, one a row" in figure._suptitle.get_text()
    matplotlib.pyplot.close(figure)
    monkeypatch.setattr(reproduce, "FIG10_ROWS", len(seeds))     # all of them fit: as before
    reproduce.seeds_figure(Run())
    assert saved[1][-1]._suptitle.get_text().endswith("one seed a row")
    matplotlib.pyplot.close(saved[1][-1])
