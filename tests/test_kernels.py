import itertools
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
    """The unbiasedness check can fail: the package's estimate with the -|x|^2/2 - |y|^2/2
    correction taken off again (the mean of exp(w . (x + y)) on the same draws) is caught."""
    x = torch.tensor([0.3, -0.2], dtype=torch.float64)
    y = torch.tensor([0.5, 0.4], dtype=torch.float64)
    mean, standard_error, _ = kernels.monte_carlo_kernel(x, y, 300_000, generator=generator(0))
    correction = math.exp(0.5 * float(x @ x + y @ y))
    assert abs(mean * correction - math.exp(float(x @ y))) > 5 * standard_error * correction


def test_orthogonal_directions_are_sign_symmetric():
    """Haar-distributed blocks: every coordinate of every row of a block, as a unit vector, has mean 0
    and variance 1/d. Without the QR sign fix the diagonal of each block is biased (about -0.78 for
    the first row's first coordinate at d = 4)."""
    d, blocks = 4, 1000
    omega = kernels.draw_omega(d, d * blocks, generator=generator(0), orthogonal=True)
    directions = (omega / omega.norm(dim=1, keepdim=True)).reshape(blocks, d, d)
    standard_error = (1 / d / blocks) ** 0.5
    assert directions.mean(0).abs().max() < 5 * standard_error
    assert ((directions**2).mean(0) - 1 / d).abs().max() < 0.02


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


def test_softmax_kernel_elu_map_and_feature_variance_against_loops():
    g = generator(2)
    x = 0.5 * torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    y = 0.5 * torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    kernel = kernels.softmax_kernel(x, y)
    assert kernel.shape == (2, 3, 5)
    for b, i, j in itertools.product(range(2), range(3), range(5)):
        assert kernel[b, i, j] == pytest.approx(math.exp(float(x[b, i] @ y[b, j])), rel=1e-13)
    # elu(x) + 1 is x + 1 for x > 0 and e^x otherwise
    values = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0], dtype=torch.float64)
    expected = [math.exp(v) if v <= 0 else v + 1 for v in values.tolist()]
    assert kernels.elu_feature_map(values).tolist() == pytest.approx(expected, rel=1e-15)
    # E[p^2] = E exp(2 w.(x + y)) e^{-|x|^2 - |y|^2} = exp(2|x + y|^2 - |x|^2 - |y|^2), E[p] = exp(x . y)
    a, b = x[0, :3], y[0, :3]
    variance = kernels.feature_product_variance(a, b)
    assert variance.shape == (3,)
    for i in range(3):
        u, v = a[i].tolist(), b[i].tolist()
        second = math.exp(2 * sum((p + q) ** 2 for p, q in zip(u, v)) - sum(p * p for p in u) - sum(q * q for q in v))
        assert float(variance[i]) == pytest.approx(second - math.exp(sum(p * q for p, q in zip(u, v))) ** 2, rel=1e-12)


@pytest.mark.parametrize("num_draws, chunk", [(10, 100), (10, 3), (2, 5)])
def test_monte_carlo_kernel_is_the_sample_statistics_of_its_draws(num_draws, chunk):
    """Mean, standard error and unbiased variance of the feature products, against torch's own
    statistics of the same draws (drawn chunk by chunk from the same seed)."""
    x = torch.tensor([0.3, -0.2], dtype=torch.float64)
    y = torch.tensor([0.5, 0.4], dtype=torch.float64)
    mean, standard_error, variance = kernels.monte_carlo_kernel(x, y, num_draws, generator=generator(0), chunk=chunk)
    g = generator(0)
    sizes = [min(chunk, num_draws - start) for start in range(0, num_draws, chunk)]
    w = torch.cat([kernels.draw_omega(2, size, generator=g) for size in sizes])
    products = torch.exp(w @ (x + y) - 0.5 * (x @ x) - 0.5 * (y @ y))
    assert mean == pytest.approx(float(products.mean()), rel=1e-13)
    assert variance == pytest.approx(float(products.var()), rel=1e-9)
    assert standard_error == pytest.approx(float(products.std()) / math.sqrt(num_draws), rel=1e-9)


