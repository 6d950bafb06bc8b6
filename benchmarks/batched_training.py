"""Batched ensemble against a plain loop over models, side by side in one run; then `reproduce all`.

    python benchmarks/batched_training.py [--tasks linear trigonometric exponential] [--skip-full]

For each task, the same work (every model of the task's figures, a few SGD steps, one sequence per
model per step) is timed three ways: a Python loop over the models, each trained alone; one batched
ensemble (eager); the batched ensemble through torch.compile (its first call, which compiles, timed
apart). The ratios are what to read: timings on a shared machine move, ratios measured in one run
move less. The per-step times are then projected onto the steps of a full run.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

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
    """Time the three paths on ``STEPS[kind]`` steps; return the projected full-mode training minutes
    of the loop and of the compiled ensemble (per-step times times the steps of a full run)."""
    config = experiments.EXPERIMENTS[kind]()
    steps = STEPS[kind]
    models = [(g, m, s) for s in config.seeds for g, m in config.variants()]

    def loop():
        for model in models:
            ensemble, data, lr = setup(config, [model])
            experiments.train(ensemble, data, steps=steps, epochs=1, lr=lr)

    def batched(step_errors):
        ensemble, data, lr = setup(config, models)
        return lambda: experiments.train(ensemble, data, steps=steps, epochs=1, lr=lr, step_errors=step_errors)

    loop_time = timed(loop)
    batched_time = timed(batched(experiments.squared_errors))
    compiled = batched(torch.compile(experiments.squared_errors, dynamic=False))
    first_time = timed(compiled)      # includes compilation
    compiled_time = timed(compiled)
    print(f"{kind:<14} {len(models):>3} models x {steps:>3} steps | loop {loop_time:6.2f} s | "
          f"batched {batched_time:6.2f} s ({loop_time / batched_time:5.1f}x) | "
          f"compiled {compiled_time:6.2f} s ({loop_time / compiled_time:5.1f}x; first call {first_time:.0f} s)",
          flush=True)
    full_steps = config.epochs * config.steps_per_epoch
    return loop_time / steps * full_steps / 60, compiled_time / steps * full_steps / 60


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--skip-full", action="store_true", help="do not time `reproduce all` in full mode")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    projected = [benchmark(kind) for kind in args.tasks]
    loop_minutes, compiled_minutes = (sum(column) for column in zip(*projected))
    print(f"projected training time of a full run of these tasks: loop {loop_minutes:.1f} min, "
          f"compiled ensemble {compiled_minutes:.1f} min ({loop_minutes / compiled_minutes:.1f}x)")
    if not args.skip_full:
        with tempfile.TemporaryDirectory() as out:
            seconds = timed(lambda: subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "all", "--out", out],
                                                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        print(f"reproduce all (full mode, figures 3 and 6-13, three seeds): {seconds / 60:.1f} min")


if __name__ == "__main__":
    main()
