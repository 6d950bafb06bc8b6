"""Where tensors live: ``pick("auto")`` gives cuda when a GPU is present, else cpu.

Chapters: appendix_f, kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
modifications, softmax_regression, lipschitz_lemmas, weight_shifting, closeness_experiment.
"""

import torch


def pick(device="auto"):
    """Return a :class:`torch.device`. ``"auto"`` means cuda if available, otherwise cpu.

    Any other value (``"cpu"``, ``"cuda:0"``, a ``torch.device``) is passed through, after checking
    that a requested cuda device exists, so that a missing GPU is a clear error and not a crash later.
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    chosen = torch.device(device)
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} was asked for, but torch sees no CUDA device")
    return chosen


def generator(seed, device="cpu"):
    """A seeded :class:`torch.Generator` on ``device``: every random draw in icl_lens takes one explicitly."""
    made = torch.Generator(device=pick(device))
    made.manual_seed(int(seed))
    return made
