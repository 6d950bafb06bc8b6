"""The training-free predictors against closed forms derived independently (autograd, explicit
normal equations, limits), batched against a loop, and errors that name the argument."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import baselines
from icl_lens.device import generator


def prompts(batch=(7,), N=15, d=11, seed=0, noise=0.0):
    g = generator(seed)
    x = 2 * torch.rand(*batch, N + 1, d, generator=g, dtype=torch.float64) - 1
    w = torch.randn(*batch, d, generator=g, dtype=torch.float64)
    y = (x * w.unsqueeze(-2)).sum(-1) + noise * torch.randn(*batch, N + 1, generator=g, dtype=torch.float64)
    return x[..., :-1, :], y[..., :-1], x[..., -1, :], y[..., -1]


def test_zero_and_context_mean():
    x, y, q, _ = prompts()
    assert torch.equal(baselines.zero(x, y, q), torch.zeros(7, dtype=torch.float64))
    assert torch.allclose(baselines.context_mean(x, y, q), y.sum(-1) / y.shape[-1], rtol=0, atol=1e-15)


def test_one_step_gd_is_one_gradient_step_from_zero():
    x, y, q, _ = prompts()
    lr = 0.7
    w = torch.zeros(7, 11, dtype=torch.float64, requires_grad=True)
    loss = (((x * w.unsqueeze(-2)).sum(-1) - y) ** 2).mean(-1).sum() / 2   # (1/2N) sum per prompt
    (gradient,) = torch.autograd.grad(loss, w)
    expected = ((w - lr * gradient) * q).sum(-1)
    assert torch.allclose(baselines.one_step_gd(x, y, q, lr), expected, rtol=0, atol=1e-14)
    assert not torch.allclose(baselines.one_step_gd(x, y, q, 2 * lr), expected, rtol=0, atol=1e-6)


def test_optimal_learning_rate_minimises_the_error():
    x, y, q, target = prompts(batch=(64,))
    best = baselines.optimal_one_step_lr(x, y, q, target)

    def error(lr):
        return float(((baselines.one_step_gd(x, y, q, lr) - target) ** 2).mean())

    grid = torch.linspace(0.2 * best, 3 * best, 2001, dtype=torch.float64)
    scanned = float(grid[torch.tensor([error(float(lr)) for lr in grid]).argmin()])
    assert abs(scanned - best) <= float(grid[1] - grid[0])       # the scan lands on the closed form
    assert error(best) < error(1.05 * best) and error(best) < error(0.95 * best)
    with pytest.raises(ValueError, match="y_query"):
        baselines.optimal_one_step_lr(x, y, q, target[:3])


def test_least_squares_recovers_a_noiseless_linear_task():
    x, y, q, target = prompts(N=15, d=11)
    assert torch.allclose(baselines.least_squares(x, y, q), target, rtol=0, atol=1e-10)
    assert torch.allclose(baselines.least_squares(x, y, q, intercept=True), target, rtol=0, atol=1e-10)


def test_least_squares_minimum_norm_and_ridge_closed_forms():
    x, y, q, _ = prompts(N=5, d=11)             # fewer demonstrations than dimensions
    w = (x.transpose(-1, -2) @ torch.linalg.solve(x @ x.transpose(-1, -2), y.unsqueeze(-1))).squeeze(-1)
    assert torch.allclose(baselines.least_squares(x, y, q), (w * q).sum(-1), rtol=0, atol=1e-10)
    ridge = 0.3
    gram = x.transpose(-1, -2) @ x + ridge * torch.eye(11, dtype=torch.float64)
    w = torch.linalg.solve(gram, (x.transpose(-1, -2) @ y.unsqueeze(-1))).squeeze(-1)
    assert torch.allclose(baselines.least_squares(x, y, q, ridge), (w * q).sum(-1), rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="ridge"):
        baselines.least_squares(x, y, q, -1.0)


def test_nadaraya_watson_limits():
    x, y, q, _ = prompts()
    wide = baselines.nadaraya_watson(x, y, q, 1e6)
    assert torch.allclose(wide, baselines.context_mean(x, y, q), rtol=0, atol=1e-5)
    nearest = ((x - q.unsqueeze(-2)) ** 2).sum(-1).argmin(-1)
    narrow = baselines.nadaraya_watson(x, y, q, 1e-4)
    assert torch.allclose(narrow, y.gather(-1, nearest.unsqueeze(-1)).squeeze(-1), rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        baselines.nadaraya_watson(x, y, q, 0.0)
    temperatures = (0.01, 0.1, 1.0, 10.0)
    chosen = baselines.best_temperature(x, y, q, _, temperatures)
    errors = {t: float(((baselines.nadaraya_watson(x, y, q, t) - _) ** 2).mean()) for t in temperatures}
    assert errors[chosen] == min(errors.values())


@settings(max_examples=20, deadline=None)
@given(batch=st.integers(1, 4), N=st.integers(1, 9), d=st.integers(1, 6), seed=st.integers(0, 1000))
def test_batched_equals_one_prompt_at_a_time(batch, N, d, seed):
    x, y, q, _ = prompts(batch=(batch,), N=N, d=d, seed=seed, noise=0.1)
    for predictor in (lambda *a: baselines.least_squares(*a, 0.1, intercept=True),
                      lambda *a: baselines.nadaraya_watson(*a, 0.5),
                      lambda *a: baselines.one_step_gd(*a, 0.3), baselines.context_mean):
        together = predictor(x, y, q)
        alone = torch.stack([predictor(x[i], y[i], q[i]) for i in range(batch)])
        assert torch.allclose(together, alone, rtol=1e-12, atol=1e-12)


def test_shapes_name_the_argument():
    x, y, q, _ = prompts()
    with pytest.raises(ValueError, match="y_context"):
        baselines.context_mean(x, y[..., :-1], q)
    with pytest.raises(ValueError, match="x_query"):
        baselines.zero(x, y, q[..., :-1])
    with pytest.raises(ValueError, match="x_context"):
        baselines.zero(x[0, 0], y, q)


def test_least_squares_intercept_recovers_an_offset():
    """y = w . x + 5: the query's intercept column is a one, so the prediction carries the 5."""
    x, y, q, target = prompts(N=15, d=11)
    assert torch.allclose(baselines.least_squares(x, y + 5, q, intercept=True), target + 5, rtol=0, atol=1e-10)


