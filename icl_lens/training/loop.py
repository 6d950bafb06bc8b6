"""The loop toolkit every trained study shares: the SGD step, the "decay" schedule, the fork that
copies a shorter run off a longer one, the ensemble's training loop and the process pool.

Chapters: experiments, transformer_layer, across_tasks, closeness_experiment, bert.

The "decay" schedule keeps the learning rate constant and lets it fall linearly to 0 over the last
``decay_fraction`` of a run (warmup-stable-decay without the warmup). Two runs of different lengths
are then the same run until the shorter one starts to decay, so the shorter one is copied off the
longer one there (:func:`fork_point`, :func:`fork`) and costs ``decay_fraction`` of a run.
"""

import contextlib
import copy
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor, as_completed

import torch

from icl_lens.device import pick
from icl_lens.validation import check_positive_int, check_scheduler


def sgd_step(parameters, lr):
    """p <- p - lr grad for every parameter with a gradient, then the gradient is cleared. ``lr`` is
    a number, or a tensor (M,) of per-model rates for parameters stacked over M models (dim 0)."""
    with torch.no_grad():
        for parameter in parameters:
            if parameter.grad is not None:
                rate = lr.reshape(-1, *[1] * (parameter.dim() - 1)) if torch.is_tensor(lr) else lr
                parameter -= rate * parameter.grad
                parameter.grad = None


def decay_factor(step, steps, decay_fraction):
    """The "decay" schedule at ``step`` of a run of ``steps``: 1, then a linear fall to 0 over the
    last ``decay_fraction`` of the steps."""
    decay_start = steps * (1 - decay_fraction)
    return 1.0 if step < decay_start else max(0.0, (steps - step) / (steps - decay_start))


def decay_schedule(steps, decay_fraction):
    """:func:`decay_factor` of a run of ``steps`` steps, as a function of the step."""
    return lambda step: decay_factor(step, steps, decay_fraction)


def fork_point(length, decay_fraction):
    """The unit (epoch or step, counted from 0) at which a "decay" run of ``length`` units may be
    copied off a longer run: no step before it has decayed, so up to there the runs are one."""
    return math.floor(length * (1 - decay_fraction))


def copy_stream(stream):
    """An independent copy of a data stream where it stands: a ``torch.Generator``, or an object
    with a ``copy()`` method (a study's per-seed streams)."""
    if isinstance(stream, torch.Generator):
        copied = torch.Generator(device=stream.device)
        copied.set_state(stream.get_state())
        return copied
    return stream.copy()


def fork(model, stream, optimizer=None):
    """What a shorter run continues from: a copy of the model, of its data stream and (where there
    is one) of the optimiser's state, none of them shared with the run it was copied off.
    Returns (model, stream, optimiser state or None)."""
    state = None if optimizer is None else copy.deepcopy(optimizer.state_dict())
    return copy.deepcopy(model), copy_stream(stream), state


class _Errors(torch.nn.Module):
    """``step_errors(model, tokens, targets)`` as a module, so that :func:`torch.func.functional_call`
    can run it on parameters given as tensors."""

    def __init__(self, model, step_errors):
        super().__init__()
        self.model, self.step_errors = model, step_errors

    def forward(self, tokens, targets):
        return self.step_errors(self.model, tokens, targets)


# SGD steps per compiled call at most (the largest count up to it that divides an epoch's steps):
# the steps are sequential, so a call pays the per-call overhead (guards, wrapper) once for this
# many; more steps lengthen compilation (seconds per step)
STEPS_PER_CALL = 4


def compiled_sgd_steps(model, step_errors):
    """A few SGD steps of :func:`train` as one graph through ``torch.compile``: for each step the
    models' loss, its gradient (``torch.func.grad``) and the update p - lr grad.

    Returns ``steps(parameters, tokens, targets, rates, total)`` -> (new parameters, total + the
    steps' errors): ``parameters`` is {name: tensor} of ``model.named_parameters()``, ``tokens``
    and ``targets`` hold K steps' sequences on dim 1, ``rates`` (K, M) the per-model rates of
    each. The plain loop dispatches some thirty small operations a step and updates outside the
    graph; a small sequential step is mostly that overhead (``benchmarks/batched_training.py``
    measures both). It computes what the plain loop computes, up to round-off
    (``tests/test_ensemble.py`` checks it in float64).
    """
    errors_module = _Errors(model, step_errors)

    def total_loss(parameters, tokens, targets):
        errors = torch.func.functional_call(errors_module, {f"model.{name}": p for name, p in parameters.items()},
                                            (tokens, targets))
        return errors.sum(), errors

    gradient = torch.func.grad(total_loss, has_aux=True)

    def steps(parameters, tokens, targets, rates, total):
        for k in range(tokens.shape[1]):
            gradients, errors = gradient(parameters, tokens[:, k : k + 1], targets[:, k : k + 1])
            parameters = {name: p - rates[k].reshape(-1, *[1] * (p.dim() - 1)) * gradients[name]
                          for name, p in parameters.items()}
            total = total + errors.to(total.dtype)
        return parameters, total

    return torch.compile(steps, dynamic=False, fullgraph=True)


