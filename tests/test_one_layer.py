"""One implementation of each modification for both regression protocols (#40 item 1): the prompt
layer (a new task per prompt) with a Modification gives the Section 5 ensemble's numbers on the same
weights, and moving the modifications into shared functions changed no bit of either layer."""

import math
from dataclasses import replace

import pytest
import torch

from icl_lens.attention import kernel_attention_weights
from icl_lens.kernels import PositiveRandomFeatures
from icl_lens.studies import section5
from icl_lens.studies.across_tasks import PromptDistribution
from icl_lens.training import ensemble as ensemble_module
from icl_lens.training.ensemble import AttentionEnsemble, LayerConfig, Modification
from icl_lens.training.prompt_layer import PromptAttentionLayer, PromptLayerConfig, train_layer

D = 6
MODIFICATIONS = [Modification(), Modification(alpha=0.3), Modification(alpha=-0.2, alpha_form="constant"),
                 Modification(alpha=0.4, renormalise=False), Modification(value_map="gelu"),
                 Modification(key_map="mlp-elu"), Modification(value_map="mlp-gelu", key_map="gelu"),
                 Modification(negative_k=3, beta=0.1),
                 Modification(alpha=0.1, key_map="gelu", negative_k=2, beta=0.3)]
KERNELS = {"softmax": "softmax", "random-features": "performer"}


def twins(attention, layer_modification, ensemble_modification=None, heads=1):
    """A prompt layer and a one-model ensemble holding the layer's weights (float64)."""
    layer = PromptAttentionLayer(D, PromptLayerConfig(attention=attention, num_features=50, init_std=0.4, heads=heads),
                                 modification=layer_modification, dtype=torch.float64)
    ensemble = AttentionEnsemble(LayerConfig(token_dim=D, num_features=50, kernel=KERNELS[attention]),
                                 [ensemble_modification or layer_modification], [0], dtype=torch.float64)
    with torch.no_grad():
        for name, parameter in layer.named_parameters():
            getattr(ensemble, name)[0] = parameter[0]
        if layer.omega is not None:
            ensemble.omega[0] = layer.omega
    return layer, ensemble


