"""Two local Dask workers against the local process pool, side by side in one run: the same Section 5
jobs (the linear task at its quick sizes, every variant, two seeds) trained once through each, the
records compared, and the times printed with their ratio.

    python benchmarks/dask_pool.py [--epochs 2] [--seeds 0 1]

The cluster's start is timed apart: on a real cluster it is paid once for a whole sweep.
"""

import argparse
import json
import time
from dataclasses import replace

import torch

from icl_lens.studies import section5


def without_timings(record):
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "seconds"}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return json.dumps(strip(record), sort_keys=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    from distributed import LocalCluster

    config = replace(section5.linear_experiment().quick(), epochs=args.epochs, checkpoints=args.epochs,
                     seeds=tuple(args.seeds))
    print(f"{len(config.variants())} variants x {len(config.seeds)} seeds, {config.epochs} epochs, "
          f"{torch.get_num_threads()} threads here")
    start = time.perf_counter()
    pooled = section5.run_experiment(config, progress=False, workers=2)
    local = time.perf_counter() - start
    start = time.perf_counter()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                      silence_logs=40) as cluster:
        started = time.perf_counter() - start
        start = time.perf_counter()
        on_dask = section5.run_experiment(config, progress=False, workers=2, scheduler=cluster.scheduler_address)
        dask = time.perf_counter() - start
    print(f"local pool, 2 processes:  {local:7.1f} s (its processes' start included)")
    print(f"Dask, 2 local workers:    {dask:7.1f} s (cluster start {started:.1f} s apart)")
    print(f"Dask / local pool:        {dask / local:7.2f}   (with the cluster's start: {(dask + started) / local:.2f})")
    print("records identical:", without_timings(on_dask) == without_timings(pooled))


if __name__ == "__main__":
    main()