def train(model, data, *, steps, epochs, lr, step_errors, schedule=None, first_epoch=0, before_epoch=None,
          after_epoch=None, progress=None, sum_dtype=None, compile=False, batch=1, optimizer=None):
    """SGD on stacked models, one sequence per model per step; returns the per-epoch mean training
    loss, (epochs, models). ``batch`` sequences per model per step and a ``torch.optim`` optimizer
    over ``model.parameters()`` (Adam: per entry, so stacked models still train apart; its rate is
    set to ``lr * schedule(t)`` before each step, ``lr`` then one number) give the protocol of a
    new task per prompt (:mod:`icl_lens.studies.modifications_across_tasks`); the defaults are
    Section 5's, bit for bit what they were.

    ``model`` holds M models stacked on dim 0 (an :class:`icl_lens.training.ensemble.AttentionEnsemble`,
    or a module with its ``seeds``); ``data.epoch(model.seeds, steps, dtype, device)`` gives each
    model its seed's sequences. ``step_errors(model, tokens, targets)`` is each model's loss (M,);
    the models' sum is differentiated, and since no weight is shared each model gets its own
    gradient. Epochs ``first_epoch`` to ``epochs - 1`` are trained (a forked run starts later);
    step t of the whole run (counted from epoch 0) uses ``lr * schedule(t)`` (constant if None).
    A model whose loss stops being finite gets nan from then on; the others are unaffected.
    ``before_epoch(epoch)`` and ``after_epoch(epoch + 1)`` run around each epoch (to fork a shorter
    run, to measure test losses); ``progress`` is a tqdm bar advanced once a step; the epoch's
    losses are summed in ``sum_dtype`` (default: the model's dtype). ``compile=True`` takes each
    few steps through :func:`compiled_sgd_steps`; the model's parameters are written back after every
    epoch, so the callbacks see the trained model either way. Subnormal floats are flushed to zero
    (``torch.set_flush_denormal``) from the start of each epoch's steps through its ``after_epoch``,
    on the calling thread: all of the work with one thread, as the full runs' workers have, part of
    it with more intra-op threads. PyTorch's default (not flushed) is back when it returns, also
    around a run forked inside ``before_epoch``; an epoch range that is empty gives (0, M).
    """
    check_positive_int(batch, "batch")
    if compile and (optimizer is not None or batch != 1):
        raise ValueError("compile fuses plain SGD steps on one sequence per model: train with optimizer=None and "
                         "batch=1, or with compile=False")
    if optimizer is not None and torch.is_tensor(lr):
        raise ValueError("an optimizer takes one learning rate for all the models: lr must be a number")
    parameter = next(model.parameters())
    dtype, device = parameter.dtype, parameter.device
    fused = compiled_sgd_steps(model, step_errors) if compile else None
    if fused is not None:
        rates = torch.as_tensor(lr, dtype=dtype, device=device).expand(len(model.seeds))
        # the largest call length up to STEPS_PER_CALL that divides the epoch: one graph per run
        per_call = max(k for k in range(1, STEPS_PER_CALL + 1) if steps % k == 0)
    history = []
    try:
        for epoch in range(first_epoch, epochs):
            if before_epoch is not None:
                before_epoch(epoch)
            # a trained layer's random-feature exponents reach far below their maximum, where exp
            # gives subnormal numbers, which the CPU computes tens of times slower; they are 1e-38 and
            # below, under float32's resolution of any sum they enter, so they are flushed to zero
            # (the exponential task's trained step: 4.5x; benchmarks/batched_training.py). Set every
            # epoch: a run forked in before_epoch has restored the default when it ends. The setting
            # is per thread, so it is complete with one thread (the full runs' workers).
            torch.set_flush_denormal(True)
            tokens, targets = data.epoch(model.seeds, steps * batch, dtype, device)
            total = torch.zeros(len(model.seeds), dtype=sum_dtype or dtype, device=device)
            factors = [1.0 if schedule is None else schedule(epoch * steps + step) for step in range(steps)]
            if fused is not None:
                parameters = {name: p.detach() for name, p in model.named_parameters()}
                step_rates = torch.tensor(factors, dtype=dtype, device=device)[:, None] * rates
                for step in range(0, steps, per_call):
                    block = slice(step, step + per_call)
                    parameters, total = fused(parameters, tokens[:, block], targets[:, block], step_rates[block], total)
                    if progress is not None:
                        progress.update(per_call)
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        p.copy_(parameters[name])
            else:
                for step in range(steps):
                    rows = slice(step * batch, (step + 1) * batch)
                    errors = step_errors(model, tokens[:, rows], targets[:, rows])
                    errors.sum().backward()
                    rate = lr if schedule is None else lr * factors[step]
                    if optimizer is None:
                        sgd_step(model.parameters(), rate)
                    else:
                        for group in optimizer.param_groups:
                            group["lr"] = rate
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    total += errors.detach().to(total.dtype)
                    if progress is not None:
                        progress.update(1)
            history.append(total.to(torch.float64) / steps)
            if after_epoch is not None:
                after_epoch(epoch + 1)
    finally:
        torch.set_flush_denormal(False)   # PyTorch's default
    return torch.stack(history) if history else torch.empty(0, len(model.seeds), dtype=torch.float64)


