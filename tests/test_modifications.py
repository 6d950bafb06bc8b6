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
