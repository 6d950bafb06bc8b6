import itertools
import math

import pytest
import torch

from icl_lens import bounds, kernels
from icl_lens.device import generator


def small_problem(N=20, d=5, features=30, seed=0):
    g = generator(seed)
    x = 2 * torch.rand(N, d, generator=g, dtype=torch.float64) - 1
    W_K = torch.randn(d, d, generator=g, dtype=torch.float64) / d
    W_V = torch.randn(d, d, generator=g, dtype=torch.float64) / d
    omega = kernels.draw_omega(d, features, generator=g)
    return x, W_K, W_V, omega, kernels.PositiveRandomFeatures(omega)


def test_erm_is_the_constrained_minimiser():
    x, W_K, W_V, _, phi_map = small_problem()
    phi = bounds.features(x, W_K, phi_map)
    labels = x @ W_V.T
    W_hat = bounds.erm_weight(phi, labels, w=2.0)
    assert abs(float(torch.linalg.matrix_norm(W_hat)) - 2.0) < 1e-12
    best = float(bounds.empirical_loss(W_hat, phi, labels))
    g = generator(5)
    for _ in range(200):
        other = torch.randn(W_hat.shape, generator=g, dtype=torch.float64)
        other = 2.0 * other / torch.linalg.matrix_norm(other) * float(torch.rand(1, generator=g))
        assert float(bounds.empirical_loss(other, phi, labels)) >= best - 1e-12


def test_kernel_matrix_and_losses_agree_with_definitions():
    x, W_K, W_V, _, phi_map = small_problem()
    K_S = bounds.kernel_matrix(x, W_K, phi_map)
    phi = phi_map(x @ W_K.T)
    assert torch.allclose(K_S, phi @ phi.T)
    W = torch.randn(5, 30, dtype=torch.float64)
    direct = -sum(float((x[i] @ W_V.T) @ (W @ phi[i])) for i in range(len(x))) / len(x)
    assert abs(float(bounds.empirical_loss(W, phi, x @ W_V.T)) - direct) < 1e-12


def test_max_feature_norm_is_an_upper_bound():
    _, _, _, omega, phi_map = small_problem(features=50)
    bound = bounds.max_feature_norm(omega, 1.5)
    g = generator(3)
    z = torch.randn(5000, 5, generator=g, dtype=torch.float64)
    z = 1.5 * z / z.norm(dim=-1, keepdim=True) * torch.rand(5000, 1, generator=g, dtype=torch.float64)
    assert float(phi_map(z).norm(dim=-1).max()) <= bound
    # attained direction by direction: one feature alone reaches its maximum
    single = omega[:1]
    assert abs(bounds.max_feature_norm(single, 10.0) - math.exp(0.5 * float(single.norm()) ** 2)) < 1e-9 * math.exp(0.5 * float(single.norm()) ** 2)


def test_bound_terms_formula():
    K_S = torch.eye(4, dtype=torch.float64) * 2.0
    terms = bounds.generalization_bound(K_S, rho=1.5, w=0.5, delta=0.1, N=4, output_dim=3, empirical_loss=-0.2)
    rademacher = 4 * 1.5 * 0.5 * math.sqrt(3 * 8.0) / 4
    root = math.sqrt(math.log(40) / 8)
    assert terms.rademacher == pytest.approx(rademacher)
    assert terms.confidence_uniform == pytest.approx(6 * 1.5**2 * root)
    assert terms.excess == pytest.approx(rademacher + 8 * 1.5**2 * root)
    assert terms.uniform == pytest.approx(-0.2 + rademacher + 6 * 1.5**2 * root)
    negative = bounds.generalization_bound(K_S, rho=1.5, w=0.5, delta=0.1, N=4, output_dim=3, negatives=2)
    assert negative.rademacher == pytest.approx(2 * math.sqrt(2) * math.sqrt(5.5) * 1.5 * 0.5 * math.sqrt(24) / 4)
    assert negative.confidence_uniform == pytest.approx(12 * 1.5**2 * root)


