"""Batched ensemble against a plain loop over models, side by side in one run; then `reproduce all`.

    python benchmarks/batched_training.py [--tasks linear trigonometric exponential] [--skip-full]

For each task, the same work (every model of the task's figure, a few SGD steps, one sequence per
model per step) is timed three ways: a Python loop over the models, each trained alone; one batched
ensemble (eager); the batched ensemble through torch.compile (compilation timed apart). The ratios
are what to read: timings on a shared machine move, ratios measured in one run move less.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import torch

from icl_lens import experiments
from icl_lens.layers import AttentionEnsemble

STEPS = {"linear": 128, "trigonometric": 16, "exponential": 4}


def setup(config, models):
    ensemble = AttentionEnsemble(config.layer, [m for _, m, _ in models], [s for *_, s in models])
    lr = torch.tensor([config.learning_rate(g) for g, _, _ in models])
    return ensemble, experiments.task_data(config.task, sorted({s for *_, s in models})), lr


def timed(function):
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def benchmark(kind):
    config = experiments.EXPERIMENTS[kind]()
    steps = STEPS[kind]
    models = [(g, m, s) for s in config.seeds for g, m in config.variants()]

    def loop():
        for model in models:
            ensemble, data, lr = setup(config, [model])
            experiments.train(ensemble, data, steps=steps, epochs=1, lr=lr)

    def batched(step_errors=experiments.squared_errors, warm_up=False):
        ensemble, data, lr = setup(config, models)
        if warm_up:   # compilation happens at the first step; time it apart
            experiments.train(ensemble, data, steps=1, epochs=1, lr=lr, step_errors=step_errors)
        return lambda: experiments.train(ensemble, data, steps=steps, epochs=1, lr=lr, step_errors=step_errors)

    loop_time = timed(loop)
    batched_time = timed(batched())
    compiled = torch.compile(experiments.squared_errors, dynamic=False)
    start = time.perf_counter()
    warm = batched(compiled, warm_up=True)
    compile_time = time.perf_counter() - start
    compiled_time = timed(warm)
    print(f"{kind:<14} {len(models):>3} models x {steps:>3} steps | loop {loop_time:7.2f} s | batched {batched_time:6.2f} s "
          f"({loop_time / batched_time:5.1f}x) | compiled {compiled_time:6.2f} s ({loop_time / compiled_time:5.1f}x, "
          f"compile {compile_time:.0f} s)", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--skip-full", action="store_true", help="do not time `reproduce all` in full mode")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    for kind in args.tasks:
        benchmark(kind)
    if not args.skip_full:
        with tempfile.TemporaryDirectory() as out:
            seconds = timed(lambda: subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "all", "--out", out],
                                                   check=True, stderr=subprocess.DEVNULL))
        print(f"reproduce all (full mode, figures 3 and 6-13, three seeds): {seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
