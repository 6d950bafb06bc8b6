"""What a hand-fused random-feature log-sum-exp would give the training step, measured side by side.

    python benchmarks/fused_random_features.py [--tasks linear trigonometric exponential]

The Performer layer's query scores (icl_lens.training.ensemble.AttentionEnsemble.query_log_scores,
Eq. (7)) are log sum_r exp(w_r . x_j) for x_j = q + k_j, less |k_j|^2 / 2. The compiled step writes
the (models, tokens, d_r) exponent to memory with a matrix product, reads it for the log-sum-exp,
and reads it again in the backward pass to recompute the softmax, which it writes and reads for a
second matrix product. The C++ kernel below never writes the exponent: for a few tokens at a time
it computes their exponent rows into a buffer that stays in the L1 cache, takes their maxima and
exp-sums, and in the backward pass computes each row again, its softmax and the sum of the
softmax times omega into a few accumulators a token. Its exp is ATen's vectorised one
(Vectorized<float>::exp, Sleef's exp to 1 ulp), not the faster 20-ulp exp_u20.

The package does not use this kernel. It needs a C++ compiler and ninja at run time and builds
once per machine (about 25 s), and its float32 numbers differ from the compiled step's in
round-off, so using it would mean regenerating every saved Section 5 record. This script checks the
kernel against a float64 reference (forward and gradient) and then times, per task and part of a
seed's variants, the compiled step at the saved run's trained weights with and without it, each
against the bound of benchmarks/batched_training.py (one exp and two matrix products). It also
times the step with exact softmax attention in place of the random features: what is left of the
step's work when the exponent costs nothing, which no kernel for the exponent can remove.
"""

import argparse
import dataclasses
import math
import shutil
import sys
import time

import torch
from torch.utils.cpp_extension import load_inline

import batched_training
from icl_lens.studies import section5
from icl_lens.training.ensemble import AttentionEnsemble