@pytest.mark.parametrize("change, message", [
    (dict(delta=0.0), "delta"), (dict(delta=1.0), "delta"), (dict(w=-1.0), "w"), (dict(rho=0.0), "rho"),
    (dict(K_S=torch.ones(3, 4, dtype=torch.float64)), "square"),
    (dict(K_S=torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64), N=2), "positive semi-definite"),
    (dict(K_S=torch.tensor([[1.0, 0.5], [0.0, 1.0]], dtype=torch.float64), N=2), "symmetric"),
    (dict(N=3), "N = 3"), (dict(negatives=0), "negatives"),
])
def test_bound_inputs_are_checked(change, message):
    arguments = dict(K_S=torch.eye(4, dtype=torch.float64), rho=1.0, w=1.0, delta=0.05, N=4, output_dim=2)
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        bounds.generalization_bound(**arguments)


def test_experiment_holds_and_shrunk_bound_is_flagged():
    config = bounds.BoundExperimentConfig(sample_sizes=(4, 32), draws=10, num_features=64, population_samples=20_000, negatives=(2,))
    g = generator(0)
    setting = bounds.make_bound_setting(config, g)
    assert abs(setting.rho - 1) < 1e-9
    for negatives in (None, 2):
        result = bounds.bound_experiment(config, setting=setting, generator=g, negatives=negatives)
        for gaps, gap_bounds, excess, excess_bounds in zip(result["gap"], result["gap_bound"], result["excess"], result["excess_bound"]):
            assert bounds.violations(gaps, gap_bounds) == []
            assert bounds.violations(excess, excess_bounds) == []
    again = bounds.rescaled(result, 2.0, 0.01)
    assert again["gap"][0][0] == pytest.approx(2.0 * result["gap"][0][0])
    assert again["gap_bound"][0][0] > result["gap_bound"][0][0]


def test_rademacher_estimate_is_below_the_trace_bound():
    x, W_K, _, _, phi_map = small_problem(N=30)
    phi = bounds.features(x, W_K, phi_map)
    estimate = bounds.rademacher_monte_carlo(phi, 1.0, 5, draws=4000, generator=generator(2))
    assert estimate <= math.sqrt(5 * float((phi**2).sum())) / 30
    assert estimate > 0.8 * math.sqrt(5 * float((phi**2).sum())) / 30


def test_lipschitz_constants_are_attained_and_a_wrong_one_is_caught():
    for K in (None, 1, 4):
        ratio = bounds.lipschitz_search(1.0, 6, negatives=K, samples=2000, generator=generator(5))
        assert 0.99 <= ratio <= 1 + 1e-9


def test_hoeffding_constant_is_tight_within_a_factor_two():
    for N in (10, 100, 1000):
        t = bounds.hoeffding_deviation(N, 0.05, 2.0)
        assert bounds.hoeffding_tail(N, t, 2.0) <= 0.05 < bounds.hoeffding_tail(N, t / 2, 2.0)
    # the paper's constant 3 without rho is not valid once the loss range 2 rho^2 exceeds 3
    N, rho = 200, 3.0
    paper = 3 * math.sqrt(math.log(1 / 0.05) / (2 * N))
    assert bounds.hoeffding_tail(N, paper, rho) > 0.05


def test_erm_solution_is_the_normalised_dual_update():
    from icl_lens import dual

    x, W_K, W_V, _, phi_map = small_problem(N=20)
    other, *_ = small_problem(N=20, seed=9)
    erm = bounds.erm_weight(bounds.features(x, W_K, phi_map), x @ W_V.T, 0.7)
    model = dual.dual_model(x, x[:1], W_K, W_K, W_V, phi_map, scale=1.0, lr=0.3)
    update = model.step() - model.W0
    assert torch.allclose(0.7 * update / torch.linalg.matrix_norm(update), erm, rtol=0, atol=1e-12)
    wrong = bounds.erm_weight(bounds.features(other, W_K, phi_map), other @ W_V.T, 0.7)
    assert float((wrong - erm).abs().max()) > 1e-3


