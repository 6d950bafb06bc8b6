"""Does a trained layer use its context? Five measurements with the layer's own forward pass and
one of its weights.

Chapters: experiments.

R&L train one attention layer per seed on one fixed task (Sec. 5). Such a layer can predict the
query's label without reading the demonstrations: it can store the task weight W in W_V and
apply it to the query's own token. These measurements tell the two apart, on a layer's test
prompts:

    intact             test loss with the prompt as drawn
    other_task_labels  test loss with the demonstrations' labels replaced by those another task
                       weight gives on the same inputs (the query's target unchanged)
    shuffled_labels    test loss with the demonstrations' labels permuted within each prompt
    query_alone        test loss with the query token alone (every kernel then gives it weight 1)
    query_weight       the attention weight of the query on its own token, mean over the prompts
    label_row_cosine   cosine between W_V's label row (its input columns) and the task weight

Losses are divided by the label variance (1: no better than predicting the mean). A layer that
ignores its context has other_task_labels = shuffled_labels = query_alone = intact; one that reads
it, as one gradient step does, is hurt by the first two and cannot predict from the query alone.
"""

import torch

MEASURES = {
    "intact": "test loss / label variance, prompt as drawn",
    "other_task_labels": "the same, demonstrations' labels from another task weight",
    "shuffled_labels": "the same, demonstrations' labels permuted within each prompt",
    "query_alone": "the same, the query token alone",
    "query_weight": "attention weight of the query on itself (mean over prompts)",
    "label_row_cosine": "cosine of W_V's label row with the task weight",
}


def with_demonstration_labels(tokens, labels):
    """``tokens`` (..., n, d) with the demonstrations' labels, the last ``labels.shape[-1]``
    coordinates of the first n - 1 rows, replaced by ``labels`` (..., n - 1, d_s)."""
    output_dim = labels.shape[-1]
    demonstrations = torch.cat([tokens[..., :-1, :-output_dim], labels.to(tokens.dtype)], dim=-1)
    return torch.cat([demonstrations, tokens[..., -1:, :]], dim=-2)


def shuffled_labels(tokens, order, output_dim):
    """The demonstrations' labels of ``tokens`` permuted by ``order`` (..., n - 1) within each prompt."""
    labels = tokens[..., :-1, -output_dim:]
    return with_demonstration_labels(tokens, labels.gather(-2, order.unsqueeze(-1).expand(*order.shape, output_dim)))


def random_orders(num_prompts, num_demonstrations, generator):
    """One random permutation of the demonstrations per prompt, (num_prompts, num_demonstrations)."""
    return torch.argsort(torch.rand(num_prompts, num_demonstrations, generator=generator, dtype=torch.float64), dim=-1)


def label_row_cosine(W_V, task_weight):
    """Cosine between the label rows of W_V (..., d, d), their input columns, and the task weight
    (..., d_s, d_t), flattened over the label rows."""
    output_dim, input_dim = task_weight.shape[-2:]
    row = W_V[..., -output_dim:, :input_dim].flatten(-2).double()
    weight = task_weight.flatten(-2).double().to(row.device)
    return torch.nn.functional.cosine_similarity(row, weight, dim=-1)


def measure(predict, query_weight, tokens, targets, *, other_labels, order, label_variance):
    """The five prompt measurements of a predictor: ``predict(tokens)`` gives (..., P, d_s)
    predictions of ``targets`` (..., P, d_s), ``query_weight(tokens)`` the query's weight on itself
    (..., P). ``other_labels`` (..., P, n - 1, d_s) are another task's labels of the demonstrations,
    ``order`` (..., P, n - 1) a permutation of them per prompt. Returns {measure: (...,) tensor}."""
    output_dim = targets.shape[-1]

    def loss(prompts):
        return (((predict(prompts) - targets) ** 2).sum(-1).mean(-1) / label_variance).double()

    with torch.no_grad():
        return {"intact": loss(tokens),
                "other_task_labels": loss(with_demonstration_labels(tokens, other_labels)),
                "shuffled_labels": loss(shuffled_labels(tokens, order, output_dim)),
                "query_alone": loss(tokens[..., -1:, :]),
                "query_weight": query_weight(tokens).double().mean(-1)}


def medians(by_seed, seeds=None):
    """{measure: median over seeds} of {seed: {measure: value}} (None, a diverged model, left out;
    None where no seed is left); ``seeds`` restricts the seeds."""
    rows = [values for seed, values in by_seed.items() if seeds is None or seed in seeds]
    found = {}
    for name in MEASURES:
        kept = [row[name] for row in rows if row.get(name) is not None]
        found[name] = float(torch.tensor(kept, dtype=torch.float64).median()) if kept else None
    return found
