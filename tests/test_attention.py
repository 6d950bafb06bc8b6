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
    assert torch.isfinite(attention.softmax_attention(X, X, W_Q, W_K, W_V)).all()


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
    feature_map = kernels.PositiveRandomFeatures(kernels.draw_omega(3, 2000, generator=rng))
    assert (feature_map(X @ W_K.T) == 0).all(dim=-1).any()  # some keys vanish in plain arithmetic
    output = attention.kernel_attention(X, X, W_Q, W_K, W_V, feature_map=feature_map)
    assert torch.isfinite(output).all()


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
