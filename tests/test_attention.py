import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEVICES, random_layer_weights
from icl_lens import attention, kernels
from icl_lens.device import generator


def loop_softmax_attention(queries_in, context, W_Q, W_K, W_V, scale):
    """Eq. (1) written token by token, as an independent reference."""
    outputs = []
    for query in queries_in:
        logits = torch.stack([scale * (W_Q @ query) @ (W_K @ key) for key in context])
        weights = torch.exp(logits - logits.max())
        weights = weights / weights.sum()
        outputs.append(sum(w * (W_V @ key) for w, key in zip(weights, context)))
    return torch.stack(outputs)


def test_softmax_attention_matches_a_loop(rng):
    X = torch.randn(7, 5, generator=rng, dtype=torch.float64)
    W_Q, W_K, W_V = random_layer_weights(5, 4, rng)
    got = attention.softmax_attention(X[:3], X, W_Q, W_K, W_V)
    expected = loop_softmax_attention(X[:3], X, W_Q, W_K, W_V, 4**-0.5)
    assert got.shape == (3, 4)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_softmax_attention_is_stable_for_huge_logits(rng):
    X = 1e4 * torch.randn(6, 3, generator=rng, dtype=torch.float64)
    W_Q, W_K, W_V = random_layer_weights(3, 3, rng)
    got = attention.softmax_attention(X, X, W_Q, W_K, W_V)
    expected = loop_softmax_attention(X, X, W_Q, W_K, W_V, 3**-0.5)
    assert torch.allclose(got, expected, rtol=1e-10, atol=1e-10 * float(expected.abs().max()))


def log_space_kernel_attention(queries_in, context, W_Q, W_K, W_V, omega, scale):
    """Positive-random-feature attention from the log-features, token by token: the score of query t
    and key j is logsumexp_r(log phi(q_t)_r + log phi(k_j)_r), normalised per query in log space."""
    def log_features(z):
        return z @ omega.T - 0.5 * (z * z).sum(-1, keepdim=True) - 0.5 * math.log(omega.shape[0])

    root = scale**0.5
    log_k = log_features(root * context @ W_K.T)
    outputs = []
    for query in queries_in:
        log_q = log_features(root * (W_Q @ query).unsqueeze(0))[0]
        log_scores = torch.stack([torch.logsumexp(log_q + key, 0) for key in log_k])
        weights = torch.exp(log_scores - torch.logsumexp(log_scores, 0))
        outputs.append(sum(w * (W_V @ key) for w, key in zip(weights, context)))
    return torch.stack(outputs)


def test_kernel_attention_with_exact_exponential_features_equals_softmax(rng):
    """With a feature map whose inner products are exactly exp(q.k) the two layers agree.

    For 1-dimensional q, k: exp(q k) = sum_n (q k)^n / n!, so phi(x)_n = x^n / sqrt(n!) is exact
    when the series is long enough.
    """
    X = torch.randn(5, 2, generator=rng, dtype=torch.float64) * 0.5
    W_Q, W_K, W_V = random_layer_weights(2, 1, rng)
    factorials = torch.tensor([float(math.factorial(n)) for n in range(30)], dtype=torch.float64)

    def taylor_features(x):
        return x ** torch.arange(30, dtype=x.dtype) / factorials.sqrt()

    got = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=taylor_features, scale=1.0)
    expected = attention.softmax_attention(X, X, W_Q, W_K, W_V, scale=1.0)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-14)


def test_log_space_stabilisation_does_not_change_the_output(rng):
    X = torch.randn(2, 9, 4, generator=rng, dtype=torch.float64)
    W_Q, W_K, W_V = random_layer_weights(4, 4, rng)
    feature_map = kernels.PositiveRandomFeatures(kernels.draw_omega(4, 64, generator=rng))
    stable = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=feature_map)
    plain = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=lambda x: feature_map(x))
    assert torch.allclose(stable, plain, rtol=1e-12, atol=1e-14)


def test_log_space_survives_inputs_whose_features_underflow(rng):
    X = 40 * torch.randn(6, 3, generator=rng, dtype=torch.float64)
    W_Q, W_K, W_V = random_layer_weights(3, 3, rng)
    omega = kernels.draw_omega(3, 2000, generator=rng)
    feature_map = kernels.PositiveRandomFeatures(omega)
    assert (feature_map(X @ W_K.T) == 0).all(dim=-1).any()  # some keys vanish in plain arithmetic
    output = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=feature_map)
    expected = log_space_kernel_attention(X, X, W_Q, W_K, W_V, omega, 3**-0.5)
    assert torch.allclose(output, expected, rtol=1e-10, atol=1e-12)


