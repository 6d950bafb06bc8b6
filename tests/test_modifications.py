import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import modifications as m
from icl_lens import kernels
from icl_lens.device import generator


def prompt_setup(N, d, features, seed, **maps):
    g = generator(seed)
    X = 2 * torch.rand(N + 1, d, generator=g, dtype=torch.float64) - 1
    W_Q, W_K, W_V = (torch.randn(d, d, generator=g, dtype=torch.float64) / d**0.5 for _ in range(3))
    phi = kernels.PositiveRandomFeatures(kernels.draw_omega(d, features, generator=g))
    return X, (W_Q, W_K, W_V), phi, m.kernel_prompt(X[:N], X[N:], W_Q, W_K, W_V, phi, **maps)


def relative(a, b):
    return float((a - b).norm() / b.norm())


@settings(max_examples=20, deadline=None)
@given(N=st.integers(2, 20), d=st.integers(1, 6), alpha=st.floats(-0.9, 1.9), lr=st.floats(0.01, 5.0), seed=st.integers(0, 9999))
def test_regularized_step_equals_scaled_query_side(N, d, alpha, lr, seed):
    _, _, _, prompt = prompt_setup(N, d, 64, seed)
    W0 = prompt.initial_weight().clone().requires_grad_(True)
    m.regularized_loss(prompt, W0, alpha, lr).backward()
    W1 = W0.detach() - lr * W0.grad
    target = m.modified_attention(prompt, query_side_factor=1 - alpha)
    assert relative(prompt.predict(W1), target) < 1e-10
    if abs(alpha) > 1e-3:
        assert relative(m.regularized_steps(prompt, alpha, 7), m.exponential_smoothing(prompt, alpha, 7)) < 1e-10


def test_unregularized_is_theorem_3_1():
    X, weights, phi, prompt = prompt_setup(15, 12, 300, 1)
    from icl_lens.attention import kernel_attention

    layer = kernel_attention(X[-1:], X, *weights, feature_map=phi)[0]
    assert relative(prompt.predict(prompt.initial_weight() + prompt.demo_update()), layer) < 1e-10
    assert relative(m.modified_attention(prompt), layer) < 1e-10


def test_augmented_equals_by_hand_attention():
    g = generator(2)
    G1, G2 = (torch.randn(6, 6, generator=g, dtype=torch.float64) / 6**0.5 for _ in range(2))
    g1 = lambda v: torch.nn.functional.gelu(v @ G1.T)  # noqa: E731
    g2 = lambda k: torch.nn.functional.elu(k @ G2.T)  # noqa: E731
    X, (W_Q, W_K, W_V), phi, prompt = prompt_setup(10, 6, 128, 3, key_map=g2, value_map=g1)
    root = 6**-0.25
    scores = phi(root * g2(X @ W_K.T)) @ phi(root * X[-1] @ W_Q.T)
    by_hand = scores @ g1(X @ W_V.T) / scores.sum()
    assert relative(prompt.predict(prompt.initial_weight() + prompt.demo_update()), by_hand) < 1e-10


def test_negative_samples_equal_the_score_form():
    X, (W_Q, W_K, W_V), phi, prompt = prompt_setup(15, 8, 256, 4)
    scores = phi(prompt.demo_keys) @ phi(prompt.demo_keys).T
    neighbours = m.lowest_attention_neighbours(scores, 3)
    assert not (neighbours == torch.arange(15).unsqueeze(1)).any()
    negative = m.with_negative_samples(prompt, X[:15], W_V, neighbours, beta=0.1)
    a = phi(prompt.demo_keys) @ phi(prompt.query)
    a_query = phi(prompt.query_keys) @ phi(prompt.query)
    adjusted = a.clone()
    for i in range(15):
        adjusted[neighbours[i]] -= 0.1 * a[i] / 3
    score_form = (adjusted @ (X[:15] @ W_V.T) + a_query @ (X[15:] @ W_V.T)) / (a.sum() + a_query.sum())
    assert relative(negative.predict(negative.initial_weight() + negative.demo_update()), score_form) < 1e-10
    with pytest.raises(ValueError, match="k must be"):
        m.lowest_attention_neighbours(scores, 15)