def test_draws_without_a_generator_and_the_default_is_iid():
    g = generator(3)
    assert torch.equal(kernels.draw_omega(3, 5, generator=g), torch.randn(5, 3, generator=generator(3), dtype=torch.float64))
    for orthogonal in (False, True):
        assert kernels.draw_omega(3, 5, orthogonal=orthogonal).shape == (5, 3)
    first, again = (kernels.draw_omega(3, 7, generator=generator(4), orthogonal=True) for _ in range(2))
    assert torch.equal(first, again)
    # orthogonal rows keep N(0, I)'s length: E|w|^2 = d
    lengths = kernels.draw_omega(3, 30_000, generator=generator(5), orthogonal=True).norm(dim=1) ** 2
    assert abs(float(lengths.mean()) - 3) < 5 * float(lengths.std()) / math.sqrt(30_000)


def test_feature_map_object_log_matches_the_features_in_the_input_dtype():
    omega = kernels.draw_omega(3, 5, generator=generator(0))
    feature_map = kernels.PositiveRandomFeatures(omega)
    x = torch.randn(2, 3, generator=generator(1), dtype=torch.float32)
    assert feature_map.log(x).dtype == torch.float32
    expected = x.double() @ omega.T - 0.5 * (x.double() ** 2).sum(-1, keepdim=True) - 0.5 * math.log(5)
    assert torch.allclose(feature_map.log(x).double(), expected, rtol=1e-5, atol=1e-5)
    assert torch.allclose(feature_map(x).double(), expected.exp(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, error, message", [
    (lambda: kernels.softmax_kernel([[1.0]], torch.ones(1, 1)), TypeError, "^x must"),
    (lambda: kernels.softmax_kernel(torch.ones(1, 1), [[1.0]]), TypeError, "^y must"),
    (lambda: kernels.softmax_kernel(torch.ones(1, 2), torch.ones(1, 3)), ValueError, r"^y has .*the last dimension of x \(2\)"),
    (lambda: kernels.feature_product_variance([1.0], torch.ones(1)), TypeError, "^x must"),
    (lambda: kernels.feature_product_variance(torch.ones(1), [1.0]), TypeError, "^y must"),
    (lambda: kernels.feature_product_variance(torch.ones(2), torch.ones(3)), ValueError, r"^y has .*the last dimension of x \(2\)"),
    (lambda: kernels.monte_carlo_kernel([1.0], torch.ones(1), 5), TypeError, "^x must"),
    (lambda: kernels.monte_carlo_kernel(torch.ones(1), [1.0], 5), TypeError, "^y must"),
    (lambda: kernels.monte_carlo_kernel(torch.ones(1), torch.ones(1), 0), ValueError, "^num_draws"),
    (lambda: kernels.monte_carlo_kernel(torch.ones(1), torch.ones(1), 1), ValueError, "^num_draws must be at least 2"),
    (lambda: kernels.elu_feature_map([1.0]), TypeError, "^x must"),
    (lambda: kernels.positive_random_features(torch.ones(2), torch.ones(2)), ValueError, "^omega must have at least 2"),
])
def test_errors_name_their_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_batched_omega_float32_draws_and_the_overflow_message():
    """One omega per model (M, m, d) against a loop; orthogonal draws in the asked dtype; the Monte
    Carlo estimate in float32; features whose exponent overflows float32 are refused by name."""
    g = generator(6)
    x = torch.randn(2, 4, 3, generator=g, dtype=torch.float64)
    omega = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    log = kernels.log_positive_random_features(x, omega)
    for model in range(2):
        expected = kernels.log_positive_random_features(x[model], omega[model])
        assert torch.allclose(log[model], expected, rtol=1e-15, atol=1e-15)
    assert kernels.draw_omega(3, 5, generator=g, orthogonal=True, dtype=torch.float32).dtype == torch.float32
    mean, _, _ = kernels.monte_carlo_kernel(torch.tensor([0.1, 0.2]), torch.tensor([0.3, -0.1]), 1000, generator=g)
    assert abs(mean - math.exp(0.03 - 0.02)) < 0.05
    with pytest.raises(ValueError, match="^omega has rows so long that exp"):
        kernels.positive_random_features(torch.tensor([[20.0, 0.0]]), torch.tensor([[20.0, 0.0]]))
    with pytest.raises(TypeError, match="^dtype"):
        kernels.draw_omega(3, 5, dtype=torch.int64)
