"""Theorem B.1 (Transformer layer), Theorem B.2 (stacked layers) and the Appendix F constructions."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import random_layer_weights
from icl_lens import attention, constructions, dual, kernels
from icl_lens.device import generator
from icl_lens.studies.ffn_rank import RankConfig, rank_bound, uniform_linear


def relative_error(a, b):
    return float((a - b).norm() / b.norm())


def transformer_setup(num_demos, d, hidden, num_features, seed, batch=()):
    g = generator(seed)
    tokens = 2 * torch.rand(*batch, num_demos + 1, d, generator=g, dtype=torch.float64) - 1
    W_Q, W_K, W_V = random_layer_weights(d, d, g)
    W_1, b_1 = uniform_linear(hidden, d, g)
    W_2, b_2 = uniform_linear(d, hidden, g)
    phi = kernels.PositiveRandomFeatures(kernels.draw_omega(d, num_features, generator=g))
    return tokens, (W_Q, W_K, W_V), (W_1, b_1, W_2, b_2), phi


@settings(max_examples=25, deadline=None)
@given(num_demos=st.integers(1, 30), d=st.integers(1, 8), hidden=st.integers(1, 40),
       num_features=st.integers(1, 200), lr=st.floats(1e-2, 5.0), seed=st.integers(0, 10_000))
def test_theorem_b_1(num_demos, d, hidden, num_features, lr, seed):
    tokens, attn, ffn, phi = transformer_setup(num_demos, d, hidden, num_features, seed)
    model = dual.transformer_layer_dual(tokens[:-1], tokens[-1:], *attn, *ffn, phi, lr=lr)
    h = attention.kernel_attention(tokens[-1:], tokens, *attn, feature_map=phi)
    target = dual.feed_forward(h, *ffn)[0]
    if target.norm() > 1e-8:
        assert relative_error(model.test_prediction(), target) < 1e-10
    else:
        assert (model.test_prediction() - target).norm() < 1e-12
    assert model.relu_mask.shape == (hidden,)
    assert int(torch.linalg.matrix_rank(model.W_F)) <= min(d, int(model.relu_mask.sum()))


def test_theorem_b_1_batched_gradient_and_sgd():
    tokens, attn, ffn, phi = transformer_setup(15, 12, 48, 300, seed=1, batch=(2,))
    model = dual.transformer_layer_dual(tokens[..., :-1, :], tokens[..., -1:, :], *attn, *ffn, phi, lr=0.7)
    h = attention.kernel_attention(tokens[..., -1:, :], tokens, *attn, feature_map=phi)
    target = dual.feed_forward(h, *ffn)[:, 0]
    assert relative_error(model.test_prediction(), target) < 1e-10
    W = model.W0.clone().requires_grad_(True)
    model.loss(W).sum().backward()
    assert relative_error(W.grad, model.grad()) < 1e-12
    trajectory = model.sgd_trajectory()
    assert relative_error(model.predict(trajectory[-1], model.test_input), target) < 1e-10


def test_wrong_bias_is_detected():
    tokens, attn, ffn, phi = transformer_setup(15, 6, 20, 100, seed=2)
    model = dual.transformer_layer_dual(tokens[:-1], tokens[-1:], *attn, *ffn, phi)
    target = dual.feed_forward(attention.kernel_attention(tokens[-1:], tokens, *attn, feature_map=phi), *ffn)[0]
    shifted = dual.TransformerLayerDual(**{**model.__dict__, "bias": ffn[3]})  # b_2 instead of b_F
    assert relative_error(shifted.test_prediction(), target) > 1e-3


def test_feed_forward_shapes_are_checked():
    tokens, attn, (W_1, b_1, W_2, b_2), phi = transformer_setup(3, 4, 6, 10, seed=0)
    with pytest.raises(ValueError, match="W_2"):
        dual.transformer_layer_dual(tokens[:-1], tokens[-1:], *attn, W_1, b_1, W_2.T, b_2, phi)
    with pytest.raises(ValueError, match="b_1"):
        dual.transformer_layer_dual(tokens[:-1], tokens[-1:], *attn, W_1, b_1[:-1], W_2, b_2, phi)


@settings(max_examples=15, deadline=None)
@given(num_layers=st.integers(1, 5), num_demos=st.integers(1, 20), d=st.integers(1, 8), seed=st.integers(0, 10_000))
def test_theorem_b_2_every_token_every_layer(num_layers, num_demos, d, seed):
    g = generator(seed)
    tokens = 2 * torch.rand(num_demos + 1, d, generator=g, dtype=torch.float64) - 1
    layers = [random_layer_weights(d, d, g) for _ in range(num_layers)]
    feature_maps = [kernels.PositiveRandomFeatures(kernels.draw_omega(d, 64, generator=g)) for _ in range(num_layers)]
    direct = dual.prefix_lm_forward(tokens, layers, feature_maps)
    stack = dual.stacked_duals(tokens, layers, feature_maps)
    assert len(stack) == num_layers and len(direct) == num_layers + 1
    for l, layer in enumerate(stack):
        assert relative_error(layer.hidden, direct[l + 1]) < 1e-10
        assert relative_error(layer.query_output, direct[l + 1][-1]) < 1e-10


def test_prefix_lm_masking_demos_ignore_the_query():
    g = generator(3)
    tokens = torch.rand(6, 4, generator=g, dtype=torch.float64)
    layers = [random_layer_weights(4, 4, g)]
    feature_maps = [kernels.elu_feature_map]
    changed = tokens.clone()
    changed[-1] += 1.0
    first = dual.prefix_lm_forward(tokens, layers, feature_maps)[1]
    second = dual.prefix_lm_forward(changed, layers, feature_maps)[1]
    assert torch.allclose(first[:-1], second[:-1])
    assert not torch.allclose(first[-1], second[-1])


def test_stack_arguments_are_checked():
    tokens = torch.rand(5, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="feature_maps"):
        dual.stacked_duals(tokens, [random_layer_weights(4, 4, generator(0))], [])
    with pytest.raises(ValueError, match=r"layers\[0\] W_K"):
        dual.stacked_duals(tokens, [(torch.eye(4), torch.eye(3), torch.eye(4))], [kernels.elu_feature_map])
    with pytest.raises(ValueError, match="tokens"):
        dual.prefix_lm_forward(tokens[:1], [random_layer_weights(4, 4, generator(0))], [kernels.elu_feature_map])


@settings(max_examples=30, deadline=None)
@given(N=st.integers(1, 50), d=st.integers(1, 8), lr=st.floats(1e-3, 3.0), seed=st.integers(0, 10_000))
def test_von_oswald_construction_equals_one_gd_step(N, d, lr, seed):
    g = generator(seed)
    x = torch.randn(N, d, generator=g, dtype=torch.float64)
    y = torch.randn(N, generator=g, dtype=torch.float64)
    query = torch.randn(d, generator=g, dtype=torch.float64)
    gd = constructions.gd_one_step_prediction(x, y, query, lr)
    lsa = constructions.von_oswald_lsa_prediction(x, y, query, lr)
    assert abs(float(gd - lsa)) <= 1e-10 * max(1.0, abs(float(gd)))
    # and the GD step is what autograd gives
    w = torch.zeros(d, dtype=torch.float64, requires_grad=True)
    (((x @ w - y) ** 2).sum() / (2 * N)).backward()
    assert abs(float(query @ (-lr * w.grad)) - float(gd)) <= 1e-10 * max(1.0, abs(float(gd)))


def test_gd_prediction_from_a_start_and_errors():
    x = torch.eye(2, dtype=torch.float64)
    y = torch.tensor([1.0, 2.0], dtype=torch.float64)
    w0 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    # residuals (0, -2): w1 = w0 - lr/2 * (0 * e1 - 2 e2) = (1, lr)
    assert float(constructions.gd_one_step_prediction(x, y, torch.tensor([0.0, 1.0], dtype=torch.float64), 0.5, w0)) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="y_context"):
        constructions.gd_one_step_prediction(x, y[:1], x[0], 0.1)
    with pytest.raises(ValueError, match="x_query"):
        constructions.von_oswald_lsa_prediction(x, y, x, 0.1)
    with pytest.raises(ValueError, match="lr"):
        constructions.gd_one_step_prediction(x, y, x[0], -1.0)


def test_dual_optimum_is_on_the_ball_and_maximises():
    g = generator(4)
    x = torch.randn(30, 3, generator=g, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    W_star = constructions.dual_optimum(x, y, radius=2.0)
    assert abs(float(W_star.norm()) - 2.0) < 1e-12
    M = torch.zeros(4, 4, dtype=torch.float64)
    M[3, :3] = y @ x / 30
    best = float((M * W_star).sum())
    for _ in range(50):
        other = torch.randn(4, 4, generator=g, dtype=torch.float64)
        other = 2.0 * other / other.norm()
        assert float((M * other).sum()) <= best + 1e-12


def test_rank_bound_quick():
    result = rank_bound(RankConfig(hidden_sizes=(2, 64), num_prompts=32, repeats=2, num_features=64))
    assert result["mean_bound"][0] <= 2 and result["mean_bound"][1] == 12.0


def test_symbolic_checks_of_the_remaining_identities_and_their_failures():
    """Eqs. (3)-(4), (14), (15), (25) and the regularized self-attention form hold exactly, and
    each check fails on a wrong input."""
    from icl_lens import symbolic

    linear = symbolic.linear_attention_dual()
    assert symbolic.is_zero_matrix(linear["step_residual"]) and symbolic.is_zero_matrix(linear["prediction_residual"])
    assert not symbolic.is_zero_matrix(symbolic.linear_attention_dual(signal_sign=1)["prediction_residual"])
    assert all(symbolic.is_zero_matrix(r) for r in symbolic.stacked_demo_outputs())
    assert not all(symbolic.is_zero_matrix(r) for r in symbolic.stacked_demo_outputs(rescale=False))
    assert symbolic.is_zero_matrix(symbolic.augmented_dual())
    assert not symbolic.is_zero_matrix(symbolic.augmented_dual(augment_query_side=False))
    assert symbolic.negative_sample_dual() == 0
    assert symbolic.negative_sample_dual(score_neighbours=((2,), (2,), (0, 1))) != 0
    assert symbolic.is_zero_matrix(symbolic.regularized_self_attention())
    assert not symbolic.is_zero_matrix(symbolic.regularized_self_attention(form="constant"))


def test_rank_growth_check_and_token_spread_can_fail():
    from icl_lens import dual
    from icl_lens.studies import ffn_rank

    assert ffn_rank.grows_within_noise([2.0, 5.0, 9.0, 12.0], [0.5] * 4, repeats=5)
    assert ffn_rank.grows_within_noise([2.0, 5.0, 4.8, 12.0], [0.5] * 4, repeats=5)        # within noise
    assert not ffn_rank.grows_within_noise([2.0, 7.7, 6.4, 12.0], [0.5] * 4, repeats=5)    # a real drop
    distinct = torch.eye(5, dtype=torch.float64)
    collapsed = torch.ones(5, 5, dtype=torch.float64) + 1e-12 * distinct
    assert dual.token_spread(distinct) > 0.5 and dual.token_spread(collapsed) < 1e-9


def test_trained_transformer_layers_equal_their_dual_models_at_step_n():
    """Fig. 14 (left) on layers the rank study trains: each Theorem B.1 dual model reaches its
    layer's output at step N, and not before (the equivalence curve is measured, not assumed)."""
    from icl_lens.studies import ffn_rank, section5_claims

    config = ffn_rank.TrainedRankConfig(hidden_sizes=(4, 33), seeds=(0, 1), epochs=1, tokens_per_epoch=512,
                                        num_prompts=16)
    rank = ffn_rank.trained_rank_bound(config)
    assert len(rank["equivalence"]) == 4
    for curve in rank["equivalence"].values():
        errors = curve["squared_error"]
        assert errors[-1] < 1e-24 * max(1.0, errors[0]) and min(errors[:-1]) > 1e-12 * errors[0]
    assert section5_claims.transformer_equivalence_claim(rank)["verdict"] == "agrees"