def run_jobs(function, jobs, *, device="cpu", workers=1, costs=None, done=None, scheduler=None):
    """``[function(*job, device=device) for job in jobs]``; with ``workers > 1`` (CPU only) in that
    many spawned processes that share the CPU's threads equally. Every draw of the studies is
    seeded, so a job gives the same numbers in any process and in any order. ``costs``, where
    given, ranks the jobs by how long they take (one sortable value a job, in the jobs' order): the
    workers take the longest first, so that none is left with a long job at the end while the
    others wait; the results keep the jobs' order.
    ``done(i, result)``, where given, is called in this process as each job ends (job ``i`` of
    ``jobs``, in the order they end), so that a caller can save what is finished before the rest.
    ``scheduler``, the address of a Dask scheduler (``tcp://host:8786``), sends the jobs to that
    cluster through distributed's ``concurrent.futures`` executor instead of local processes, each
    job pinned to the threads a local worker would have, so that the numbers are the local pool's."""
    check_positive_int(workers, "workers")
    check_scheduler(scheduler)
    if costs is not None and len(costs) != len(jobs):
        raise ValueError(f"costs must hold one value a job, got {len(costs)} for {len(jobs)} jobs")
    device = pick(device)
    results = [None] * len(jobs)
    if workers == 1 and scheduler is None:
        for i, job in enumerate(jobs):
            results[i] = function(*job, device=device)
            if done is not None:
                done(i, results[i])
        return results
    if device.type != "cpu":
        raise ValueError(f"workers > 1 and a scheduler train on the CPU; use workers=1 with device={str(device)!r}")
    threads = job_threads(workers, scheduler)
    # a stable sort: jobs of one cost keep their order
    order = sorted(range(len(jobs)), key=lambda i: costs[i], reverse=True) if costs else range(len(jobs))
    with _pool(workers, scheduler) as pool:
        # the pool hands out jobs in the order they are submitted
        futures = {pool.submit(_in_worker, function, jobs[i], threads): i for i in order}
        for future in as_completed(futures):
            i = futures[future]
            results[i] = future.result()
            if done is not None:
                done(i, results[i])
    return results


def job_threads(workers, scheduler=None):
    """The intra-op threads each job of :func:`run_jobs` trains with: all of this process's with one
    local worker, else an equal share of them."""
    if workers == 1 and scheduler is None:
        return torch.get_num_threads()
    return max(1, torch.get_num_threads() // workers)


@contextlib.contextmanager
def _pool(workers, scheduler):
    """The local pool of ``workers`` spawned processes, or a Dask cluster's executor."""
    if scheduler is None:
        with ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
            yield pool
        return
    try:
        from distributed import Client
    except ImportError as error:
        raise ValueError("scheduler needs Dask's distributed package: pip install -e '.[cluster]'") from error
    with Client(scheduler) as client:
        yield client.get_executor()


def _in_worker(function, job, threads):
    torch.set_num_threads(threads)
    return function(*job, device="cpu")