KERNEL = r"""
#include <torch/extension.h>
#include <ATen/cpu/vec/vec.h>
#include <cmath>
#include <limits>

using Vec = at::vec::Vectorized<float>;
constexpr int LANES = Vec::size();
// MAX_DIM (the accumulators a token holds in the backward pass) and PADDING come from Python
constexpr int FORWARD_ROWS = 4, BACKWARD_ROWS = 2;
const float MINUS_INF = -std::numeric_limits<float>::infinity();

static float lane_sum(const Vec& v) {
  float a[LANES]; v.store(a); float s = 0;
  for (float x : a) s += x;
  return s;
}
static float lane_max(const Vec& v) {
  float a[LANES]; v.store(a); float s = a[0];
  for (float x : a) s = std::max(s, x);
  return s;
}

// the exponents of ROWS tokens x (ROWS, d) for features r .. r + LANES of omega_t (d, padded)
template <int ROWS>
static void exponents(const float* x, const float* omega_t, int64_t d, int64_t padded, int64_t r, Vec* e) {
  for (int i = 0; i < ROWS; i++) e[i] = Vec(0.f);
  for (int64_t j = 0; j < d; j++) {
    Vec w = Vec::loadu(omega_t + j * padded + r);
    for (int i = 0; i < ROWS; i++) e[i] = at::vec::fmadd(Vec(x[i * d + j]), w, e[i]);
  }
}

template <int ROWS>
static void forward_rows(const float* x, const float* omega_t, int64_t d, int64_t features, int64_t padded,
                         float* buffer, float* out) {
  Vec top[ROWS], e[ROWS];
  for (int i = 0; i < ROWS; i++) top[i] = Vec(MINUS_INF);
  for (int64_t r = 0; r < features; r += LANES) {
    exponents<ROWS>(x, omega_t, d, padded, r, e);
    for (int i = 0; i < ROWS; i++) {
      if (features - r < LANES) e[i] = Vec::set(Vec(MINUS_INF), e[i], features - r);   // padding
      e[i].store(buffer + i * padded + r);
      top[i] = at::vec::maximum(top[i], e[i]);
    }
  }
  for (int i = 0; i < ROWS; i++) {
    float largest = lane_max(top[i]);
    Vec sum(0.f), shift(largest);
    for (int64_t r = 0; r < features; r += LANES) sum = sum + (Vec::loadu(buffer + i * padded + r) - shift).exp();
    out[i] = largest + std::log(lane_sum(sum));
  }
}

template <int ROWS>
static void backward_rows(const float* x, const float* omega_t, const float* grad, const float* lse, int64_t d,
                          int64_t features, int64_t padded, float* grad_x) {
  Vec total[ROWS][MAX_DIM], e[ROWS];
  for (int i = 0; i < ROWS; i++)
    for (int64_t j = 0; j < d; j++) total[i][j] = Vec(0.f);
  for (int64_t r = 0; r < features; r += LANES) {
    exponents<ROWS>(x, omega_t, d, padded, r, e);
    for (int i = 0; i < ROWS; i++) {
      e[i] = (e[i] - Vec(lse[i])).exp();                                               // the softmax
      if (features - r < LANES) e[i] = Vec::set(Vec(0.f), e[i], features - r);
    }
    for (int64_t j = 0; j < d; j++) {
      Vec w = Vec::loadu(omega_t + j * padded + r);
      for (int i = 0; i < ROWS; i++) total[i][j] = at::vec::fmadd(e[i], w, total[i][j]);
    }
  }
  for (int i = 0; i < ROWS; i++)
    for (int64_t j = 0; j < d; j++) grad_x[i * d + j] = grad[i] * lane_sum(total[i][j]);
}

static void check_inputs(const torch::Tensor& x, const torch::Tensor& omega_t, int64_t features) {
  for (const auto& t : {x, omega_t}) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous() && t.dim() == 3,
                "x and omega_t must be contiguous 3-d float32 tensors on the cpu");
  }
  TORCH_CHECK(x.size(2) <= MAX_DIM, "x's last dimension must be at most ", MAX_DIM, ", got ", x.size(2));
  TORCH_CHECK(omega_t.size(0) == x.size(0) && omega_t.size(1) == x.size(2) && omega_t.size(2) % PADDING == 0
              && 0 < features && features <= omega_t.size(2),
              "omega_t must be (models, d, a multiple of ", PADDING, " >= features) for x (models, tokens, d)");
}

// x (models, tokens, d), omega_t (models, d, padded): logsumexp_r(x . omega_r) (models, tokens)
torch::Tensor forward(torch::Tensor x, torch::Tensor omega_t, int64_t features) {
  check_inputs(x, omega_t, features);
  int64_t models = x.size(0), tokens = x.size(1), d = x.size(2), padded = omega_t.size(2);
  auto out = torch::empty({models, tokens}, x.options());
  std::vector<float> buffer(FORWARD_ROWS * padded);
  for (int64_t m = 0; m < models; m++) {
    const float* xm = x.data_ptr<float>() + m * tokens * d;
    const float* w = omega_t.data_ptr<float>() + m * d * padded;
    float* o = out.data_ptr<float>() + m * tokens;
    int64_t t = 0;
    for (; t + FORWARD_ROWS <= tokens; t += FORWARD_ROWS)
      forward_rows<FORWARD_ROWS>(xm + t * d, w, d, features, padded, buffer.data(), o + t);
    for (; t < tokens; t++) forward_rows<1>(xm + t * d, w, d, features, padded, buffer.data(), o + t);
  }
  return out;
}

// the gradient of sum(grad * forward(x)) with respect to x: grad times softmax_r(x . omega) omega
torch::Tensor backward(torch::Tensor grad, torch::Tensor x, torch::Tensor omega_t, torch::Tensor lse,
                       int64_t features) {
  check_inputs(x, omega_t, features);
  for (const auto& t : {grad, lse}) {
    TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()
                && t.sizes() == x.sizes().slice(0, 2), "grad and lse must be contiguous float32 (models, tokens)");
  }
  int64_t models = x.size(0), tokens = x.size(1), d = x.size(2), padded = omega_t.size(2);
  auto grad_x = torch::empty_like(x);
  for (int64_t m = 0; m < models; m++) {
    const float* xm = x.data_ptr<float>() + m * tokens * d;
    const float* w = omega_t.data_ptr<float>() + m * d * padded;
    const float* g = grad.data_ptr<float>() + m * tokens;
    const float* l = lse.data_ptr<float>() + m * tokens;
    float* out = grad_x.data_ptr<float>() + m * tokens * d;
    int64_t t = 0;
    for (; t + BACKWARD_ROWS <= tokens; t += BACKWARD_ROWS)
      backward_rows<BACKWARD_ROWS>(xm + t * d, w, g + t, l + t, d, features, padded, out + t * d);
    for (; t < tokens; t++) backward_rows<1>(xm + t * d, w, g + t, l + t, d, features, padded, out + t * d);
  }
  return grad_x;
}
"""
MAX_DIM = 16   # the largest token dimension d the kernel takes
PADDING = 16   # omega's feature axis is padded to a multiple of this many floats (AVX-512's width; AVX2 holds 8)


