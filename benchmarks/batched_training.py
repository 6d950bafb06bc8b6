"""Where the time of a full `reproduce all` goes, measured side by side in one run.

    python benchmarks/batched_training.py [--tasks linear trigonometric exponential] [--full]

For each task, one part of one seed's variants (half of them: what each job of a full run's two
worker processes trains) takes a few SGD steps: eager with one thread, eager with every thread in
one process, and compiled with one thread (what a full run does: a few steps per torch.compile
graph, icl_lens.training.loop.compiled_sgd_steps); compiled again from the saved full run's
trained weights (where a run spends most of its steps), once as training runs, flushing subnormal
floats to zero, and once keeping them; and compiled beside a second process that trains the
other part (what the two workers of a full run cost each other); and the eager test-loss pass a
run makes at each checkpoint, at the trained weights, with the random-feature exponents raised
to their floor as the runs do and without. Each step is set against a bound
built from this machine's own measured rates: one exp over the (models, tokens, d_r)
random-feature exponent and the two (models, tokens, d) x (d, d_r) matrix products of the
forward and backward pass, each microbenchmarked at the step's shapes, one thread. A ratio near 1
means the step is already the unavoidable work; the ratio is the headroom. The other parts (the
maps and negative samples cost more) are timed too, and the mean over the parts projects the
training time of a full run (seeds over the worker processes), and with --full
the whole `reproduce all` is timed against both projections (it also compiles, measures test
losses, context use and baselines, and runs the studies of Figs. 6-9 and 14), and so are each
task's jobs (their time over the workers) and the pool the three tasks share.
Timings on a shared machine move; ratios measured in one run move less.
"""

import argparse
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from unittest.mock import patch

import torch

from icl_lens.results import repository_root
from icl_lens.studies import section5
from icl_lens.training.data import task_data, test_sets
from icl_lens.training import ensemble as ensemble_module
from icl_lens.training.ensemble import AttentionEnsemble, squared_errors, test_loss
from icl_lens.training.loop import train

STEPS = {"linear": 200, "trigonometric": 32, "exponential": 8}   # multiples of STEPS_PER_CALL
WORKERS = 2


def timed(function, repeats=1):
    function()   # warm-up (and compilation)
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    return (time.perf_counter() - start) / repeats