@pytest.mark.parametrize("attention", list(KERNELS))
@pytest.mark.parametrize("modification", MODIFICATIONS, ids=lambda m: m.name)
def test_the_prompt_layer_with_a_modification_is_the_ensembles_layer(attention, modification):
    layer, ensemble = twins(attention, modification)
    tokens = torch.randn(5, 9, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    ours, theirs = layer(tokens), ensemble(tokens.unsqueeze(0))[0, :, -1]
    assert torch.allclose(ours, theirs, rtol=0, atol=1e-13)
    # and the query's weight on itself is the ensemble's, after the modification
    weights = ensemble.attend(tokens.unsqueeze(0))[0][0, :, -1]
    assert torch.allclose(layer.query_weight(tokens), weights, rtol=0, atol=1e-13)


@pytest.mark.parametrize("ours, theirs", [(Modification(alpha=0.3), Modification(alpha=0.31)),
                                          (Modification(negative_k=3, beta=0.1), Modification(negative_k=2, beta=0.1)),
                                          (Modification(key_map="mlp-elu"), Modification(key_map="mlp-gelu")),
                                          (Modification(value_map="gelu"), Modification(key_map="gelu"))])
def test_the_comparison_fails_on_another_modification(ours, theirs):
    layer, ensemble = twins("softmax", ours, theirs)
    tokens = torch.randn(5, 9, D, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert (layer(tokens) - ensemble(tokens.unsqueeze(0))[0, :, -1]).abs().max() > 1e-6


def test_heads_are_modified_each_with_its_own_weights():
    """Two heads: the sum of two one-head layers holding each head's weights."""
    modification = Modification(alpha=0.2, value_map="gelu", negative_k=2, beta=0.2)
    both = PromptAttentionLayer(D, PromptLayerConfig(attention="softmax", heads=2), modification=modification,
                                dtype=torch.float64)
    tokens = torch.randn(4, 7, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    total = 0
    for head in range(2):
        one = PromptAttentionLayer(D, PromptLayerConfig(attention="softmax"), modification=modification,
                                   dtype=torch.float64)
        with torch.no_grad():
            for name, parameter in one.named_parameters():
                parameter.copy_(getattr(both, name)[head : head + 1])
        total = total + one(tokens)
    assert torch.allclose(both(tokens), total, rtol=0, atol=1e-13)


# ---- the code before the modifications were shared, kept here as the reference -------------------

def regularize_before(self, weights):
    alpha = self.alpha[:, None]
    own = weights[..., -1]
    own = torch.where(self.alpha_constant[:, None], own - alpha, own * (1 - alpha))
    weights = torch.cat([weights[..., :-1], own.unsqueeze(-1)], dim=-1)
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(self.renormalise[:, None, None], weights / total, weights)


def negative_neighbours_before(self, tokens, k):
    n, k_max = tokens.shape[-2], self.max_negative_k
    with torch.no_grad():
        logits = ensemble_module.batched_linear(tokens, self.W_Q[self.negative_models]) @ k.transpose(-1, -2)
        logits = logits.masked_fill(torch.eye(n, dtype=torch.bool, device=logits.device), math.inf)
        return torch.topk(logits, k_max, dim=-1, largest=False, sorted=True).indices


def with_negatives_before(self, tokens, k):
    chosen = self.negative_models
    sub_tokens, sub_k = tokens[chosen], k[chosen]
    index = negative_neighbours_before(self, sub_tokens, sub_k)
    M, B, n, k_max = index.shape
    gathered = sub_tokens.gather(2, index.reshape(M, B, n * k_max, 1).expand(-1, -1, -1, tokens.shape[-1]))
    gathered = gathered.reshape(M, B, n, k_max, -1)
    count = self.negative_k[chosen]
    used = torch.arange(k_max, device=tokens.device) < count[:, None]
    weight = used.to(tokens.dtype) * (self.beta[chosen] / count)[:, None]
    shifted = sub_tokens - (gathered * weight[:, None, None, :, None]).sum(-2)
    shifted = torch.cat([shifted[..., :-1, :], sub_tokens[..., -1:, :]], dim=-2)
    return tokens.index_copy(0, chosen, shifted)


def prompt_weights_before(self, queries, tokens):
    found = []
    for W_Q, W_K in zip(self.W_Q, self.W_K):
        if self.attention == "random-features":
            found.append(kernel_attention_weights(queries, tokens, W_Q, W_K, feature_map=PositiveRandomFeatures(self.omega)))
        else:
            scores = (queries @ W_Q.T @ W_K) @ tokens.transpose(-1, -2)
            if self.attention == "linear":
                found.append(scores / (tokens.shape[-2] - 1))
            else:
                found.append(torch.softmax(scores / math.sqrt(W_K.shape[0]), dim=-1))
    return found


def prompt_attend_before(self, queries, tokens):
    return torch.stack([(weights @ tokens) @ W_V.T for weights, W_V in zip(self.weights(queries, tokens), self.W_V)])


def outputs_and_gradients(ensemble, tokens, targets):
    ensemble.zero_grad()
    errors = ensemble_module.squared_errors(ensemble, tokens, targets)
    errors.sum().backward()
    return [errors.detach()] + [p.grad.clone() for p in ensemble.parameters()]


def test_the_section5_ensemble_is_bit_for_bit_what_it_was(monkeypatch):
    """Every linear-task variant (alpha in both readings, the maps, negatives, combinations, ridge)
    in float32: losses and gradients of one step equal bit for bit under the code as it was."""
    config = section5.linear_experiment(deciding=1)
    variants = [v.modification for v in config.variants()]
    layer = LayerConfig(token_dim=config.task.token_dim, num_features=64)
    tokens = torch.randn(len(variants), 8, config.task.num_tokens, config.task.token_dim,
                         generator=torch.Generator().manual_seed(0))
    targets = torch.randn(len(variants), 8, 1, generator=torch.Generator().manual_seed(1))
    now = outputs_and_gradients(AttentionEnsemble(layer, variants, [0] * len(variants)), tokens, targets)
    monkeypatch.setattr(AttentionEnsemble, "regularize", regularize_before)
    monkeypatch.setattr(AttentionEnsemble, "with_negatives", with_negatives_before)
    before = outputs_and_gradients(AttentionEnsemble(layer, variants, [0] * len(variants)), tokens, targets)
    assert len(now) == len(before) and all(torch.equal(a, b) for a, b in zip(now, before))
    # the comparison can fail: one negative-sample weight moved by one float32 step
    monkeypatch.undo()
    moved = [replace(v, beta=float(torch.nextafter(torch.tensor(v.beta), torch.tensor(1.0)))) if v.negative_k else v
             for v in variants]
    other = outputs_and_gradients(AttentionEnsemble(layer, moved, [0] * len(variants)), tokens, targets)
    assert not all(torch.equal(a, b) for a, b in zip(other, before))


@pytest.mark.parametrize("attention", ["linear", "softmax", "random-features"])
def test_the_plain_prompt_layer_trains_bit_for_bit_as_it_did(attention, monkeypatch):
    """The across-tasks and Li et al. layer without a modification: a short run's record and weights
    equal, bit for bit, those of the code before modifications were added."""
    config = PromptLayerConfig(attention=attention, steps=12, batch=8, test_prompts=32, checkpoints=3,
                               schedule="decay")
    task = PromptDistribution.paper_linear()
    layer_now, now = train_layer(task, config)
    layer_plain, plain = train_layer(task, config, modification=Modification())
    monkeypatch.setattr(PromptAttentionLayer, "weights", prompt_weights_before)
    monkeypatch.setattr(PromptAttentionLayer, "attend", prompt_attend_before)
    layer_before, before = train_layer(task, config)
    assert now == before == plain
    assert [n for n, _ in layer_now.named_parameters()] == ["W_Q", "W_K", "W_V"]
    for a, b in zip(layer_now.parameters(), layer_before.parameters()):
        assert torch.equal(a, b)


def test_a_modified_prompt_layer_trains_its_maps():
    modification = Modification(alpha=0.1, key_map="mlp-gelu", value_map="mlp-elu", negative_k=3, beta=0.1)
    config = PromptLayerConfig(attention="random-features", steps=10, batch=8, test_prompts=32, checkpoints=2)
    start = PromptAttentionLayer(12, config, modification=modification)
    layer, record = train_layer(PromptDistribution.paper_linear(), config, modification=modification)
    names = [n for n, _ in layer.named_parameters()]
    assert names == ["W_Q", "W_K", "W_V", "value_W1", "value_b1", "value_W2", "value_b2",
                     "key_W1", "key_b1", "key_W2", "key_b2"]
    for name in names:   # every weight, the maps' included, moved
        assert not torch.equal(getattr(layer, name), getattr(start, name)), name
    assert all(math.isfinite(x) for x in record["loss"])


def test_the_prompt_layer_refuses_what_it_cannot_carry():
    with pytest.raises(ValueError, match="modification must be a Modification"):
        PromptAttentionLayer(D, PromptLayerConfig(), modification="g2")
    with pytest.raises(ValueError, match="ridge"):
        PromptAttentionLayer(D, PromptLayerConfig(attention="softmax"), modification=Modification(ridge=0.1))
    with pytest.raises(ValueError, match="renormalise=False"):
        PromptAttentionLayer(D, PromptLayerConfig(attention="linear"), modification=Modification(alpha=0.1))
    PromptAttentionLayer(D, PromptLayerConfig(attention="linear"), modification=Modification(alpha=0.1, renormalise=False))
    layer = PromptAttentionLayer(D, PromptLayerConfig(attention="softmax"), modification=Modification(alpha=0.1))
    tokens = torch.randn(2, 5, D)
    with pytest.raises(ValueError, match="read at the query only"):
        layer.attend(tokens, tokens)
    negative = PromptAttentionLayer(D, PromptLayerConfig(attention="softmax"),
                                    modification=Modification(negative_k=5, beta=0.1))
    with pytest.raises(ValueError, match="negative_k=5 needs more than 5 tokens"):
        negative(tokens)
