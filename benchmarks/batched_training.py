"""Where the time of a full `reproduce all` goes, measured side by side in one run.

    python benchmarks/batched_training.py [--tasks linear trigonometric exponential] [--full]

For each task, one part of one seed's variants (half of them: what each job of a full run's two
worker processes trains) takes a few SGD steps three ways: eager with one thread, eager with every
thread in one process, and through torch.compile with one thread (what a full run does). Beside them stands a bound built
from this machine's own measured rates: one exp over the (models, tokens, d_r) random-feature
exponent and the two (models, tokens, d) x (d, d_r) matrix products of the forward and backward
pass, each microbenchmarked at the step's shapes, one thread. A ratio near 1 means the step is
already the unavoidable work; the ratio is the headroom. Last, the per-step time projects the
training time of a full run (seeds over the worker processes), and with --full the whole
`reproduce all` is timed. Timings on a shared machine move; ratios measured in one run move less.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import torch

from icl_lens.studies import section5
from icl_lens.training.data import task_data
from icl_lens.training.ensemble import AttentionEnsemble, squared_errors
from icl_lens.training.loop import train

STEPS = {"linear": 200, "trigonometric": 30, "exponential": 6}
WORKERS = 2


def timed(function, repeats=1):
    function()   # warm-up (and compilation)
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def part(config):
    """The first of the WORKERS parts a full run splits each seed's variants into."""
    variants = config.variants()
    return variants[: -(-len(variants) // WORKERS)]


def step_time(config, *, threads, compiled=False):
    """Seconds per SGD step of one part of one seed's variants."""
    torch.set_num_threads(threads)
    variants = part(config)
    ensemble = AttentionEnsemble(config.layer, [v.modification for v in variants], [config.seeds[0]] * len(variants))
    data = task_data(config.task, config.seeds[:1])
    lr = torch.tensor([v.lr for v in variants])
    errors = torch.compile(squared_errors, dynamic=False) if compiled else squared_errors
    steps = STEPS[config.task.kind]
    return timed(lambda: train(ensemble, data, steps=steps, epochs=1, lr=lr, step_errors=errors)) / steps


def bound(config):
    """Seconds of the unavoidable exp and matmul work of one step, one thread, at the step's shapes."""
    torch.set_num_threads(1)
    models, n, d = len(part(config)), config.task.num_tokens, config.task.token_dim
    features = config.layer.features
    exponent, out = torch.randn(models, n, features), torch.empty(models, n, features)
    keys, omega = torch.randn(models, n, d), torch.randn(models, d, features)
    exp_time = timed(lambda: torch.exp(exponent, out=out), repeats=20)
    forward = timed(lambda: torch.bmm(keys, omega, out=out), repeats=20)
    backward = timed(lambda: torch.bmm(exponent, omega.transpose(1, 2)), repeats=20)
    return exp_time + forward + backward


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", default=list(STEPS), choices=list(STEPS))
    parser.add_argument("--full", action="store_true", help="also time `reproduce all` in full mode")
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads, {os.cpu_count()} cpus")
    projected = 0.0
    for kind in args.tasks:
        config = section5.EXPERIMENTS[kind]()
        one = step_time(config, threads=1)
        every = step_time(config, threads=threads)
        compiled = step_time(config, threads=1, compiled=True)
        floor = bound(config)
        steps = config.trained_epochs * config.steps_per_epoch   # with the half-length run copied off
        # each seed is split into WORKERS parts, and WORKERS processes train the parts side by side
        minutes = compiled * steps * len(config.seeds) / 60
        projected += minutes
        print(f"{kind:<14} {len(part(config)):>2} models/part | step: eager 1 thread {one * 1e3:7.2f} ms, "
              f"eager {threads} threads {every * 1e3:7.2f} ms, compiled 1 thread {compiled * 1e3:7.2f} ms "
              f"({one / compiled:.1f}x faster than eager) | bound {floor * 1e3:6.2f} ms, compiled / bound "
              f"{compiled / floor:.1f}x | {config.epochs} epochs x {len(config.seeds)} seeds: {minutes:.1f} min",
              flush=True)
    print(f"projected training time of a full run: {projected:.1f} min")
    if args.full:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "all", "--out", out], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"reproduce all (full mode): {(time.perf_counter() - start) / 60:.1f} min")


if __name__ == "__main__":
    main()
