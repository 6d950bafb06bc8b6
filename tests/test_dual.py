"""Theorem 3.1 and the dual model's interface."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DEVICES, random_layer_weights
from icl_lens import attention, dual, kernels
from icl_lens.device import generator


def setup(num_demos, num_queries, d_in, d_out, num_features, seed, dtype=torch.float64, device="cpu", batch=()):
    g = generator(seed)
    demos = (2 * torch.rand(*batch, num_demos, d_in, generator=g, dtype=dtype) - 1).to(device)
    queries = (2 * torch.rand(*batch, num_queries, d_in, generator=g, dtype=dtype) - 1).to(device)
    W_Q, W_K, W_V = random_layer_weights(d_in, d_out, g, dtype=dtype, device=device)
    omega = kernels.draw_omega(d_out, num_features, generator=g, dtype=dtype, device=device)
    return demos, queries, W_Q, W_K, W_V, kernels.PositiveRandomFeatures(omega)


def relative_error(a, b):
    return float((a - b).norm() / b.norm())


@settings(max_examples=30, deadline=None)
@given(
    num_demos=st.integers(1, 40), num_queries=st.integers(1, 5), d_in=st.integers(1, 8), d_out=st.integers(1, 8),
    num_features=st.integers(1, 300), lr=st.floats(1e-3, 10.0), seed=st.integers(0, 10_000),
    query_index=st.integers(-5, 4),
)
def test_theorem_3_1_holds_to_round_off(num_demos, num_queries, d_in, d_out, num_features, lr, seed, query_index):
    query_index = max(-num_queries, min(query_index, num_queries - 1))
    demos, queries, W_Q, W_K, W_V, phi = setup(num_demos, num_queries, d_in, d_out, num_features, seed)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, lr=lr, query_index=query_index)
    context = torch.cat([demos, queries])
    query = queries[query_index].unsqueeze(0)
    layer_output = attention.kernel_attention(query, context, W_Q, W_K, W_V, feature_map=phi)[0]
    assert relative_error(model.test_prediction(), layer_output) < 1e-10


def test_theorem_3_1_batched_and_any_feature_map():
    demos, queries, W_Q, W_K, W_V, _ = setup(15, 2, 12, 12, 10, seed=5, batch=(3,))
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, kernels.elu_feature_map)
    context = torch.cat([demos, queries], dim=-2)
    layer_output = attention.kernel_attention(queries[:, -1:], context, W_Q, W_K, W_V, feature_map=kernels.elu_feature_map)[:, 0]
    assert model.W0.shape == (3, 12, 12) and model.D.shape == (3,)
    assert relative_error(model.test_prediction(), layer_output) < 1e-10


def test_the_check_can_fail():
    """A dual model whose normaliser leaves out the query side does not match the layer."""
    demos, queries, W_Q, W_K, W_V, phi = setup(15, 1, 12, 12, 1200, seed=0)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi)
    wrong = dual.DualModel(**{**model.__dict__, "D": (model.train_features @ phi(model.test_input)).sum()})
    layer_output = attention.kernel_attention(queries, torch.cat([demos, queries]), W_Q, W_K, W_V, feature_map=phi)[0]
    assert relative_error(wrong.test_prediction(), layer_output) > 1e-3


def test_gradient_matches_autograd_and_loss_is_linear():
    demos, queries, W_Q, W_K, W_V, phi = setup(10, 2, 6, 5, 50, seed=1)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, lr=0.3)
    for W in (model.W0, torch.randn(model.W0.shape, dtype=torch.float64, generator=generator(9))):
        W = W.clone().requires_grad_(True)
        model.loss(W).backward()
        assert relative_error(W.grad, model.grad(W)) < 1e-12
    # linear: L(W0 + t G) = L(W0) + t <grad, G>
    G = torch.randn(model.W0.shape, dtype=torch.float64, generator=generator(3))
    lhs = model.loss(model.W0 + 2.5 * G)
    rhs = model.loss(model.W0) + 2.5 * (model.grad() * G).sum()
    assert abs(float(lhs - rhs)) < 1e-12 * max(1.0, abs(float(lhs)))


def test_step_does_not_depend_on_lr():
    demos, queries, W_Q, W_K, W_V, phi = setup(8, 1, 4, 4, 40, seed=2)
    steps = [dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, lr=lr).step() for lr in (0.01, 1.0, 50.0)]
    assert all(relative_error(step, steps[0]) < 1e-12 for step in steps)


def test_sgd_trajectory_reaches_the_full_step_exactly_at_step_n():
    demos, queries, W_Q, W_K, W_V, phi = setup(15, 1, 12, 12, 1200, seed=4)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi)
    trajectory = model.sgd_trajectory()
    assert trajectory.shape == (16, 12, 1200)
    assert torch.equal(trajectory[0], model.W0)
    assert relative_error(trajectory[-1], model.step()) < 1e-13
    target = model.test_prediction()
    errors = torch.stack([((model.predict(W, model.test_input) - target) ** 2).sum() for W in trajectory])
    assert errors[-1] < 1e-24 * errors[0]
    assert (errors[:-1] > 1e-12 * errors[0]).all()


def test_training_set_and_shapes():
    demos, queries, W_Q, W_K, W_V, phi = setup(5, 3, 4, 3, 20, seed=6)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, query_index=1)
    root = 3**-0.25
    assert torch.allclose(model.train_inputs, root * demos @ W_K.T)
    assert torch.allclose(model.train_features, phi(model.train_inputs))
    assert torch.allclose(model.train_labels, demos @ W_V.T)
    assert torch.allclose(model.test_input, root * queries[1] @ W_Q.T)
    assert model.W0.shape == (3, 20) and model.D.shape == ()


@pytest.mark.parametrize("device", DEVICES)
def test_float32_and_devices(device):
    demos, queries, W_Q, W_K, W_V, phi = setup(15, 1, 12, 12, 1200, seed=7, dtype=torch.float32, device=device)
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi)
    layer_output = attention.kernel_attention(queries, torch.cat([demos, queries]), W_Q, W_K, W_V, feature_map=phi)[0]
    assert model.test_prediction().dtype == torch.float32
    assert model.test_prediction().device.type == device
    assert relative_error(model.test_prediction(), layer_output) < 1e-5


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(demos=torch.ones(0, 4, dtype=torch.float64)), "demos"),
        (dict(queries=torch.ones(4, dtype=torch.float64)), "queries"),
        (dict(demos=torch.ones(3, 5, dtype=torch.float64)), "demos"),
        (dict(query_index=3), "query_index"),
        (dict(lr=0.0), "lr"),
        (dict(W_K=torch.ones(2, 4, dtype=torch.float64)), "W_Q"),
        (dict(queries=torch.tensor([[float("nan")] * 4], dtype=torch.float64)), "queries"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    g = generator(0)
    arguments = dict(
        demos=torch.rand(3, 4, generator=g, dtype=torch.float64), queries=torch.rand(2, 4, generator=g, dtype=torch.float64),
        W_Q=torch.eye(4, dtype=torch.float64), W_K=torch.eye(4, dtype=torch.float64), W_V=torch.eye(4, dtype=torch.float64),
        feature_map=kernels.elu_feature_map,
    )
    arguments.update(change)
    with pytest.raises(ValueError, match=message):
        dual.dual_model(**arguments)


def test_token_spread_leaves_the_query_out():
    """Collapsed demonstrations with a distinct query: spread 0 (counting the query would give 0.67).
    Demonstrations [0], [2]: distances to their mean 1 and 1, norms 0 and 2, so spread 1 / 1 = 1."""
    collapsed = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 5.0]], dtype=torch.float64)
    assert dual.token_spread(collapsed) == 0.0
    spread = dual.token_spread(torch.tensor([[0.0], [2.0], [100.0]], dtype=torch.float64))
    assert abs(spread - 1.0) < 1e-15


def test_a_temperature_and_learning_rate_reach_every_dual_form():
    """scale = 2 (not the default 1/sqrt(d_o)) and lr = 0.3 passed through dual_model, Theorem B.1's
    and Theorem B.2's constructions, against kernel attention computed directly with that scale."""
    demos, queries, W_Q, W_K, W_V, phi = setup(6, 3, 4, 4, 80, seed=11)
    context = torch.cat([demos, queries])
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, query_index=1, lr=0.3, scale=2.0)
    layer = attention.kernel_attention(queries[1:2], context, W_Q, W_K, W_V, feature_map=phi, scale=2.0)[0]
    assert model.lr == 0.3 and relative_error(model.test_prediction(), layer) < 1e-10
    # an FFN after the layer: W_2 relu(W_1 h + b_1) + b_2 of that same output
    g = generator(12)
    W_1, W_2 = torch.randn(6, 4, generator=g, dtype=torch.float64), torch.randn(4, 6, generator=g, dtype=torch.float64)
    b_1, b_2 = torch.randn(6, generator=g, dtype=torch.float64), torch.randn(4, generator=g, dtype=torch.float64)
    full = dual.transformer_layer_dual(demos, queries, W_Q, W_K, W_V, W_1, b_1, W_2, b_2, phi, query_index=1,
                                       lr=0.3, scale=2.0)
    assert full.lr == 0.3
    expected = torch.relu(layer @ W_1.T + b_1) @ W_2.T + b_2
    assert relative_error(full.test_prediction(), expected) < 1e-10
    # Eq. (21): -1/(lr D) sum_i (W_F W_V x_i) . (W phi(z_i) + b)
    loss = -sum(float(full.train_labels[i] @ (full.W0 @ full.train_features[i] + full.bias)) for i in range(6))
    assert float(full.loss(full.W0)) == pytest.approx(loss / (0.3 * float(full.D)), rel=1e-12)
    # Theorem B.2 with the same scale: every layer's hidden states are the direct forward pass's
    tokens = torch.cat([demos, queries[:1]])
    direct = dual.prefix_lm_forward(tokens, [(W_Q, W_K, W_V)] * 2, [phi, phi], scale=2.0)
    by_hand = attention.kernel_attention(tokens[:-1], tokens[:-1], W_Q, W_K, W_V, feature_map=phi, scale=2.0)
    assert relative_error(direct[1][:-1], by_hand) < 1e-12
    stack = dual.stacked_duals(tokens, [(W_Q, W_K, W_V)] * 2, [phi, phi], lr=0.3, scale=2.0)
    for l, layer_l in enumerate(stack):
        assert layer_l.dual.lr == 0.3 and relative_error(layer_l.hidden, direct[l + 1]) < 1e-10
        assert layer_l.demo_normalisers.shape == (6,)