def test_two_leading_dimensions_against_a_loop():
    """Prompts batched as (2, 3): the zero predictor keeps the labels' dtype and shape, ridge least
    squares and the best one-step learning rate equal their closed forms prompt by prompt."""
    x, y, q, target = prompts(batch=(2, 3), N=6, d=4, noise=0.1)
    zero = baselines.zero(x, y, q)
    assert zero.dtype == torch.float64 and zero.shape == (2, 3) and not zero.any()
    got = baselines.least_squares(x, y, q, 0.5)
    for i in range(2):
        for j in range(3):
            gram = x[i, j].T @ x[i, j] + 0.5 * torch.eye(4, dtype=torch.float64)
            w = torch.linalg.solve(gram, x[i, j].T @ y[i, j])
            assert abs(float(got[i, j] - w @ q[i, j])) < 1e-12
    g = torch.stack([torch.stack([(y[i, j] @ x[i, j] / 6) @ q[i, j] for j in range(3)]) for i in range(2)])
    assert baselines.optimal_one_step_lr(x, y, q, target) == pytest.approx(float((g * target).sum() / (g * g).sum()),
                                                                           rel=1e-12)


def test_errors_name_the_argument_and_the_expected_shape():
    x, y, q, target = prompts(batch=(7,), N=15, d=11)
    with pytest.raises(ValueError, match=r"y_context must be \(\.\.\., N\) = \(7, 15\)"):
        baselines.zero(x, y[..., :-1], q)
    with pytest.raises(ValueError, match=r"y_query must be \(\.\.\.\) = \(7,\)"):
        baselines.optimal_one_step_lr(x, y, q, target[:3])
    with pytest.raises(TypeError, match="x_context"):
        baselines.zero(x.tolist(), y, q)
    with pytest.raises(TypeError, match="y_query"):
        baselines.optimal_one_step_lr(x, y, q, target.tolist())


def test_non_finite_rates_name_themselves_and_batched_shape_messages():
    x, y, q, target = prompts(batch=(2, 3), N=6, d=4)
    with pytest.raises(ValueError, match="^ridge"):
        baselines.least_squares(x, y, q, float("nan"))
    with pytest.raises(ValueError, match="^lr"):
        baselines.one_step_gd(x, y, q, float("nan"))
    with pytest.raises(ValueError, match=r"^y_query must be \(\.\.\.\) = \(2, 3\), got \(2,\)"):
        baselines.optimal_one_step_lr(x, y, q, target[:, 0])
