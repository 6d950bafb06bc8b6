"""The softmax kernel and its positive random features (Section 3.1, Eq. (7); Choromanski et al., 2020).

Chapters: kernels, theorem_3_1, transformer_layer, stacked_layers, modifications.

The softmax kernel is K_sm(x, y) = exp(x . y). Positive random features

    phi(x) = exp(x @ omega.T - |x|^2 / 2) / sqrt(m),     omega rows ~ N(0, I)

satisfy E[phi(x) . phi(y)] = exp(x . y) (the Gaussian moment E exp(w . z) = exp(|z|^2 / 2) with
z = x + y), so a finite number m of features gives an unbiased estimate of every entry of the
unnormalised attention matrix A_u of Eq. (6).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from icl_lens.device import pick
from icl_lens.validation import as_tensor, check_float_dtype, check_last_dim, check_positive_int, check_rank_at_least


def draw_omega(dim, num_features, *, generator=None, orthogonal=False, dtype=torch.float64, device="cpu"):
    """Projection matrix ``(num_features, dim)`` for positive random features.

    iid rows are N(0, I_dim). With ``orthogonal=True`` the rows come in blocks of ``dim`` mutually
    orthogonal directions, each row rescaled by an independent chi(dim) norm so that every row is still
    marginally N(0, I) (Performer's ORF variant; it lowers the estimator's variance).

    Draws happen on the generator's device and are then moved to ``device``, so one seed gives the same
    ``omega`` on cpu and cuda.
    """
    check_positive_int(dim, "dim")
    check_positive_int(num_features, "num_features")
    check_float_dtype(dtype, "dtype")
    pick(device)   # a device that exists, checked before drawing
    source = generator.device if generator is not None else torch.device("cpu")
    if not orthogonal:
        omega = torch.randn(num_features, dim, generator=generator, dtype=dtype, device=source)
        return omega.to(pick(device))
    blocks = []
    for _ in range(math.ceil(num_features / dim)):
        gaussian = torch.randn(dim, dim, generator=generator, dtype=torch.float64, device=source)
        q, r = torch.linalg.qr(gaussian)
        # fix the sign ambiguity of QR so that q is Haar-distributed
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)
        blocks.append(q.T)
    directions = torch.cat(blocks)[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, dtype=torch.float64, device=source).norm(dim=1)
    return (directions * norms.unsqueeze(1)).to(dtype=dtype, device=pick(device))


def log_positive_random_features(x, omega):
    """log phi(x) = x @ omega.T - |x|^2 / 2 - log(m) / 2, shape ``(..., m)``; never overflows.

    ``omega`` is ``(m, d)``, or ``(..., m, d)`` with leading dimensions that broadcast against x's
    (one omega per model of an ensemble).
    """
    as_tensor(x, "x")
    check_rank_at_least(omega, "omega", 2)
    check_last_dim(x, "x", omega.shape[-1], "the columns of omega")
    if omega.dtype != x.dtype or omega.device != x.device:
        raise ValueError(f"omega ({omega.dtype}, {omega.device}) must match x ({x.dtype}, {x.device})")
    num_features = omega.shape[-2]
    return x @ omega.transpose(-1, -2) - 0.5 * (x * x).sum(-1, keepdim=True) - 0.5 * math.log(num_features)


def positive_random_features(x, omega):
    """phi(x) = exp(x @ omega.T - |x|^2 / 2) / sqrt(m), shape ``(..., m)``.

    Stabilised by forming the whole exponent before exponentiating: x . w - |x|^2 / 2 <= |w|^2 / 2 for
    every x, so the features stay bounded by exp(|w|^2 / 2) however large x is, while exp(x . w) alone
    would overflow. Large |x| can still make features underflow to 0; the attention functions work in
    log space for that reason (see :func:`icl_lens.attention.kernel_attention`).
    """
    log_features = log_positive_random_features(x, omega)
    limit = math.log(torch.finfo(x.dtype).max)
    if log_features.max() > limit:
        raise ValueError(
            f"omega has rows so long that exp(|w|^2/2) overflows {x.dtype}; use float64 or fewer dimensions"
        )
    return torch.exp(log_features)


@dataclass(frozen=True)
class PositiveRandomFeatures:
    """The feature map x -> phi(x) for a fixed ``omega``; callable, with ``log`` for stable attention."""

    omega: torch.Tensor

    @property
    def num_features(self):
        return self.omega.shape[0]

    def __call__(self, x):
        return positive_random_features(x, self.omega.to(dtype=x.dtype, device=x.device))

    def log(self, x):
        return log_positive_random_features(x, self.omega.to(dtype=x.dtype, device=x.device))


def elu_feature_map(x):
    """phi(x) = elu(x) + 1 (Katharopoulos et al., 2020): a deterministic positive map.

    Theorem 3.1 is an identity for any feature map, not only for random features; this one shows it.
    """
    as_tensor(x, "x")
    return F.elu(x) + 1.0


def softmax_kernel(x, y):
    """K_sm(x, y) = exp(x . y) for all pairs of rows: shape ``(..., n_x, n_y)``."""
    as_tensor(x, "x")
    as_tensor(y, "y")
    check_last_dim(y, "y", x.shape[-1], "the last dimension of x")
    return torch.exp(x @ y.transpose(-1, -2))


def feature_product_variance(x, y):
    """Variance of one feature product exp(w.x - |x|^2/2) exp(w.y - |y|^2/2) for w ~ N(0, I).

    E[product^2] = exp(2|x + y|^2 - |x|^2 - |y|^2) and E[product] = exp(x . y); the estimate with m
    features has this variance divided by m.
    """
    as_tensor(x, "x")
    as_tensor(y, "y")
    check_last_dim(y, "y", x.shape[-1], "the last dimension of x")
    second_moment = torch.exp(2 * ((x + y) ** 2).sum(-1) - (x * x).sum(-1) - (y * y).sum(-1))
    return second_moment - torch.exp(2 * (x * y).sum(-1))


def monte_carlo_kernel(x, y, num_draws, *, generator=None, chunk=1_000_000):
    """Estimate exp(x . y) by averaging num_draws feature products with w ~ N(0, I), in chunks.

    Returns ``(mean, standard_error, sample_variance)`` as floats; the check of unbiasedness is that
    ``mean`` lies within a few standard errors of exp(x . y).
    """
    as_tensor(x, "x")
    as_tensor(y, "y")
    if check_positive_int(num_draws, "num_draws") < 2:
        raise ValueError(f"num_draws must be at least 2 for a sample variance, got {num_draws}")
    if x.dim() != 1 or y.shape != x.shape:
        raise ValueError(f"x and y must be vectors of one length, got shapes {tuple(x.shape)} and {tuple(y.shape)}")
    total, total_squares, remaining = 0.0, 0.0, num_draws
    while remaining > 0:
        size = min(chunk, remaining)
        w = draw_omega(x.shape[0], size, generator=generator, dtype=x.dtype, device=x.device)
        products = torch.exp(w @ (x + y) - 0.5 * (x @ x) - 0.5 * (y @ y))
        total += float(products.sum())
        total_squares += float((products**2).sum())
        remaining -= size
    mean = total / num_draws
    variance = (total_squares - num_draws * mean**2) / (num_draws - 1)
    return mean, (variance / num_draws) ** 0.5, variance
