import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import kernels
from icl_lens.device import generator


def test_draw_omega_shape_dtype_and_seed(rng):
    omega = kernels.draw_omega(5, 7, generator=generator(0))
    assert omega.shape == (7, 5) and omega.dtype == torch.float64
    assert torch.equal(omega, kernels.draw_omega(5, 7, generator=generator(0)))
    assert not torch.equal(omega, kernels.draw_omega(5, 7, generator=generator(1)))
    assert kernels.draw_omega(5, 7, generator=rng, dtype=torch.float32).dtype == torch.float32


def test_orthogonal_omega_rows_are_orthogonal_within_blocks():
    omega = kernels.draw_omega(4, 10, generator=generator(0), orthogonal=True)
    assert omega.shape == (10, 4)
    block = omega[:4]
    gram = block @ block.T
    off_diagonal = gram - torch.diag(torch.diagonal(gram))
    assert off_diagonal.abs().max() < 1e-10
    # the norms are chi(4)-distributed, not all equal
    assert torch.diagonal(gram).std() > 1e-3


def test_orthogonal_rows_have_gaussian_second_moment():
    omega = kernels.draw_omega(6, 60000, generator=generator(0), orthogonal=True)
    covariance = omega.T @ omega / omega.shape[0]
    assert (covariance - torch.eye(6, dtype=omega.dtype)).abs().max() < 0.05


def test_features_match_the_formula(rng):
    x = torch.randn(3, 4, generator=rng, dtype=torch.float64)
    omega = kernels.draw_omega(4, 9, generator=rng)
    expected = torch.exp(x @ omega.T - 0.5 * (x**2).sum(-1, keepdim=True)) / math.sqrt(9)
    assert torch.allclose(kernels.positive_random_features(x, omega), expected, rtol=1e-13, atol=0)


def test_features_do_not_overflow_for_huge_inputs():
    omega = kernels.draw_omega(3, 50, generator=generator(0))
    x = torch.full((1, 3), 1e3, dtype=torch.float64)
    features = kernels.positive_random_features(x, omega)
    assert torch.isfinite(features).all()
    # x . w - |x|^2/2 <= |w|^2/2, so every feature is bounded by exp(|w|^2 / 2) / sqrt(m)
    bound = torch.exp(0.5 * (omega**2).sum(-1)) / math.sqrt(50)
    assert (features[0] <= bound * (1 + 1e-12)).all()


def test_unbiasedness_monte_carlo():
    x = torch.tensor([0.3, -0.2], dtype=torch.float64)
    y = torch.tensor([0.5, 0.4], dtype=torch.float64)
    mean, standard_error, variance = kernels.monte_carlo_kernel(x, y, 300_000, generator=generator(0))
    assert abs(mean - math.exp(float(x @ y))) < 5 * standard_error
    assert abs(variance / float(kernels.feature_product_variance(x, y)) - 1) < 0.1


def test_biased_estimator_is_detected():
    """The unbiasedness check can fail: dropping the -|x|^2/2 correction is caught."""
    x = torch.tensor([0.3, -0.2], dtype=torch.float64)
    y = torch.tensor([0.5, 0.4], dtype=torch.float64)
    w = kernels.draw_omega(2, 300_000, generator=generator(0))
    wrong = torch.exp(w @ (x + y))
    standard_error = wrong.std() / math.sqrt(len(wrong))
    assert abs(float(wrong.mean()) - math.exp(float(x @ y))) > 5 * float(standard_error)


@settings(max_examples=25, deadline=None)
@given(dim=st.integers(1, 6), count=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_features_positive_and_shaped(dim, count, seed):
    g = generator(seed)
    omega = kernels.draw_omega(dim, count, generator=g)
    x = torch.randn(2, 3, dim, generator=g, dtype=torch.float64)
    features = kernels.positive_random_features(x, omega)
    assert features.shape == (2, 3, count)
    assert (features > 0).all()
    log = kernels.log_positive_random_features(x, omega)
    assert torch.allclose(torch.log(features), log, rtol=1e-12, atol=1e-12)


def test_feature_map_object_follows_input_dtype():
    feature_map = kernels.PositiveRandomFeatures(kernels.draw_omega(3, 5, generator=generator(0)))
    x = torch.randn(2, 3, dtype=torch.float32)
    assert feature_map(x).dtype == torch.float32
    assert feature_map.num_features == 5


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.draw_omega(3, 0), "num_features"),
        (lambda: kernels.draw_omega(0, 3), "dim"),
        (lambda: kernels.draw_omega(3, 2.5), "num_features"),
        (lambda: kernels.positive_random_features(torch.ones(2, 3, dtype=torch.float64), torch.ones(4, 2, dtype=torch.float64)), "x"),
        (lambda: kernels.positive_random_features(torch.tensor([[float("nan"), 0.0]]), torch.ones(4, 2)), "x"),
        (lambda: kernels.positive_random_features(torch.ones(1, 2), torch.ones(4, 2, 1)), "omega"),
        (lambda: kernels.positive_random_features(torch.ones(1, 2), torch.ones(4, 2, dtype=torch.float64)), "omega"),
        (lambda: kernels.monte_carlo_kernel(torch.ones(2, dtype=torch.float64), torch.ones(3, dtype=torch.float64), 10), "x and y"),
    ],
)
def test_bad_input_names_the_argument(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_non_tensor_is_refused():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        kernels.positive_random_features([[1.0, 2.0]], torch.ones(3, 2))
