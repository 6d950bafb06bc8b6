"""Where tensors live: ``pick("auto")`` gives cuda when a GPU is present, else cpu.

Chapters: appendix_f, kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
modifications, softmax_regression, lipschitz_lemmas, weight_shifting, closeness_experiment.
"""

import torch


def pick(device="auto", name="device"):
    """Return a :class:`torch.device`. ``"auto"`` (or None) means cuda if available, otherwise cpu.

    Any other value (``"cpu"``, ``"cuda"``, ``"cuda:0"``, a ``torch.device``) is checked first: it
    must name a cpu or cuda device that exists here, so that a typo or a missing GPU is a clear
    error naming ``name`` and not a crash later (or, for ``"meta"``, a run that computes nothing).
    """
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, torch.device):
        chosen = device
    elif isinstance(device, str):
        try:
            chosen = torch.device(device)
        except RuntimeError:
            raise ValueError(f"{name}={device!r} is not a device: use cpu, cuda, cuda:N or auto") from None
    else:
        raise TypeError(f"{name} must be a device name such as 'cpu' or a torch.device, got {type(device).__name__}")
    if chosen.type not in ("cpu", "cuda"):
        raise ValueError(f"{name}={device!r}: icl_lens runs on cpu or cuda, not {chosen.type}")
    if chosen.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{name}={device!r} was asked for, but torch sees no CUDA device")
    if chosen.type == "cuda" and chosen.index is not None and chosen.index >= torch.cuda.device_count():
        raise ValueError(f"{name}={device!r}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    return chosen


def generator(seed, device="cpu"):
    """A seeded :class:`torch.Generator` on ``device``: every random draw in icl_lens takes one explicitly."""
    made = torch.Generator(device=pick(device))
    made.manual_seed(int(seed))
    return made
