"""Every file the package writes is written atomically (icl_lens.results.write_atomically): a write
interrupted at a fixed point inside it, in a child process, leaves the old file byte for byte, and
a failed write is a RecordError naming the file."""

import errno
import json
import multiprocessing
import os
import re
import shutil
import signal
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from icl_lens import results  # noqa: E402
from icl_lens.results import RecordError, save_result  # noqa: E402

OLD = {"old": [1.0, 2.0, 3.0]}


class HalfWriter:
    """A file whose writes stop after ``limit`` bytes with ``stop()`` (raise or end the process)."""

    def __init__(self, file, limit, stop):
        self.file, self.limit, self.stop, self.written = file, limit, stop, 0

    def write(self, data):
        room = self.limit - self.written
        if len(data) >= room:
            self.file.write(bytes(data[:room]))
            self.file.flush()
            self.stop()
        self.written += len(data)
        return self.file.write(data)

    def __getattr__(self, name):
        return getattr(self.file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def raise_full_disk():
    raise OSError(errno.ENOSPC, "No space left on device")


def raise_interrupt():
    raise KeyboardInterrupt


def exit_now():
    os._exit(7)


def kill_self():
    os.kill(os.getpid(), signal.SIGKILL)


def new_figure(points=(0, 1, 4)):
    figure, axis = plt.subplots(figsize=(2, 2))
    axis.plot(points)
    return figure


def child(folder, kind, where, stop, report):
    """In the child: patch the write at ``where`` to stop, then save a new record over the old one."""
    stops = {"full disk": raise_full_disk, "ctrl-c": raise_interrupt, "hard exit": exit_now, "sigkill": kill_self}
    calls = []
    target = 1 if kind == "json" else 2   # save_result writes the JSON first, then the PNG

    def patched(real, wrap):
        def call(*args, **kwargs):
            calls.append(real)
            if calls.count(real) == target:
                return wrap(real, *args, **kwargs)
            return real(*args, **kwargs)
        return call

    if where == "midway":   # after 100 bytes of the new file's content
        os.fdopen = patched(os.fdopen, lambda real, *a, **k: HalfWriter(real(*a, **k), 100, stops[stop]))
    elif where == "fsync":   # every byte written, not yet on disk
        os.fsync = patched(os.fsync, lambda real, fd: stops[stop]())
    elif where == "rename":
        os.replace = patched(os.replace, lambda real, *a: stops[stop]())
    try:
        if kind == "json":
            save_result(folder, "record", {"new": list(range(500))})
        else:   # the same JSON as before, a new figure
            save_result(folder, "record", OLD, new_figure())
        outcome = "finished"
    except RecordError as error:
        outcome = f"RecordError: {error}"
    except KeyboardInterrupt:
        outcome = "KeyboardInterrupt"
    with open(report, "w") as file:
        file.write(outcome)


CASES = [   # (file, where the write stops, how)
    ("json", "midway", "full disk"), ("json", "midway", "hard exit"), ("json", "midway", "ctrl-c"),
    ("json", "fsync", "sigkill"), ("json", "rename", "full disk"),
    ("png", "midway", "full disk"), ("png", "midway", "hard exit"), ("png", "midway", "ctrl-c"),
    ("png", "fsync", "sigkill"), ("png", "rename", "hard exit"),
]


@pytest.mark.parametrize("kind, where, stop", CASES)
def test_an_interrupted_write_leaves_the_old_file(tmp_path, kind, where, stop):
    folder = tmp_path / "out"
    save_result(folder, "record", OLD, new_figure((3, 1, 2)))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    report = tmp_path / "report.txt"
    process = multiprocessing.get_context("fork").Process(target=child, args=(folder, kind, where, stop, report))
    process.start()
    process.join(60)
    after = {p.name: p.read_bytes() for p in folder.iterdir() if not p.name.endswith(".partial")}
    assert after == before   # byte for byte, the JSON and the PNG
    if stop in ("hard exit", "sigkill"):
        assert process.exitcode == (7 if stop == "hard exit" else -signal.SIGKILL)
        assert not report.exists()
    else:
        assert process.exitcode == 0
        outcome = report.read_text()
        if stop == "ctrl-c":
            assert outcome == "KeyboardInterrupt"
        else:
            assert outcome.startswith("RecordError: cannot write ") and f"record.{kind}" in outcome
            assert "No space left" in outcome or stop != "full disk"
        assert not [p for p in folder.iterdir() if p.name.endswith(".partial")]   # cleaned up
    # the next write is not blocked by what the interrupted one left
    save_result(folder, "record", {"again": 1})
    assert json.loads((folder / "record.json").read_text()) == {"again": 1}


def test_a_complete_write_replaces_the_file_and_keeps_its_mode(tmp_path):
    path = results.write_json(tmp_path / "a.json", OLD)
    path.chmod(0o640)
    results.write_json(path, {"b": 2})
    assert json.loads(path.read_text()) == {"b": 2}
    assert path.stat().st_mode & 0o777 == 0o640
    assert results.write_json(tmp_path / "new.json", {}).stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "new.json"]


def test_an_unwritable_place_is_an_error_naming_the_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(RecordError, match="cannot write .*a-file/x.json"):
        results.write_json(tmp_path / "a-file" / "x.json", {"a": 1})
    with pytest.raises(RecordError, match="cannot write .*a-file/y.png"):
        save_result(tmp_path / "a-folder", "ok", {})   # a folder it may make, then a file where it cannot
        results.write_atomically(tmp_path / "a-file" / "y.png", lambda file: file.write(b"png"))


@pytest.mark.parametrize("value, field", [
    ({"a": float("nan")}, "a"), ({"a": {"b": [1.0, float("inf")]}}, "a.b[1]"),
    ({"models": [{"loss": [0.5, -float("inf")]}]}, "models[0].loss[1]"), (float("nan"), "(the record itself)"),
])
def test_a_record_with_nan_or_infinity_is_refused_naming_the_field(tmp_path, value, field):
    path = tmp_path / "r.json"
    path.write_text("{}\n")
    with pytest.raises(RecordError, match=rf"r\.json: field {re.escape(field)} is not a finite"):
        results.write_json(path, value)
    assert path.read_text() == "{}\n"


def test_null_is_written_and_read_back(tmp_path):
    results.write_json(tmp_path / "r.json", {"loss": [0.5, None]})
    assert results.load_result(tmp_path, "r") == {"loss": [0.5, None]}



SAVED = Path(__file__).resolve().parents[1] / "book" / "data" / "experiments"


@pytest.mark.skipif(not (SAVED / "task_linear.json").exists(), reason="no saved full run")
def test_a_full_disk_ends_the_command_with_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from icl_lens.__main__ import main

    shutil.copy(SAVED / "task_linear.json", tmp_path)
    (tmp_path / "fig3.json").write_text('{"old": 1}\n')
    monkeypatch.setattr(os, "fsync", lambda fd: raise_full_disk())
    with pytest.raises(SystemExit) as stopped:
        main(["reproduce", "fig3", "--reuse", "--out", str(tmp_path)])
    assert stopped.value.code == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cannot write {tmp_path / 'fig3.json'}: No space left on device" in line
    assert (tmp_path / "fig3.json").read_text() == '{"old": 1}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fig3.json", "task_linear.json"]