def test_ridge_is_the_minimiser_and_push_through_holds():
    _, _, _, prompt = prompt_setup(12, 5, 40, 5)
    W_star = m.ridge_weight(prompt, 0.3).clone().requires_grad_(True)
    m.ridge_loss(prompt, W_star, 0.3).backward()
    assert float(W_star.grad.norm()) < 1e-10
    assert relative(prompt.predict(W_star.detach()), m.ridge_attention(prompt, 0.3)) < 1e-10
    with pytest.raises(ValueError, match="ridge"):
        m.ridge_weight(prompt, 0.0)


def test_lemma_d_1_on_a_singular_attention_matrix():
    g = generator(6)
    tokens = torch.randn(6, 4, generator=g, dtype=torch.float64)
    tokens[3] = tokens[1]  # a duplicated token makes two rows of the attention matrix equal
    A = torch.softmax(tokens @ tokens.T / 2, dim=-1)
    assert float(torch.linalg.svdvals(A).min()) < 1e-12
    delta = m.safe_radius(A)
    assert 0 < delta < math.inf
    # Bauer-Fike: sigma_min(A + alpha I) >= distance to the nearest bad alpha / cond(V); on the grid
    # that is well above round-off, which a singular matrix would sit at
    _, vectors = torch.linalg.eig(A)
    condition = float(torch.linalg.cond(vectors))
    for alpha in torch.linspace(1e-6, 0.999 * delta, 200, dtype=torch.float64):
        for sign in (1, -1):
            sigma = float(torch.linalg.svdvals(A + sign * alpha * torch.eye(6, dtype=torch.float64)).min())
            distance = float((sign * alpha - m.bad_alphas(A)).abs().min())
            assert sigma >= distance / condition * (1 - 1e-9) and distance / condition > 1e-9
    # at a bad alpha the matrix is singular
    bad = m.bad_alphas(A)
    real_bad = bad[bad.imag.abs() < 1e-12].real
    nonzero = real_bad[real_bad.abs() > 1e-9]
    assert float(torch.linalg.svdvals(A + float(nonzero[0]) * torch.eye(6, dtype=torch.float64)).min()) < 1e-8
    assert m.safe_radius(torch.zeros(3, 3, dtype=torch.float64)) == math.inf


def test_lowest_attention_neighbours_against_a_sort():
    scores = torch.randn(5, 5, generator=generator(8), dtype=torch.float64)
    for k in (1, 4):
        found = m.lowest_attention_neighbours(scores, k)
        for i in range(5):
            others = sorted((float(scores[i, j]), j) for j in range(5) if j != i)
            assert found[i].tolist() == [j for _, j in others[:k]]
    for k in (0, 5):
        with pytest.raises(ValueError, match=f"k must be between 1 and 4, got {k}"):
            m.lowest_attention_neighbours(scores, k)


def test_step_counts_zero_steps_and_their_errors():
    _, _, _, prompt = prompt_setup(6, 3, 20, 1)
    assert torch.equal(m.regularized_steps(prompt, 0.3, 0), prompt.initial_weight())
    assert torch.allclose(m.exponential_smoothing(prompt, 0.3, 0), prompt.initial_weight(), rtol=1e-15, atol=0)
    for steps in (-1, True, 2.0):
        with pytest.raises(ValueError, match=f"steps must be a non-negative integer, got {steps!r}"):
            m.regularized_steps(prompt, 0.3, steps)
    with pytest.raises(ValueError, match="alpha must be nonzero here"):
        m.exponential_smoothing(prompt, 0.0, 3)
    W = prompt.initial_weight()
    for call, name in ((lambda: m.regularized_loss(prompt, W, float("nan"), 1.0), "alpha"),
                       (lambda: m.regularized_loss(prompt, W, 0.1, 0.0), "lr"),
                       (lambda: m.regularized_steps(prompt, float("nan"), 2), "alpha"),
                       (lambda: m.exponential_smoothing(prompt, float("nan"), 2), "alpha"),
                       (lambda: m.ridge_attention(prompt, 0.0), "ridge"),
                       (lambda: m.ridge_loss(prompt, W, 0.0), "ridge")):
        with pytest.raises(ValueError, match=f"^{name}"):
            call()


