"""Input checks shared by every public function: each error names the argument at fault.

Chapters: none (the other modules check their inputs with it).
"""

import math

import torch


def as_tensor(value, name):
    """Return ``value`` as a floating tensor, refusing non-tensors, integer dtypes and non-finite entries."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor (float32 or float64), got {value.dtype}")
    if not torch.isfinite(value).all():
        raise ValueError(f"{name} contains non-finite values (nan or inf)")
    return value


def check_rank_at_least(value, name, rank):
    if value.dim() < rank:
        raise ValueError(f"{name} must have at least {rank} dimensions, got shape {tuple(value.shape)}")


def check_matrix(value, name, shape=None):
    """A 2-D weight; ``shape`` entries that are ``None`` are free."""
    as_tensor(value, name)
    if value.dim() != 2:
        raise ValueError(f"{name} must be a matrix (2 dimensions), got shape {tuple(value.shape)}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(value.shape, shape)):
            if want is not None and got != want:
                raise ValueError(
                    f"{name} has shape {tuple(value.shape)}, but dimension {axis} must be {want}"
                )
    return value


def check_last_dim(value, name, size, what):
    if value.shape[-1] != size:
        raise ValueError(
            f"{name} has last dimension {value.shape[-1]}, but it must match {what} ({size})"
        )


def check_positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_scheduler(value, name="scheduler"):
    """A Dask scheduler's address, ``tcp://host:port`` (or another of distributed's protocols), or
    None for the local process pool."""
    if value is None:
        return None
    if not isinstance(value, str) or "://" not in value or not value.split("://", 1)[1].strip():
        raise ValueError(f"{name} must be a Dask scheduler address such as tcp://host:8786, got {value!r}")
    return value


def check_positive_float(value, name):
    try:
        if isinstance(value, (bool, str, bytes)):   # float("0.1") would pass a string on
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return number


def check_same_device_and_dtype(named_tensors):
    """All tensors on one device and of one dtype, so the caller never gets a silent cast."""
    (first_name, first), *rest = named_tensors
    for name, tensor in rest:
        if tensor.device != first.device:
            raise ValueError(f"{name} is on {tensor.device} but {first_name} is on {first.device}")
        if tensor.dtype != first.dtype:
            raise ValueError(f"{name} has dtype {tensor.dtype} but {first_name} has {first.dtype}")


def check_finite_number(value, name):
    """A real number (not a bool), finite: a nan or infinite learning rate, ridge or alpha is refused
    here rather than turning every output into nan."""
    try:
        if isinstance(value, (bool, str, bytes)):
            raise TypeError
        number = float(value)   # ints, floats, numpy and one-element torch numbers
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


def check_open_unit(value, name):
    """A probability strictly between 0 and 1 (a confidence parameter delta)."""
    check_finite_number(value, name)
    if not 0 < float(value) < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return value


def check_float_dtype(dtype, name):
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating torch dtype (torch.float32 or torch.float64), got {dtype!r}")
    return dtype


def check_batch_shapes(named_tensors):
    """The batch dimensions (all but the last two) of the named tensors broadcast together."""
    try:
        torch.broadcast_shapes(*(tensor.shape[:-2] for _, tensor in named_tensors))
    except RuntimeError:
        shapes = ", ".join(f"{name} {tuple(tensor.shape)}" for name, tensor in named_tensors)
        raise ValueError(f"the batch dimensions of {shapes} do not match") from None


SEED_LIMIT = 2 ** 32   # numpy's seeds are below it, torch's too


def check_seeds(seeds, name="seeds"):
    """At least one seed, each an integer in [0, 2**32), none twice (a seed given twice would be
    counted twice wherever seeds are pooled)."""
    if not isinstance(seeds, (tuple, list)) or not seeds:
        raise ValueError(f"{name} must be a non-empty tuple of integers, got {seeds!r}")
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
            raise ValueError(f"{name}: {seed!r} is not an integer in [0, 2**32)")
    repeated = sorted({seed for seed in seeds if seeds.count(seed) > 1})
    if repeated:
        raise ValueError(f"{name}: seed(s) {repeated} given more than once (each would be counted twice)")
    return tuple(seeds)
