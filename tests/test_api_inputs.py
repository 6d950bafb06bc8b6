"""Bad calls into the public API are refused with a ValueError or TypeError naming the argument, before
any work: a table of bad values for the mathematics functions, the device and the configs, and a
property-based sweep (hypothesis, bounded sizes) of shapes that do not fit."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from icl_lens import attention, baselines, bounds, constructions, dual, kernels, modifications
from icl_lens.bert.glue import GlueConfig
from icl_lens.device import pick
from icl_lens.studies.ffn_rank import TrainedRankConfig

NAN, INF = math.nan, math.inf
d, n, T = 3, 4, 2


def weights(size=d, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(size, size, generator=g, dtype=dtype) / size for _ in range(3))


def attention_call(function, **changes):
    W_Q, W_K, W_V = weights()
    arguments = {"queries_in": torch.randn(T, d, dtype=torch.float64), "context": torch.randn(n, d, dtype=torch.float64),
                 "W_Q": W_Q, "W_K": W_K, "W_V": W_V, **changes}
    if function is attention.kernel_attention:
        arguments.setdefault("feature_map", kernels.elu_feature_map)
    return lambda: function(**arguments)


def dual_call(**changes):
    W_Q, W_K, W_V = weights()
    arguments = {"demos": torch.randn(n, d, dtype=torch.float64), "queries": torch.randn(T, d, dtype=torch.float64),
                 "W_Q": W_Q, "W_K": W_K, "W_V": W_V, "feature_map": kernels.elu_feature_map, **changes}
    return lambda: dual.dual_model(**arguments)


def prompt_call(**changes):
    W_Q, W_K, W_V = weights()
    arguments = {"demos": torch.randn(n, d, dtype=torch.float64), "queries": torch.randn(T, d, dtype=torch.float64),
                 "W_Q": W_Q, "W_K": W_K, "W_V": W_V, "feature_map": kernels.elu_feature_map, **changes}
    return lambda: modifications.kernel_prompt(**arguments)


def a_prompt():
    return prompt_call()()


def zeros():
    return torch.zeros(d, d, dtype=torch.float64)


def baseline_call(function, **changes):
    arguments = {"x_context": torch.randn(n, d, dtype=torch.float64), "y_context": torch.randn(n, dtype=torch.float64),
                 "x_query": torch.randn(d, dtype=torch.float64), **changes}
    return lambda: function(**arguments)


TENSOR_BAD = {   # a bad value for a (4, 3) float64 tensor argument
    "int dtype": torch.ones(n, d, dtype=torch.int64), "a list": [[1.0] * d] * n, "nan": torch.full((n, d), NAN,
                                                                                                  dtype=torch.float64),
    "inf": torch.full((n, d), INF, dtype=torch.float64), "1-D": torch.ones(d, dtype=torch.float64),
    "wrong d": torch.ones(n, d + 1, dtype=torch.float64), "float32": torch.ones(n, d, dtype=torch.float32),
}
NUMBER_BAD = [NAN, INF, -INF, "0.1", None, torch.ones(2)]
POSITIVE_BAD = [0, -1, -1e-9, *NUMBER_BAD]
COUNT_BAD = [0, -1, 1.5, True, "3", None]
DEVICE_BAD = ["tpu", "", "3", "cuda:abc", "meta", "mps", 3, "CPU"]

BAD_CALLS = [   # (call, the argument its message must name)
    *((lambda v=v: kernels.draw_omega(v, 8), "dim") for v in COUNT_BAD),
    *((lambda v=v: kernels.draw_omega(3, v), "num_features") for v in COUNT_BAD),
    *((lambda v=v: kernels.draw_omega(3, 8, dtype=v), "dtype") for v in (torch.int64, torch.bool, "float64", None)),
    *((lambda v=v: kernels.draw_omega(3, 8, device=v), "device") for v in DEVICE_BAD),
    *((lambda v=v: pick(v), "device") for v in DEVICE_BAD),
    *((lambda v=v: pick(v, name="--device"), "--device") for v in DEVICE_BAD[:3]),
    *((attention_call(f, **{arg: v}), arg) for f in (attention.softmax_attention, attention.kernel_attention)
      for arg in ("queries_in", "context") for v in TENSOR_BAD.values() if not (arg == "context" and v.__class__ is
                                                                                torch.Tensor and v.dtype == torch.float32)),
    *((attention_call(f, W_Q=torch.ones(d + 1, d, dtype=torch.float64)), "W_Q")
      for f in (attention.softmax_attention, attention.kernel_attention)),
    *((attention_call(f, W_V=torch.ones(d, d + 1, dtype=torch.float64)), "W_V")
      for f in (attention.softmax_attention, attention.kernel_attention)),
    *((attention_call(f, context=torch.ones(0, d, dtype=torch.float64)), "context")
      for f in (attention.softmax_attention, attention.kernel_attention)),
    *((attention_call(f, queries_in=torch.ones(2, T, d, dtype=torch.float64),
                      context=torch.ones(3, n, d, dtype=torch.float64)), "queries_in")
      for f in (attention.softmax_attention, attention.kernel_attention)),
    *((attention_call(attention.softmax_attention, scale=v), "scale") for v in POSITIVE_BAD if v is not None),
    *((dual_call(**{arg: v}), arg) for arg in ("demos", "queries") for v in list(TENSOR_BAD.values())[:6]),
    (dual_call(demos=torch.ones(2, n, d, dtype=torch.float64), queries=torch.ones(3, T, d, dtype=torch.float64)),
     "queries"),
    *((dual_call(lr=v), "lr") for v in POSITIVE_BAD),
    *((dual_call(query_index=v), "query_index") for v in (T, -T - 1)),
    *((prompt_call(**{arg: v}), arg) for arg in ("demos", "queries") for v in list(TENSOR_BAD.values())[:6]),
    *((prompt_call(W_K=v), "W_K") for v in (torch.ones(d, d + 1, dtype=torch.float64), [[1.0]])),
    *((prompt_call(query_index=v), "query_index") for v in (T, -T - 1, 0.5)),
    *((lambda v=v: modifications.regularized_loss(a_prompt(), zeros(), 0.1, v), "lr") for v in POSITIVE_BAD),
    *((lambda v=v: modifications.regularized_loss(a_prompt(), zeros(), v, 0.1), "alpha") for v in NUMBER_BAD),
    *((lambda v=v: modifications.regularized_loss(a_prompt(), v, 0.1, 0.5), "W") for v in (
        torch.zeros(d, d), torch.zeros(d + 1, d, dtype=torch.float64), [[0.0]])),
    *((lambda v=v: modifications.exponential_smoothing(a_prompt(), v, 3), "alpha") for v in [0, 0.0, *NUMBER_BAD]),
    *((lambda v=v: modifications.exponential_smoothing(a_prompt(), 0.3, v), "steps") for v in (-1, 1.5, "3")),
    *((lambda v=v: modifications.regularized_steps(a_prompt(), 0.3, v), "steps") for v in (-1, 1.5, "3")),
    *((lambda v=v: modifications.ridge_loss(a_prompt(), zeros(), v), "ridge") for v in POSITIVE_BAD),
    *((lambda v=v: constructions.von_oswald_weights(v, 0.1, 4), "dim") for v in COUNT_BAD),
    *((lambda v=v: constructions.von_oswald_weights(3, 0.1, v), "num_context") for v in COUNT_BAD),
    *((lambda v=v: constructions.von_oswald_weights(3, v, 4), "lr") for v in NUMBER_BAD),
    *((lambda v=v: constructions.von_oswald_weights(3, 0.1, 4, dtype=v), "dtype") for v in (torch.int32, "float")),
    (lambda: constructions.von_oswald_weights(3, 0.1, 4, w0=torch.ones(4, dtype=torch.float64)), "w0"),
    *((lambda v=v: bounds.hoeffding_deviation(v, 0.05, 1.0), "N") for v in COUNT_BAD),
    *((lambda v=v: bounds.hoeffding_deviation(100, v, 1.0), "delta") for v in (0, 1, -0.1, 1.5, *NUMBER_BAD)),
    *((lambda v=v: bounds.hoeffding_deviation(100, 0.05, v), "rho") for v in POSITIVE_BAD),
    *((lambda v=v: bounds.hoeffding_tail(v, 0.1, 1.0), "N") for v in COUNT_BAD),
    *((lambda v=v: bounds.hoeffding_tail(100, 0.1, v), "rho") for v in POSITIVE_BAD[:4]),
    *((lambda v=v: bounds.hoeffding_tail(100, v, 1.0), "t") for v in NUMBER_BAD[:3]),
    *((baseline_call(baselines.one_step_gd, lr=v), "lr") for v in NUMBER_BAD),
    *((baseline_call(baselines.least_squares, ridge=v), "ridge") for v in (-1, *NUMBER_BAD)),
    *((baseline_call(baselines.nadaraya_watson, temperature=v), "temperature") for v in POSITIVE_BAD),
    *((baseline_call(baselines.context_mean, **{arg: v}), arg) for arg, v in (
        ("x_context", torch.ones(d, dtype=torch.float64)), ("y_context", torch.ones(n + 1, dtype=torch.float64)),
        ("x_query", torch.ones(d + 1, dtype=torch.float64)), ("y_context", [1.0] * n),
        ("x_query", torch.ones(d, dtype=torch.int64)), ("x_context", torch.full((n, d), NAN, dtype=torch.float64)))),
    *((lambda v=v: GlueConfig(lr=v), "lr") for v in POSITIVE_BAD[:6]),
    *((lambda v=v: GlueConfig(seeds=v), "seeds") for v in ((), (0, 0), (-1,), ("a",), (2 ** 32,), None, (True,))),
    *((lambda name=name, v=v: GlueConfig(**{name: v}), name) for name in ("batch", "epochs", "max_length",
                                                                          "train_size", "validation_size")
      for v in (0, -1, 1.5)),
    *((lambda v=v: GlueConfig(switches=v), "switches") for v in ({"gamma": 1.0}, "alpha", None)),
    *((lambda v=v: GlueConfig(switches=v), name) for v, name in (({"alpha": 2.0}, "alpha"),
                                                                 ({"negative_ratio": 1.0}, "negative_ratio"),
                                                                 ({"key_branch": NAN}, "key_branch"),
                                                                 ({"beta": 0.1}, "beta"))),
    *((lambda v=v: GlueConfig(task=v), "task") for v in ("foo", "", None)),
    *((lambda v=v: GlueConfig(model=v), "model") for v in ("", None)),
    *((lambda v=v: TrainedRankConfig(seeds=v), "seeds") for v in ((), (1, 1), (-1,))),
    *((lambda v=v: TrainedRankConfig(lr=v), "lr") for v in POSITIVE_BAD[:4]),
    *((lambda v=v: TrainedRankConfig(hidden_sizes=v), "hidden_sizes") for v in ((), (0,), (4, -1))),
    *((lambda name=name: TrainedRankConfig(**{name: 0}), name) for name in ("epochs", "tokens_per_epoch", "num_prompts")),
]


@pytest.mark.parametrize("call, argument", BAD_CALLS, ids=[f"{i}:{a}" for i, (_, a) in enumerate(BAD_CALLS)])
def test_a_bad_call_is_refused_naming_the_argument(call, argument):
    with pytest.raises((ValueError, TypeError)) as refused:
        call()
    assert argument in str(refused.value)


def test_the_table_is_large_enough():
    assert len(BAD_CALLS) >= 150


def test_good_calls_still_work():
    """The checks refuse only what is wrong: the same calls with good values give finite results."""
    assert torch.isfinite(attention_call(attention.softmax_attention)()).all()
    assert torch.isfinite(attention_call(attention.kernel_attention)()).all()
    assert kernels.draw_omega(3, 8, dtype=torch.float32).dtype == torch.float32
    assert bounds.hoeffding_deviation(100, 0.05, 1.0) == pytest.approx(2 * math.sqrt(math.log(20) / 200))
    prompt = a_prompt()
    W = modifications.exponential_smoothing(prompt, 0.3, 3)
    assert torch.allclose(W, modifications.regularized_steps(prompt, 0.3, 3))
    assert torch.isfinite(modifications.regularized_loss(prompt, zeros(), 0.1, 0.5))
    assert GlueConfig(seeds=(0, 2 ** 32 - 1), switches={"alpha": 0.1}).lr == 2e-5


@settings(max_examples=60, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=2), tokens=st.integers(1, 4),
       dim=st.integers(1, 4), wrong=st.sampled_from(["queries_in last dim", "context last dim", "W_K columns",
                                                     "W_Q rows", "W_V columns", "batch"]))
def test_shapes_that_do_not_fit_are_named(batch, tokens, dim, wrong):
    """Random bounded shapes, one of them wrong: softmax and kernel attention refuse the call naming
    the argument whose shape is wrong."""
    queries_shape, context_shape = [*batch, tokens, dim], [*batch, tokens + 1, dim]
    W_Q, W_K, W_V = (torch.ones(dim, dim, dtype=torch.float64) for _ in range(3))
    named = wrong.split()[0]
    if wrong == "queries_in last dim":
        queries_shape[-1] += 1
    elif wrong == "context last dim":
        context_shape[-1] += 1
        named = "queries_in"   # the queries no longer match the context's token dimension
    elif wrong == "W_K columns":
        W_K = torch.ones(dim, dim + 1, dtype=torch.float64)
    elif wrong == "W_Q rows":
        W_Q = torch.ones(dim + 1, dim, dtype=torch.float64)
    elif wrong == "W_V columns":
        W_V = torch.ones(dim, dim + 2, dtype=torch.float64)
    else:
        queries_shape = [2, *queries_shape]
        context_shape = [3, *context_shape]
        named = "queries_in"
    queries_in, context = torch.ones(queries_shape, dtype=torch.float64), torch.ones(context_shape, dtype=torch.float64)
    for function, extra in ((attention.softmax_attention, {}),
                            (attention.kernel_attention, {"feature_map": kernels.elu_feature_map})):
        with pytest.raises(ValueError, match=named):
            function(queries_in, context, W_Q, W_K, W_V, **extra)


# the studies' configs, checked at construction (before any training starts)
STUDY_CONFIGS = [
    ("section5", {"lr_normal": -0.1}, "lr_normal"), ("section5", {"lr_other": float("nan")}, "lr_other"),
    ("section5", {"seeds": (0, 0)}, "seeds"), ("section5", {"kernel": "foo"}, "kernel"),
    ("section5", {"epochs": 0}, "epochs"), ("section5", {"tokens_per_epoch": 2.5}, "tokens_per_epoch"),
    ("across_tasks", {"steps": 0}, "steps"), ("across_tasks", {"seeds": ()}, "seeds"),
    ("across_tasks", {"schedule": "cosine"}, "schedule"), ("across_tasks", {"demo_counts": (0,)}, "demo_counts"),
    ("across_tasks", {"batch": -1}, "batch"), ("li_et_al", {"lr": 0.0}, "lr"), ("li_et_al", {"d": -1}, "d"),
    ("li_et_al", {"seeds": (1, 1)}, "seeds"), ("li_et_al", {"dims": ()}, "dims"),
    ("table1", {"lr": -1}, "lr"), ("table1", {"seeds": ()}, "seeds"), ("table1", {"train_size": 0}, "train_size"),
    ("table1", {"task": "mnli"}, "task"),
]


@pytest.mark.parametrize("study, options, argument", STUDY_CONFIGS)
def test_study_configs_refuse_bad_values_naming_the_field(study, options, argument):
    from icl_lens.studies import across_tasks, li_et_al, section5, table1
    config = {"section5": section5.ExperimentConfig, "across_tasks": across_tasks.StudyConfig,
              "li_et_al": li_et_al.StudyConfig, "table1": table1.StudyConfig}[study]
    with pytest.raises(ValueError, match=argument):
        config(**options)
    config()       # the defaults pass