def test_kernel_prompt_default_scale_and_errors():
    """The default temperature is 1 / sqrt(d_o), d_o the rows of W_K (3 here, tokens of 5)."""
    g = generator(9)
    X = torch.randn(4, 5, generator=g, dtype=torch.float64)
    W_Q, W_K = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2))
    W_V = torch.randn(5, 5, generator=g, dtype=torch.float64)
    phi = kernels.PositiveRandomFeatures(kernels.draw_omega(3, 10, generator=g))
    default = m.kernel_prompt(X[:3], X[3:], W_Q, W_K, W_V, phi)
    assert torch.allclose(default.query, 3**-0.25 * X[3] @ W_Q.T, rtol=1e-14, atol=0)
    assert torch.allclose(default.demo_keys, 3**-0.25 * X[:3] @ W_K.T, rtol=1e-14, atol=0)
    with pytest.raises(ValueError, match=r"^demos must be \(tokens, d\), got shape \(5,\)"):
        m.kernel_prompt(X[0], X[3:], W_Q, W_K, W_V, phi)
    with pytest.raises(TypeError, match="^queries must"):
        m.kernel_prompt(X[:3], X[3:].tolist(), W_Q, W_K, W_V, phi)
    with pytest.raises(ValueError, match="^scale"):
        m.kernel_prompt(X[:3], X[3:], W_Q, W_K, W_V, phi, scale=0.0)


def test_bad_alphas_and_safe_radius_closed_forms():
    """For a diagonal A the bad alphas are minus its diagonal; roots below 1e-12 of the largest
    (or of 1) count as zero."""
    A = torch.diag(torch.tensor([0.5, -2.0, 3.0], dtype=torch.float64))
    assert sorted(m.bad_alphas(A).real.tolist()) == [-3.0, -0.5, 2.0]
    assert m.safe_radius(torch.diag(torch.tensor([1.5e-12, 0.5], dtype=torch.float64))) == 1.5e-12
    assert m.safe_radius(torch.diag(torch.tensor([1e-9, 1e6], dtype=torch.float64))) == 1e6
    for shape in ((2, 3), (2, 2, 2)):
        with pytest.raises(ValueError, match=rf"^A must be square, got shape \({', '.join(map(str, shape))}\)"):
            m.bad_alphas(torch.ones(shape, dtype=torch.float64))
    with pytest.raises(TypeError, match="^A must"):
        m.bad_alphas([[1.0]])


def test_kernel_prompt_checks_every_argument():
    g = generator(10)
    X = torch.randn(4, 5, generator=g, dtype=torch.float64)
    W_Q, W_K = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(2))
    W_V = torch.randn(5, 5, generator=g, dtype=torch.float64)
    phi = kernels.PositiveRandomFeatures(kernels.draw_omega(3, 10, generator=g))
    one = m.kernel_prompt(X[:1], X[1:], W_Q, W_K, W_V, phi, query_index=-3)     # one demonstration, first query
    assert one.demo_keys.shape == (1, 3) and torch.allclose(one.query, 3**-0.25 * X[1] @ W_Q.T, rtol=1e-14, atol=0)
    bad = [
        (dict(demos=X[:0]), r"^demos must hold at least one demonstration"),
        (dict(queries=X[3:, :4]), r"^queries has last dimension 4, but it must match the token dimension of demos \(5\)"),
        (dict(W_K=W_K[:, :4]), r"^W_K has shape \(3, 4\), but dimension 1 must be 5"),
        (dict(W_Q=W_Q[:2]), r"^W_Q has shape \(2, 5\), but dimension 0 must be 3"),
        (dict(W_V=W_V[:, :4]), r"^W_V has shape \(5, 4\), but dimension 1 must be 5"),
        (dict(query_index=1), r"^query_index=1 is out of range for 1 query tokens"),
        (dict(query_index=-2), r"^query_index=-2 is out of range for 1 query tokens"),
        (dict(query_index=True), r"^query_index=True is out of range"),
        (dict(query_index=0.0), r"^query_index=0.0 is out of range"),
    ]
    for change, message in bad:
        arguments = {**dict(demos=X[:3], queries=X[3:], W_Q=W_Q, W_K=W_K, W_V=W_V, feature_map=phi), **change}
        with pytest.raises(ValueError, match=message):
            m.kernel_prompt(**arguments)
    prompt = m.kernel_prompt(X[:3], X[3:], W_Q, W_K, W_V, phi)
    with pytest.raises(ValueError, match=r"^W has shape \(5, 9\), but dimension 1 must be 10"):
        m.regularized_loss(prompt, torch.zeros(5, 9, dtype=torch.float64), 0.1, 1.0)
    with pytest.raises(ValueError, match=r"^W has shape \(4, 10\), but dimension 0 must be 5"):
        m.ridge_loss(prompt, torch.zeros(4, 10, dtype=torch.float64), 0.1)
