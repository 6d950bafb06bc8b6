"""A folder of finished training jobs, so that a long run can be interrupted and continued, and a
saved run grown with new seeds, without training any finished job again.

Chapters: experiments, running.

Each job's result is written, as soon as the job ends, to a file of its own named by the job (its
seed and a hash of what it trains), atomically (:func:`icl_lens.results.write_atomically`): a
killed run loses only its jobs in flight. The folder's ``configuration.json`` holds everything that
the jobs' numbers depend on apart from the job itself (the task's settings without its seed list,
compilation, the workers and threads, the device); a journal of another configuration is refused,
not mixed in.
"""

import gzip
import hashlib
import json
from pathlib import Path

from icl_lens.results import RecordError, to_plain, write_atomically

CONFIGURATION = "configuration.json"


def plain(value):
    """``value`` as the JSON types it is saved in (tuples become lists), for comparing."""
    return json.loads(json.dumps(to_plain(value), sort_keys=True, allow_nan=True))


def differences(saved, wanted, where=""):
    """The key paths where two plain configurations differ (``"epochs: 160 -> 320"``)."""
    if isinstance(saved, dict) and isinstance(wanted, dict):
        found = []
        for key in sorted(set(saved) | set(wanted)):
            found += differences(saved.get(key), wanted.get(key), f"{where}.{key}" if where else key)
        return found
    return [] if saved == wanted else [f"{where or '(all)'}: {saved!r} -> {wanted!r}"]


def record_differences(record_config, configuration):
    """:func:`differences` between a saved record's configuration and a journal's, the seeds aside
    (a journal grows its seeds)."""
    saved = {key: value for key, value in record_config.items() if key not in ("seeds", "deciding")}
    return differences(saved, configuration)


class Journal:
    """The finished jobs of one configuration in ``folder``.

    ``keep=False`` starts a new journal (the files of an earlier one are removed: a new run replaces
    its record anyway); ``keep=True`` keeps the finished jobs of the journal there, which must be of
    ``configuration`` (a ``ValueError`` naming what differs, before any work, if not)."""

    def __init__(self, folder, configuration, *, keep):
        self.folder = Path(folder)
        self.configuration = plain(configuration)
        path = self.folder / CONFIGURATION
        if keep and path.exists():
            saved = json.loads(path.read_text())
            changed = differences(saved, self.configuration)
            if changed:
                raise ValueError(f"{self.folder} holds jobs of another configuration ({'; '.join(changed[:4])}), "
                                 "so none of them can be reused: train anew without --grow, or in another --out")
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise RecordError(f"cannot make the journal folder {self.folder}: {error.strerror}") from None
        if not keep:
            for old in self.folder.glob("*.json.gz"):
                old.unlink()
        text = json.dumps(self.configuration, sort_keys=True, indent=1) + "\n"
        write_atomically(path, lambda file: file.write(text.encode("utf-8")))

    def path(self, seeds, description):
        """The file of the job that trains ``seeds`` with ``description`` (plain data)."""
        digest = hashlib.sha256(json.dumps(plain(description), sort_keys=True).encode("utf-8")).hexdigest()
        return self.folder / f"seed{'-'.join(str(s) for s in seeds)}-{digest[:16]}.json.gz"

    def finished(self, seeds, description):
        """The saved result of that job, or None where it has not finished."""
        path = self.path(seeds, description)
        if not path.exists():
            return None
        try:
            return json.loads(gzip.decompress(path.read_bytes()))
        except (OSError, ValueError) as error:
            raise RecordError(f"{path} cannot be read back ({error}); remove it to train that job again") from None

    def save(self, seeds, description, result):
        # the job's own numbers, nan and infinity included (the record converts them later)
        data = gzip.compress(json.dumps(to_plain(result), sort_keys=True, allow_nan=True).encode("utf-8"), mtime=0)
        write_atomically(self.path(seeds, description), lambda file: file.write(data))


def training_time(folder, records=None):
    """{sub-folder (a task): {"jobs": finished jobs, "seconds": their training seconds summed}} of
    the journals under ``folder``: what a run cost, read from the jobs it kept. With ``workers``
    processes the run's wall time is about the sum over tasks divided by ``workers``.

    With ``records`` ({task: saved record}), a task counts only where its journal is the record's
    run (the journal's configuration is the record's, seeds aside), and only the jobs of the
    record's seeds: a journal of another run, one growing in the same folder, is not this record's
    cost."""
    found = {}
    for task in sorted(p for p in Path(folder).iterdir() if (p / CONFIGURATION).exists()):
        configuration = json.loads((task / CONFIGURATION).read_text())
        record = None if records is None else records.get(task.name)
        if records is not None and (record is None or
                                    record_differences(record["config"], configuration.get("config", {}))):
            continue
        jobs = [json.loads(gzip.decompress(path.read_bytes())) for path in sorted(task.glob("*.json.gz"))]
        if record is not None:
            jobs = [job for job in jobs if set(job.get("seeds", ())) <= set(record["config"]["seeds"])]
        found[task.name] = {"jobs": len(jobs), "seconds": sum(float(job.get("seconds", 0.0)) for job in jobs),
                            "workers": configuration.get("workers", 1)}
    return found