def part(config, index=0):
    """Part ``index`` of the WORKERS parts a full run splits each seed's variants into."""
    variants = config.variants()
    size = -(-len(variants) // WORKERS)
    return variants[index * size : (index + 1) * size]


def trained_weights(kind):
    """W_Q, W_K, W_V of seed 0's trained normal model in the saved full run, or None."""
    path = repository_root() / "book" / "data" / "experiments" / f"task_{kind}.json"
    if not path.exists():
        return None
    return {name: torch.tensor(w) for name, w in json.loads(path.read_text())["trained_normal"]["0"].items()}


def load_trained_weights(ensemble, kind):
    """Every model of ``ensemble`` given the saved run's trained W_Q, W_K, W_V (:func:`trained_weights`)."""
    with torch.no_grad():
        for name, weight in trained_weights(kind).items():
            getattr(ensemble, name).copy_(weight.expand_as(getattr(ensemble, name)))


def training(config, *, threads, compiled, index=0, trained=False, ensemble_class=AttentionEnsemble):
    """A function that trains one epoch of STEPS steps of part ``index`` of one seed's variants
    (an ``ensemble_class`` of them: benchmarks/fused_random_features.py passes its own); with
    ``trained``, every model starts from the saved run's trained W_Q, W_K, W_V and the learning
    rate is 0, so that every step is a step of a trained layer."""
    torch.set_num_threads(threads)
    variants = part(config, index)
    ensemble = ensemble_class(config.layer, [v.modification for v in variants], [config.seeds[0]] * len(variants))
    data = task_data(config.task, config.seeds[:1])
    lr = torch.tensor([v.lr for v in variants])
    if trained:
        load_trained_weights(ensemble, config.task.kind)
        lr = lr * 0
    steps = STEPS[config.task.kind]
    return lambda: train(ensemble, data, steps=steps, epochs=1, lr=lr, step_errors=squared_errors, compile=compiled)


def step_time(config, *, threads, compiled=False, trained=False, flush=True, index=0):
    """Seconds per SGD step of part ``index`` of one seed's variants; ``flush=False`` keeps the
    subnormal floats that :func:`icl_lens.training.loop.train` flushes to zero."""
    run = training(config, threads=threads, compiled=compiled, trained=trained, index=index)
    if flush:
        return timed(run) / STEPS[config.task.kind]
    keep = torch.set_flush_denormal
    with patch("torch.set_flush_denormal", lambda on: keep(False)):
        return timed(run) / STEPS[config.task.kind]


def _other_worker(kind, trained, ready, stop):
    """The second worker of a full run: trains the other part, compiled, one thread, until told to stop."""
    run = training(section5.EXPERIMENTS[kind](), threads=1, compiled=True, index=1, trained=trained)
    run()
    ready.set()
    while not stop.is_set():
        run()


def test_loss_time(config, *, floor=True):
    """Seconds of one eager test-loss pass (what a run measures at each checkpoint) of part 1 at
    the saved run's trained weights, one thread, subnormals flushed; ``floor=False`` takes
    torch.logsumexp instead of floored_logsumexp_: the random-feature exponents unraised
    (EXPONENT_FLOOR), where eager exp underflows on its slow path, and a new tensor each step."""
    torch.set_num_threads(1)
    variants = part(config)
    seed = config.seeds[0]
    ensemble = AttentionEnsemble(config.layer, [v.modification for v in variants], [seed] * len(variants))
    load_trained_weights(ensemble, config.task.kind)
    data = task_data(config.task, [seed])
    tokens, targets = test_sets(config.task, data.weights, config.test_sequences)[seed]
    tokens, targets = (x.expand(len(variants), *x.shape).float() for x in (tokens, targets))
    torch.set_flush_denormal(True)   # as at a run's checkpoints (train's after_epoch)
    try:
        with nullcontext() if floor else patch.object(ensemble_module, "EXPONENT_FLOOR", None):
            return timed(lambda: test_loss(ensemble, tokens, targets))
    finally:
        torch.set_flush_denormal(False)


def step_time_beside_a_worker(config, *, trained=False):
    """:func:`step_time` compiled, one thread, while a second process trains the other part as
    a full run's second worker does: what the two processes cost each other."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    other = context.Process(target=_other_worker, args=(config.task.kind, trained, ready, stop))
    other.start()
    try:
        run = training(config, threads=1, compiled=True, trained=trained)
        run()
        ready.wait()
        return timed(run, repeats=3) / STEPS[config.task.kind]
    finally:
        stop.set()
        other.join()


def bound(config, index=0):
    """Seconds of the unavoidable exp and matmul work of one step of part ``index``, one thread, at
    the step's shapes."""
    torch.set_num_threads(1)
    models, n, d = len(part(config, index)), config.task.num_tokens, config.task.token_dim
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
    parser.add_argument("--keep", metavar="DIR", help="with --full, write the run's records to DIR (kept)")
    args = parser.parse_args()
    if args.keep and not args.full:
        parser.error("--keep needs --full")
    threads = torch.get_num_threads()
    print(f"torch {torch.__version__}, {threads} threads, {os.cpu_count()} cpus")
    projected = beside_projected = 0.0
    task_minutes = {}
    for kind in args.tasks:
        config = section5.EXPERIMENTS[kind]()
        trained = trained_weights(kind) is not None
        times = {
            "eager, 1 thread": step_time(config, threads=1),
            f"eager, {threads} threads": step_time(config, threads=threads),
            "compiled, 1 thread": step_time(config, threads=1, compiled=True),
        }
        if trained:
            times["compiled, trained weights"] = step_time(config, threads=1, compiled=True, trained=True)
            times["  the same, subnormals kept"] = step_time(config, threads=1, compiled=True, trained=True,
                                                           flush=False)
        last = "compiled, trained weights" if trained else "compiled, 1 thread"
        times[f"  {last.split(', ')[1]}, beside a second worker"] = beside = step_time_beside_a_worker(
            config, trained=trained)
        # the parts hold different variants (the maps and negative samples cost more): each is timed
        others = [step_time(config, threads=1, compiled=True, trained=trained, index=i) for i in range(1, WORKERS)]
        floor = bound(config)
        bounds = dict.fromkeys(times, floor)
        for i, seconds in enumerate(others, start=1):
            name = f"  part {i + 1} of {WORKERS} ({len(part(config, i))} models), {last.split(', ')[1]}"
            times[name], bounds[name] = seconds, bound(config, i)
        mean_part = (times[last] + sum(others)) / WORKERS
        steps = config.trained_epochs * config.steps_per_epoch   # with the half-length run copied off
        # each seed is split into WORKERS parts, and WORKERS processes train the parts side by side
        minutes = mean_part * steps * len(config.seeds) / 60
        projected += minutes
        task_minutes[kind] = minutes
        beside_projected += mean_part * beside / times[last] * steps * len(config.seeds) / 60
        print(f"{kind}: {len(part(config))} models in part 1, {config.epochs} epochs x {len(config.seeds)} seeds "
              f"x {config.steps_per_epoch} steps")
        for name, seconds in times.items():
            print(f"  {name:<46} {seconds * 1e3:8.2f} ms  {seconds / bounds[name]:5.1f}x its bound")
        if trained:
            print(f"  {'eager test-loss pass, trained weights':<46} {test_loss_time(config) * 1e3:8.1f} ms  "
                  f"(torch.logsumexp, exponents unraised: {test_loss_time(config, floor=False) * 1e3:.1f} ms)")
        print(f"  {'bound of part 1 (exp + 2 matrix products)':<46} {floor * 1e3:8.2f} ms | compiled is "
              f"{times['eager, 1 thread'] / times['compiled, 1 thread']:.1f}x faster than eager; a full run's "
              f"training: {minutes:.1f} min", flush=True)
    print(f"projected training time of a full run: {projected:.1f} min from the step alone, "
          f"{beside_projected:.1f} min from the step beside a second worker")
    if args.full:
        with tempfile.TemporaryDirectory() as scratch:
            start = time.perf_counter()
            run = subprocess.run([sys.executable, "-m", "icl_lens", "reproduce", "all", "--out", args.keep or scratch],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            minutes = (time.perf_counter() - start) / 60
        if run.returncode:
            sys.exit(f"reproduce all failed:\n{run.stderr}")
        log = run.stderr
        # the three tasks share one pool; the run logs each task's jobs' time over the workers
        # (training, test losses, context use, compilation: no waiting) and the pool's wall time
        for kind, seconds in re.findall(r"(\w+): \d+ models, \d+ epochs, ([\d.]+) s", log):
            if kind in task_minutes:
                print(f"  {kind}: its jobs {float(seconds) / 60:.1f} min over {WORKERS} workers, "
                      f"{float(seconds) / 60 / task_minutes[kind]:.2f}x its training's projection")
        for seconds in re.findall(r"\(one pool\): ([\d.]+) s", log):
            print(f"  the three tasks' pool: {float(seconds) / 60:.1f} min, "
                  f"{float(seconds) / 60 / projected:.2f}x the projection from the step alone")
        print(f"reproduce all (full mode): {minutes:.1f} min, {minutes / projected:.2f}x the projection from the "
              f"step alone, {minutes / beside_projected:.2f}x the one beside a second worker")


if __name__ == "__main__":
    main()