def build():
    """The kernel as a Python module (compiled once into torch's extension cache)."""
    for tool in ("ninja", "c++"):
        if shutil.which(tool) is None:
            sys.exit(f"this benchmark builds a C++ kernel and needs {tool} on the PATH")
    # ATen's vector types for the instruction set this CPU runs ATen's own kernels with
    capability = torch.backends.cpu.get_cpu_capability()
    flags = ["-O3", "-march=native", f"-DMAX_DIM={MAX_DIM}", f"-DPADDING={PADDING}"]
    if capability in ("AVX512", "AVX2"):
        flags += [f"-DCPU_CAPABILITY_{capability}", f"-DCPU_CAPABILITY={capability}"]
    return load_inline(f"icl_lens_fused_random_features_{capability.lower()}", cpp_sources=[KERNEL],
                       functions=["forward", "backward"], extra_cflags=flags)


kernel = None


@torch.library.custom_op("icl_lens_benchmark::random_feature_lse", mutates_args=())
def random_feature_lse(x: torch.Tensor, omega_t: torch.Tensor, features: int) -> torch.Tensor:
    return kernel.forward(x.contiguous(), omega_t.contiguous(), features)


@random_feature_lse.register_fake
def _(x, omega_t, features):
    return x.new_empty(x.shape[:-1])


@torch.library.custom_op("icl_lens_benchmark::random_feature_lse_backward", mutates_args=())
def random_feature_lse_backward(grad: torch.Tensor, x: torch.Tensor, omega_t: torch.Tensor, lse: torch.Tensor,
                                features: int) -> torch.Tensor:
    return kernel.backward(grad.contiguous(), x.contiguous(), omega_t.contiguous(), lse.contiguous(), features)


@random_feature_lse_backward.register_fake
def _(grad, x, omega_t, lse, features):
    return torch.empty_like(x)


class RandomFeatureLogSumExp(torch.autograd.Function):
    """logsumexp_r(x . omega_r) through the kernel; an autograd.Function (not the custom op's own
    autograd) because compiled training differentiates with torch.func.grad."""

    @staticmethod
    def forward(x, omega_t, features):
        return random_feature_lse(x, omega_t, features)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, omega_t, features = inputs
        ctx.save_for_backward(x, omega_t, output)
        ctx.features = features

    @staticmethod
    def backward(ctx, grad):
        x, omega_t, lse = ctx.saved_tensors
        return random_feature_lse_backward(grad, x, omega_t, lse, ctx.features), None, None


