"""The training jobs on a Dask cluster (``--scheduler``): the same records, byte for byte, as the
local process pool, through distributed's concurrent.futures executor."""

import json
from dataclasses import replace

import pytest

from icl_lens.studies import section5
from icl_lens.training.ensemble import Modification
from icl_lens.training.loop import run_jobs

distributed = pytest.importorskip("distributed", reason="the cluster extra is installed by scripts/setup.sh")


def small_config():
    """The linear task at its quick sizes, two seeds, two short epochs: seconds a job."""
    return replace(section5.linear_experiment().quick(), epochs=2, checkpoints=2, seeds=(0, 1),
                   tokens_per_epoch=2048, quick_tokens_per_epoch=2048)


# the normal model and one modified one: two workers each get one of every seed's two parts
VARIANTS = [section5.Variant("normal", Modification(), 0.005),
            section5.Variant("alpha=0.1", Modification(alpha=0.1), 0.005)]


def without_timings(record):
    """The record as bytes, without the wall-clock seconds a job reports (they differ run to run)."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("seconds",)}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return json.dumps(strip(record), sort_keys=True).encode()


@pytest.fixture(scope="module")
def cluster():
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=40) as local:
        yield local


def test_a_sweep_on_a_local_cluster_gives_the_local_pools_records(cluster):
    config = small_config()
    pooled = section5.run_experiment(config, progress=False, workers=2, variants=VARIANTS)
    on_dask = section5.run_experiment(config, progress=False, workers=2, variants=VARIANTS,
                                      scheduler=cluster.scheduler_address)
    assert without_timings(on_dask) == without_timings(pooled)
    # and a different grouping of the models is a different record (the comparison can fail)
    alone = section5.run_experiment(config, progress=False, workers=1, variants=VARIANTS)
    assert without_timings(alone) != without_timings(pooled)


def _square(x, *, device):
    return x * x


def test_jobs_come_back_in_their_order_and_as_they_end(cluster):
    ended = []
    found = run_jobs(_square, [(i,) for i in range(6)], workers=2, costs=[1, 5, 2, 4, 3, 0],
                     done=lambda i, result: ended.append(i), scheduler=cluster.scheduler_address)
    assert found == [i * i for i in range(6)] and sorted(ended) == list(range(6))


@pytest.mark.parametrize("address", ["localhost:8786", "tcp://", 8786, "   "])
def test_a_bad_address_is_named_before_any_job(address):
    calls = []
    with pytest.raises(ValueError, match="scheduler must be a Dask scheduler address"):
        run_jobs(lambda *job, device: calls.append(job), [(1,)], workers=2, scheduler=address)
    assert not calls


def test_the_new_task_study_on_a_local_cluster_gives_the_local_pools_record(cluster):
    """The modifications-across-tasks study (Adam, a new task per prompt, issue 40) sends its
    jobs to Dask the same way: the same record as the local pool."""
    from icl_lens.studies import modifications_across_tasks as study

    config = replace(study.StudyConfig(variants="pilot", seeds=(3, 4)).quick(), epochs=2, checkpoints=2)
    pooled = study.run_study(config, workers=2)["record"]
    on_dask = study.run_study(config, workers=2, scheduler=cluster.scheduler_address)["record"]
    assert without_timings(on_dask) == without_timings(pooled)
    assert {m["name"] for m in pooled["models"]} == {"normal", "g2=gelu"}
    # another seed is another record (the comparison can fail)
    other = study.run_study(replace(config, seeds=(3, 5)), workers=2)["record"]
    assert without_timings(other) != without_timings(pooled)
