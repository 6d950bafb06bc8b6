"""Result files: every figure of the book is a PNG beside a JSON of the numbers it plots.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
lipschitz_lemmas, weight_shifting, experiments, across_tasks, closeness_experiment, bert.
"""

import json
import os
from pathlib import Path

import torch


def results_dir(chapter, root=None):
    """``<repository>/results/<chapter>``, created if needed.

    The repository root is found from the working directory upward (the folder holding ``_toc.yml``),
    so a chapter run from ``book/`` or from the root writes to the same place. ``ICL_LENS_RESULTS``
    overrides the parent folder.
    """
    if root is None and os.environ.get("ICL_LENS_RESULTS"):
        root = Path(os.environ["ICL_LENS_RESULTS"])
    if root is None:
        root = repository_root() / "results"
    folder = Path(root) / chapter
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def repository_root():
    """The folder holding ``_toc.yml``, searched from the working directory upward (else the working
    directory): chapters run from ``book/`` and from the root agree on it."""
    here = Path.cwd().resolve()
    return next((p for p in (here, *here.parents) if (p / "_toc.yml").exists()), here)


def to_plain(value):
    """Tensors and tuples to lists and floats, so ``json`` can write them."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def save_result(folder, name, data, figure=None, dpi=160):
    """Write ``name.json`` (sorted keys, so the same numbers give the same bytes) and ``name.png``.

    Returns the paths written. The figure is closed, so a notebook shows it once, from the file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": folder / f"{name}.json"}
    paths["json"].write_text(json.dumps(to_plain(data), sort_keys=True, indent=1) + "\n")
    if figure is not None:
        import matplotlib.pyplot as plt

        paths["png"] = folder / f"{name}.png"
        figure.savefig(paths["png"], dpi=dpi, bbox_inches="tight", metadata={"Software": None})
        plt.close(figure)
    return paths


def load_result(folder, name):
    return json.loads((Path(folder) / f"{name}.json").read_text())