def test_step_and_prediction_from_a_given_weight_and_the_loss_against_a_loop():
    demos, queries, W_Q, W_K, W_V, phi = setup(5, 1, 3, 3, 20, seed=13, batch=(2,))
    model = dual.dual_model(demos, queries, W_Q, W_K, W_V, phi, lr=0.5)
    W = torch.randn(model.W0.shape, generator=generator(14), dtype=torch.float64)
    # L is linear with gradient -1/(lr D) sum_i y_i phi_i^T: one step from W adds 1/D sum_i y_i phi_i^T
    update = torch.stack([sum(torch.outer(model.train_labels[b, i], model.train_features[b, i]) for i in range(5)) / model.D[b]
                          for b in range(2)])
    assert torch.allclose(model.step(W), W + update, rtol=1e-12, atol=1e-14)
    prediction = torch.stack([W[b] @ phi(model.test_input[b]) for b in range(2)])
    assert torch.allclose(model.test_prediction(W), prediction, rtol=1e-12, atol=1e-14)
    loss = [-sum(float(model.train_labels[b, i] @ (W[b] @ model.train_features[b, i])) for i in range(5))
            / (0.5 * float(model.D[b])) for b in range(2)]
    assert torch.allclose(model.loss(W), torch.tensor(loss, dtype=torch.float64), rtol=1e-12, atol=0)


def test_token_spread_batched_closed_form():
    """Two prompts of demonstrations [0, 0], [2, 0] (spread (1 + 1) / 2 over (0 + 2) / 2 = 1) and
    [0, 0], [0, 6]: the same spread for each, so the mean over both is 1 too."""
    H = torch.tensor([[[0.0, 0.0], [2.0, 0.0], [9.0, 9.0]], [[0.0, 0.0], [0.0, 6.0], [9.0, 9.0]]], dtype=torch.float64)
    assert dual.token_spread(H) == pytest.approx(1.0, rel=1e-15)
    assert dual.token_spread(torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 0.0]], dtype=torch.float64)) == \
        pytest.approx(1.0 / ((2**0.5 + 10**0.5) / 2), rel=1e-15)