def padded_transpose(omega):
    """omega (models, d_r, d) -> (models, d, d_r rounded up to PADDING), the padding never read as a feature."""
    models, features, d = omega.shape
    if d > MAX_DIM:
        raise ValueError(f"omega's token dimension must be at most {MAX_DIM}, got {d}")
    omega_t = omega.new_zeros(models, d, -(-features // PADDING) * PADDING)
    omega_t[:, :, :features] = omega.transpose(1, 2)
    return omega_t


def fused_log_scores(x, omega_t, features):
    """logsumexp_r(x . omega_r) for x (models, batch, tokens, d): (models, batch, tokens)."""
    models, batch, tokens, d = x.shape
    if x.dtype != torch.float32 or omega_t.dtype != torch.float32:
        raise ValueError(f"x and omega_t must be float32, got {x.dtype} and {omega_t.dtype}")
    if omega_t.shape[:2] != (models, d) or omega_t.shape[2] < features:
        raise ValueError(f"omega_t must be (models={models}, d={d}, at least features={features}), "
                         f"got {tuple(omega_t.shape)}")
    return RandomFeatureLogSumExp.apply(x.reshape(models, batch * tokens, d), omega_t, features).reshape(
        models, batch, tokens)


class FusedEnsemble(AttentionEnsemble):
    """The package's ensemble, with the kernel in its compiled Performer scores (elsewhere unchanged)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_buffer("omega_t", padded_transpose(self.omega))

    def query_log_scores(self, q, k):
        if self.config.kernel == "softmax" or not torch.compiler.is_compiling():
            return super().query_log_scores(q, k)
        half_norms = 0.5 * (k * k).sum(-1)
        return fused_log_scores(k + q.unsqueeze(-2), self.omega_t, self.omega.shape[1]) - half_norms


def check(models, tokens, d, features, scale=1.0):
    """The kernel's forward and gradient against float64 torch on random inputs (x times ``scale``):
    the largest differences, each relative to 1 + the reference's largest magnitude."""
    generator = torch.Generator().manual_seed(0)
    x = scale * torch.randn(models, 1, tokens, d, generator=generator)
    omega = torch.randn(models, features, d, generator=generator)
    weights = torch.randn(models, 1, tokens, generator=generator)
    reference_x = x.double().requires_grad_()
    reference = torch.logsumexp(reference_x @ omega.double().transpose(1, 2).unsqueeze(1), -1)
    (reference * weights.double()).sum().backward()
    fused_x = x.clone().requires_grad_()
    fused = fused_log_scores(fused_x, padded_transpose(omega), features)
    (fused * weights).sum().backward()
    return ((fused.double() - reference).abs().max().item() / (1 + reference.abs().max().item()),
            (fused_x.grad.double() - reference_x.grad).abs().max().item() / (1 + reference_x.grad.abs().max().item()))


# the three tasks' shapes, a feature count whose last block is partly padding, and large exponents
CHECKS = [dict(models=3, tokens=37, d=7, features=700), dict(models=2, tokens=9, d=12, features=1201),
          dict(models=2, tokens=9, d=5, features=500, scale=8.0)]


def step_times(config, index, repeats=3):
    """Seconds per step of part ``index`` (the best of ``repeats`` runs, taken in turn) as the
    package trains it, fused, and with exact softmax attention instead of random features (the
    work outside the random-feature exponent, which the bound does not count: the projections,
    the maps, the negative samples, the update); and the largest relative difference of the
    first two's training losses."""
    if any(variant.modification.ridge for variant in batched_training.part(config, index)):
        raise ValueError("the ridge layer needs random features: time parts without it")
    softmax = dataclasses.replace(config, kernel="softmax")
    runs = {name: batched_training.training(setting, threads=1, compiled=True, index=index, trained=True,
                                            ensemble_class=ensemble)
            for name, setting, ensemble in (("as the package", config, AttentionEnsemble),
                                            ("fused", config, FusedEnsemble),
                                            ("softmax", softmax, AttentionEnsemble))}
    losses = {name: run() for name, run in runs.items()}   # compiles; the learning rate is 0
    difference = ((losses["fused"] - losses["as the package"]).abs() / losses["as the package"].abs()).max().item()
    best = dict.fromkeys(runs, math.inf)
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds / batched_training.STEPS[config.task.kind] for name, seconds in best.items()}, difference


def main():
    global kernel
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    tasks = list(batched_training.STEPS)
    parser.add_argument("--tasks", nargs="+", default=tasks, choices=tasks)
    args = parser.parse_args()
    start = time.perf_counter()
    kernel = build()
    print(f"torch {torch.__version__}; kernel built or loaded in {time.perf_counter() - start:.0f} s")
    errors = [check(**case) for case in CHECKS]
    forward_error, gradient_error = max(e[0] for e in errors), max(e[1] for e in errors)
    print(f"against float64 ({len(CHECKS)} cases): forward {forward_error:.1e}, gradient {gradient_error:.1e} "
          f"(relative)")
    # a wrong kernel would show here, before anything is timed
    if not forward_error < 1e-5 or not gradient_error < 1e-5:
        sys.exit("the kernel does not compute the log-sum-exp or its gradient")
    for kind in args.tasks:
        config = section5.EXPERIMENTS[kind]()
        if batched_training.trained_weights(kind) is None:
            sys.exit(f"needs the saved full run's trained weights (book/data/experiments/task_{kind}.json)")
        print(f"{kind}: compiled step at trained weights, one thread")
        torch._dynamo.reset()   # each task compiles its graphs afresh, within dynamo's recompile limit
        for index in range(batched_training.WORKERS):
            steps, difference = step_times(config, index)
            if not difference < 1e-4:
                sys.exit(f"the fused step's training losses differ from the package's by {difference:.1e}")
            floor = batched_training.bound(config, index)
            print(f"  part {index + 1}: as the package {steps['as the package'] * 1e3:.2f} ms "
                  f"({steps['as the package'] / floor:.1f}x its bound), fused {steps['fused'] * 1e3:.2f} ms "
                  f"({steps['fused'] / floor:.1f}x), speed-up {steps['as the package'] / steps['fused']:.2f}x; "
                  f"bound {floor * 1e3:.2f} ms; training losses {difference:.0e} apart\n"
                  f"          softmax instead of random features {steps['softmax'] * 1e3:.2f} ms "
                  f"({steps['softmax'] / floor:.2f}x the bound)", flush=True)


if __name__ == "__main__":
    main()