def test_queries_of_very_different_sizes_each_get_their_own_shift():
    """One log-feature shift for all queries would push the small query's scores to 0 (a zero
    normaliser); each query is shifted by its own largest log-feature."""
    g = generator(3)
    context = torch.randn(5, 3, generator=g, dtype=torch.float64)
    queries = torch.tensor([[0.1, 0.1, 0.1], [40.0, 40.0, 40.0]], dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)
    omega = kernels.draw_omega(3, 200, generator=g)
    output = attention.kernel_attention(queries, context, eye, eye, eye,
                                        feature_map=kernels.PositiveRandomFeatures(omega), scale=1.0)
    expected = log_space_kernel_attention(queries, context, eye, eye, eye, omega, 1.0)
    assert torch.allclose(output, expected, rtol=1e-10, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3), queries=st.integers(1, 4), context=st.integers(1, 9),
    d_in=st.integers(1, 6), d_out=st.integers(1, 5), seed=st.integers(0, 10_000),
)
def test_kernel_attention_rows_are_convex_weights(batch, queries, context, d_in, d_out, seed):
    g = generator(seed)
    X = torch.randn(batch, context, d_in, generator=g, dtype=torch.float64)
    Q = torch.randn(batch, queries, d_in, generator=g, dtype=torch.float64)
    W_Q, W_K, W_V = random_layer_weights(d_in, d_out, g)
    feature_map = kernels.PositiveRandomFeatures(kernels.draw_omega(d_out, 16, generator=g))
    weights = attention.kernel_attention_weights(Q, X, W_Q, W_K, feature_map=feature_map)
    assert weights.shape == (batch, queries, context)
    assert (weights >= 0).all()
    assert torch.allclose(weights.sum(-1), torch.ones(batch, queries, dtype=torch.float64), atol=1e-12)
    output = attention.kernel_attention(Q, X, W_Q, W_K, W_V, feature_map=feature_map)
    assert output.shape == (batch, queries, d_out)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_devices_and_dtypes(device, dtype):
    g = generator(0)
    X = torch.randn(5, 4, generator=g, dtype=dtype).to(device)
    W_Q, W_K, W_V = random_layer_weights(4, 4, g, dtype=dtype, device=device)
    feature_map = kernels.PositiveRandomFeatures(kernels.draw_omega(4, 32, generator=g, dtype=dtype, device=device))
    for output in (
        attention.softmax_attention(X, X, W_Q, W_K, W_V),
        attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=feature_map),
    ):
        assert output.dtype == dtype and output.device.type == device


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(W_Q=torch.ones(3, 5, dtype=torch.float64)), "W_Q"),
        (dict(W_K=torch.ones(4, 2, dtype=torch.float64)), "W_K"),
        (dict(W_V=torch.ones(4, 6, dtype=torch.float64)), "W_V"),
        (dict(context=torch.ones(5, 3, dtype=torch.float64)), "queries_in"),
        (dict(queries_in=torch.ones(3, dtype=torch.float64)), "queries_in"),
        (dict(context=torch.full((6, 4), float("inf"), dtype=torch.float64)), "context"),
        (dict(W_V=torch.ones(4, 4, dtype=torch.float32)), "W_V"),
        (dict(scale=-1.0), "scale"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    arguments = dict(
        queries_in=torch.ones(2, 4, dtype=torch.float64), context=torch.ones(6, 4, dtype=torch.float64),
        W_Q=torch.eye(4, dtype=torch.float64), W_K=torch.eye(4, dtype=torch.float64), W_V=torch.eye(4, dtype=torch.float64),
    )
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        attention.softmax_attention(**arguments)


def test_batched_attention_equals_each_prompt_alone(rng):
    """A batch of two prompts of very different sizes: each prompt's keys are shifted by their own
    largest log-feature, and the softmax form normalises over each prompt's keys."""
    X = torch.randn(2, 6, 3, generator=rng, dtype=torch.float64)
    X[1] += 60   # every key's log-features far below -745: a shift shared with prompt 0 underflows
    W_Q, W_K, W_V = random_layer_weights(3, 3, rng)
    omega = kernels.draw_omega(3, 500, generator=rng)
    got = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=kernels.PositiveRandomFeatures(omega))
    soft = attention.softmax_attention(X[:, :2], X, W_Q, W_K, W_V)
    for b in range(2):
        expected = log_space_kernel_attention(X[b], X[b], W_Q, W_K, W_V, omega, 3**-0.5)
        assert torch.allclose(got[b], expected, rtol=1e-10, atol=1e-12)
        assert torch.allclose(soft[b], loop_softmax_attention(X[b, :2], X[b], W_Q, W_K, W_V, 3**-0.5),
                              rtol=1e-12, atol=1e-14)


def test_uniform_feature_map_gives_uniform_weights_and_zero_features_are_refused():
    """phi(x) = (1 / sqrt(n),): every score is 1/n, so the normaliser is exactly 1 and each weight
    1/n; a map of zeros leaves the normaliser 0, which is refused by name."""
    X = torch.randn(4, 3, dtype=torch.float64)
    eye = torch.eye(3, dtype=torch.float64)

    def constant(x):
        return torch.full((*x.shape[:-1], 1), 0.5, dtype=x.dtype)

    weights = attention.kernel_attention_weights(X, X, eye, eye, feature_map=constant)
    assert torch.equal(weights, torch.full((4, 4), 0.25, dtype=torch.float64))
    with pytest.raises(ValueError, match="normaliser is zero"):
        attention.kernel_attention_weights(X, X, eye, eye, feature_map=lambda x: 0 * constant(x))


def test_context_and_query_errors_name_what_they_must_match():
    eye = torch.eye(3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^context must hold at least one token, got shape \(0, 3\)"):
        attention.softmax_attention(torch.ones(1, 3, dtype=torch.float64), torch.ones(0, 3, dtype=torch.float64), eye, eye, eye)
    with pytest.raises(ValueError, match=r"^queries_in has .*the token dimension of context \(3\)"):
        attention.softmax_attention(torch.ones(1, 2, dtype=torch.float64), torch.ones(4, 3, dtype=torch.float64), eye, eye, eye)