def test_violations_flags_exactly_the_values_above_their_bound():
    assert bounds.violations([0.1, 0.5, -1.0, 0.3], [0.2, 0.4, -2.0, 0.3]) == [1, 2]
    with pytest.raises(ValueError, match="shape"):
        bounds.violations([0.1, 0.2], [0.3])


def test_negative_labels_closed_form():
    """y_i - mean_j y_ij^-: labels [[1]] with negatives [[[.5]]] give 0.5; and a loop over K = 3."""
    assert torch.allclose(bounds.negative_labels(torch.tensor([[1.0]]), torch.tensor([[[0.5]]])), torch.tensor([[0.5]]))
    g = generator(0)
    labels = torch.randn(4, 2, generator=g, dtype=torch.float64)
    negatives = torch.randn(4, 3, 2, generator=g, dtype=torch.float64)
    expected = torch.stack([labels[i] - sum(negatives[i, j] for j in range(3)) / 3 for i in range(4)])
    assert torch.allclose(bounds.negative_labels(labels, negatives), expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("negatives", [None, 1, 3])
def test_loss_gradient_norm_is_the_autograd_gradient(negatives):
    """|grad h(u)| against autograd of h written out: -<u1, u2>, or -(1/K) sum_j <u1, u2 - u_{j+2}>."""
    blocks = 2 if negatives is None else negatives + 2
    u = torch.randn(5, blocks, 3, generator=generator(1), dtype=torch.float64, requires_grad=True)
    if negatives is None:
        h = -(u[:, 0] * u[:, 1]).sum()
    else:
        h = -sum((u[:, 0] * (u[:, 1] - u[:, j + 2])).sum() for j in range(negatives)) / negatives
    (gradient,) = torch.autograd.grad(h, u)
    expected = gradient.flatten(1).norm(dim=1)
    assert torch.allclose(bounds.loss_gradient_norm(u.detach(), negatives), expected, rtol=1e-13, atol=0)


@pytest.mark.parametrize("N", [1, 2, 3, 6, 9])
def test_hoeffding_tail_equals_the_enumerated_probability(N):
    """P(mean - 0 >= t) for N fair +-rho^2 losses, by listing all 2^N outcomes; t runs over every
    possible sample mean (N = 2, t = 0: 3/4) and values between them."""
    rho = 1.5
    means = [rho**2 * sum(signs) / N for signs in itertools.product((-1, 1), repeat=N)]
    for k in range(-N - 1, N + 2):
        for t in (rho**2 * k / N, rho**2 * (k + 0.5) / N):
            expected = sum(mean >= t - 1e-9 for mean in means) / 2**N
            assert abs(bounds.hoeffding_tail(N, t, rho) - expected) < 1e-12, (N, t)
    assert bounds.hoeffding_tail(2, 0.0, 1.0) == pytest.approx(0.75, abs=1e-14)


def test_bound_from_trace_defaults_edges_and_errors():
    """The empirical loss defaults to 0; a trace of 0 (or below 1) is a valid trace; a negative one is not."""
    terms = bounds.bound_from_trace(0.5, 1.5, 0.5, 0.1, 4, output_dim=3)
    assert terms.uniform == pytest.approx(terms.rademacher + terms.confidence_uniform, rel=1e-15)
    assert terms.rademacher == pytest.approx(4 * 1.5 * 0.5 * math.sqrt(3 * 0.5) / 4, rel=1e-14)
    assert bounds.bound_from_trace(0.0, 1.5, 0.5, 0.1, 4, output_dim=3).rademacher == 0.0
    default = bounds.generalization_bound(torch.eye(2, dtype=torch.float64), 1.0, 1.0, 0.1, 2, output_dim=1)
    assert default.empirical_loss == 0.0
    for call, message in ((lambda: bounds.bound_from_trace(-1.0, 1.0, 1.0, 0.1, 4, output_dim=1), "^the trace of K_S"),
                          (lambda: bounds.bound_from_trace(1.0, 1.0, 1.0, 0.1, 4, output_dim=0), "^output_dim"),
                          (lambda: bounds.bound_from_trace(1.0, 1.0, 1.0, 0.1, 0, output_dim=1), "^N"),
                          (lambda: bounds.bound_from_trace(1.0, 1.0, 0.0, 0.1, 4, output_dim=1), "^w"),
                          (lambda: bounds.generalization_bound(torch.eye(2), 1.0, 1.0, 0.1, 0, output_dim=1), "^N"),
                          (lambda: bounds.generalization_bound(torch.eye(2), 0.0, 1.0, 0.1, 2, output_dim=1), "^rho")):
        with pytest.raises(ValueError, match=message):
            call()


def test_kernel_matrix_checks_are_relative_to_its_scale():
    """Round-off of 1e-6 in a matrix of entries 1e6 (asymmetry, a negative eigenvalue) is accepted;
    a rank-deficient PSD matrix is accepted; the same asymmetry in a matrix of ones is not."""
    K = torch.tensor([[1e6, 1e-6 + 1e-6], [1e-6, -1e-6]], dtype=torch.float64)
    bounds.check_kernel_matrix(K, 2)
    phi = torch.randn(5, 2, generator=generator(0), dtype=torch.float64)
    bounds.check_kernel_matrix(phi @ phi.T, 5)     # rank 2 of 5: zero eigenvalues up to round-off
    with pytest.raises(ValueError, match="symmetric"):
        bounds.check_kernel_matrix(torch.tensor([[1.0, 1e-6], [0.0, 1.0]], dtype=torch.float64), 2)
    with pytest.raises(ValueError, match=r"^K_S is 2 x 2 but N = 3"):
        bounds.check_kernel_matrix(torch.eye(2, dtype=torch.float64), 3)
    with pytest.raises(TypeError, match="^K_S must"):
        bounds.check_kernel_matrix([[1.0]], 1)


def test_population_moments_in_chunks_equal_the_direct_means():
    x, W_K, W_V, _, phi_map = small_problem(N=10)
    rows = iter(x)
    population = bounds.estimate_population(lambda count: torch.stack([next(rows) for _ in range(count)]),
                                            W_K, W_V, phi_map, 10, chunk=3)
    phi, v = phi_map(x @ W_K.T), x @ W_V.T
    assert population.num_samples == 10
    assert torch.allclose(population.M, v.T @ phi / 10, rtol=1e-13, atol=0)
    assert torch.allclose(population.mean_value, v.mean(0), rtol=1e-13, atol=1e-16)
    assert torch.allclose(population.mean_feature, phi.mean(0), rtol=1e-13, atol=0)
    with pytest.raises(ValueError, match="^num_samples"):
        bounds.estimate_population(lambda count: x[:count], W_K, W_V, phi_map, 0)


def test_features_kernel_matrix_batched_and_errors():
    x, W_K, _, _, phi_map = small_problem(N=6)
    batch = torch.stack([x, 2 * x])
    K = bounds.kernel_matrix(batch, W_K, phi_map)
    for b in range(2):
        phi = phi_map(batch[b] @ W_K.T)
        assert torch.allclose(K[b], phi @ phi.T, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match=r"^W_K must be \(d_o, 5\), got \(3, 4\)"):
        bounds.features(x, torch.ones(3, 4, dtype=torch.float64), phi_map)
    with pytest.raises(TypeError, match="^demos must"):
        bounds.features(x.tolist(), W_K, phi_map)
    with pytest.raises(TypeError, match="^W_K must"):
        bounds.features(x, W_K.tolist(), phi_map)


def test_hoeffding_deviation_closed_form():
    assert bounds.hoeffding_deviation(50, 0.05, 1.5) == pytest.approx(2 * 2.25 * math.sqrt(math.log(20) / 100), rel=1e-14)


def test_max_feature_norm_closed_form():
    """Rows [3, 0] and [0, 0.5], radius 1: the first peaks on the sphere, exp(2*3*1 - 1), the second
    inside it, exp(0.5^2); radius 0 gives 1 for every row."""
    omega = torch.tensor([[3.0, 0.0], [0.0, 0.5]], dtype=torch.float64)
    assert bounds.max_feature_norm(omega, 1.0) == pytest.approx(math.sqrt((math.exp(5) + math.exp(0.25)) / 2), rel=1e-14)
    assert bounds.max_feature_norm(omega, 0.4) == pytest.approx(
        math.sqrt((math.exp(2 * 3 * 0.4 - 0.16) + math.exp(2 * 0.5 * 0.4 - 0.16)) / 2), rel=1e-14)
    assert bounds.max_feature_norm(omega, 0.0) == 1.0
    with pytest.raises(ValueError, match="^radius must be non-negative"):
        bounds.max_feature_norm(omega, -1.0)


def test_rademacher_samples_scale_and_seed():
    """E (N/w)^2 ||sum_i eps_i phi_i^T||_F^2 = d_o sum_i |phi_i|^2 (independent signs), with N = 12
    demonstrations and 30 features; the same seed gives the same draws, none needed without one."""
    x, W_K, _, _, phi_map = small_problem(N=12)
    phi = bounds.features(x, W_K, phi_map)
    samples = bounds.rademacher_samples(phi, 0.5, 3, 20_000, generator=generator(1))
    squared = (samples * 12 / 0.5) ** 2
    expected = 3 * float((phi**2).sum())
    assert abs(float(squared.mean()) - expected) < 5 * float(squared.std()) / math.sqrt(20_000)
    assert torch.equal(samples, bounds.rademacher_samples(phi, 0.5, 3, 20_000, generator=generator(1)))
    assert bounds.rademacher_monte_carlo(phi, 0.5, 3, 50, generator=generator(2)) == \
        bounds.rademacher_monte_carlo(phi, 0.5, 3, 50, generator=generator(2))
    assert bounds.rademacher_samples(phi, 0.5, 3, 4).shape == (4,)
    with pytest.raises(ValueError, match="^draws"):
        bounds.rademacher_samples(phi, 0.5, 3, 0)


def test_bound_setting_is_normalised_as_stated():
    """||W_V x|| <= 1 exactly at the support's radius: value_sup is 1; the features' bound is at
    ||W_K x|| <= 1; the tokens are [t ; t w^T] with t in the task's input box."""
    config = bounds.BoundExperimentConfig(num_features=20, population_samples=100)
    setting = bounds.make_bound_setting(config, generator(0))
    assert setting.value_sup == pytest.approx(1.0, rel=1e-12)
    assert setting.feature_sup == pytest.approx(bounds.max_feature_norm(setting.feature_map.omega, 1.0), rel=1e-12)
    tokens = setting.sample(500)
    assert tokens.shape == (500, 12) and tokens[:, :11].abs().max() <= 1
    weight = torch.linalg.lstsq(tokens[:, :11], tokens[:, 11:]).solution
    assert torch.allclose(tokens[:, :11] @ weight, tokens[:, 11:], atol=1e-10)
    assert float((tokens @ setting.W_V.T).norm(dim=1).max()) <= 1 and float((tokens @ setting.W_K.T).norm(dim=1).max()) <= 1


def test_rescaled_against_the_bounds_recomputed():
    result = {"sample_sizes": [4], "w": 0.5, "value_sup": 1.0, "feature_sup": 3.0, "output_dim": 2, "negatives": 2,
              "gap": [[0.1, -0.2]], "excess": [[0.3, 0.05]], "trace": [[1.5, 2.5]], "rho": 1.5, "delta": 0.05}
    again = bounds.rescaled(result, 2.0, 0.01)
    assert again["w"] == 1.0 and again["rho"] == 3.0 and again["delta"] == 0.01
    assert again["gap"] == [[0.2, -0.4]] and again["excess"] == [[0.6, 0.1]]
    for i, trace in enumerate((1.5, 2.5)):
        terms = bounds.bound_from_trace(trace, 3.0, 1.0, 0.01, 4, output_dim=2, negatives=2)
        assert again["gap_bound"][0][i] == pytest.approx(terms.rademacher + terms.confidence_uniform, rel=1e-15)
        assert again["excess_bound"][0][i] == pytest.approx(terms.excess, rel=1e-15)
    with pytest.raises(ValueError, match="^w_scale"):
        bounds.rescaled(result, 0.0, 0.01)


def test_population_losses_and_optimum_closed_forms():
    """L(f) = -<W, M>; with negatives -<W, M - E[W_V x] E[phi]^T>; the optimum on the w-ball is
    w M / ||M||_F (of the negatives' matrix with negatives)."""
    M = torch.tensor([[1.0, 2.0], [0.0, -1.0]], dtype=torch.float64)
    mean_value, mean_feature = torch.tensor([1.0, 0.5], dtype=torch.float64), torch.tensor([2.0, -1.0], dtype=torch.float64)
    population = bounds.Population(M, mean_value, mean_feature, 10)
    W = torch.tensor([[0.5, -1.0], [2.0, 1.0]], dtype=torch.float64)
    assert float(population.loss(W)) == pytest.approx(-(0.5 - 2.0 + 0.0 - 1.0), rel=1e-15)
    shifted = M - torch.tensor([[2.0, -1.0], [1.0, -0.5]], dtype=torch.float64)
    assert float(population.loss(W, negatives=True)) == pytest.approx(-float((shifted * W).sum()), rel=1e-15)
    assert torch.allclose(population.optimal_weight(3.0), 3.0 * M / math.sqrt(6.0), rtol=1e-15, atol=0)
    assert torch.allclose(population.optimal_weight(3.0, negatives=True),
                          3.0 * shifted / float(shifted.norm()), rtol=1e-15, atol=0)
    with pytest.raises(ValueError, match="^w"):
        population.optimal_weight(0.0)


def test_experiment_config_and_hoeffding_arguments_are_checked():
    for change, message in ((dict(sample_sizes=(4, 0)), "^sample_sizes"), (dict(draws=0), "^draws"),
                            (dict(num_features=0), "^num_features"), (dict(population_samples=0), "^population_samples"),
                            (dict(delta=0.0), "^delta must lie in"), (dict(delta=1.0), "^delta must lie in"),
                            (dict(delta=1.5), "^delta must lie in"), (dict(negatives=(2, 0)), "^negatives")):
        with pytest.raises(ValueError, match=message):
            bounds.BoundExperimentConfig(**change)
    for call, message in ((lambda: bounds.hoeffding_tail(0, 0.1, 1.0), "^N"), (lambda: bounds.hoeffding_tail(2, 0.1, 0.0), "^rho"),
                          (lambda: bounds.hoeffding_tail(2, float("nan"), 1.0), "^t"),
                          (lambda: bounds.hoeffding_deviation(0, 0.1, 1.0), "^N"),
                          (lambda: bounds.hoeffding_deviation(2, 1.5, 1.0), "^delta"),
                          (lambda: bounds.hoeffding_deviation(2, 0.1, 0.0), "^rho")):
        with pytest.raises(ValueError, match=message):
            call()
    # float64 comparisons: 1e-12 above a bound of 0.1 is a violation (float32 would round it away)
    assert bounds.violations([0.1 + 1e-12], [0.1]) == [0]


def test_experiment_terms_recompute_from_its_record():
    """Per draw: the gap is true minus empirical loss; the bounds are bound_from_trace's terms of the
    stored trace (with the negatives' constants for C.2); the excess risk is >= 0, f* being the
    population optimum on the ball; a seeded experiment repeats."""
    config = bounds.BoundExperimentConfig(sample_sizes=(8,), draws=4, num_features=32, population_samples=5000,
                                          negatives=(2,))
    for negatives in (None, 2):
        result = bounds.bound_experiment(config, negatives=negatives)
        again = bounds.bound_experiment(config, negatives=negatives)
        assert result["gap"] == again["gap"] and result["output_dim"] == 12
        for j, trace in enumerate(result["trace"][0]):
            terms = bounds.bound_from_trace(trace, result["rho"], result["w"], config.delta, 8, output_dim=12,
                                            negatives=negatives)
            assert result["rademacher"][0][j] == terms.rademacher
            assert result["confidence"][0][j] == terms.confidence_uniform
            assert result["gap_bound"][0][j] == terms.rademacher + terms.confidence_uniform
            assert result["excess_bound"][0][j] == terms.excess
            assert result["excess"][0][j] >= -1e-12
