"""Result files: every figure of the book is a PNG beside a JSON of the numbers it plots.

Chapters: kernels, theorem_3_1, generalization_bound, transformer_layer, stacked_layers,
lipschitz_lemmas, weight_shifting, experiments, across_tasks, closeness_experiment, bert.

Every file the package writes goes through :func:`write_atomically` (a temporary file beside the
target, synced, then renamed over it), so an interrupted or failed write leaves the old file as it
was; every record it reads goes through :func:`load_result`, which names the file and the field on
any error. Both raise :class:`RecordError`.
"""

import json
import math
import os
import tempfile
from pathlib import Path

import torch


class RecordError(ValueError):
    """A result file that cannot be written or read as asked; the message names the file (and the
    field). A ValueError, so the command line turns it into one line and exit status 2."""


def results_dir(chapter, root=None, create=True):
    """``<repository>/results/<chapter>``, created if needed (unless ``create`` is False).

    The repository root is found from the working directory upward (the folder holding ``_toc.yml``),
    so a chapter run from ``book/`` or from the root writes to the same place. ``ICL_LENS_RESULTS``
    overrides the parent folder; it must be a folder one can write in (or one that can be made).
    """
    if root is None and os.environ.get(RESULTS_VARIABLE):
        root = check_writable_folder(os.environ[RESULTS_VARIABLE], RESULTS_VARIABLE)
    if root is None:
        root = repository_root() / "results"
    folder = Path(root) / chapter
    if create:
        folder.mkdir(parents=True, exist_ok=True)
    return folder


RESULTS_VARIABLE = "ICL_LENS_RESULTS"


def check_writable_folder(path, name):
    """``path`` as a Path, if it is a folder one can write in or one that can be made (its nearest
    existing parent is a writable folder); else a ValueError naming ``name`` (an argument or an
    environment variable). Nothing is created."""
    if not isinstance(path, (str, os.PathLike)) or str(path).strip() == "" or "\0" in str(path):
        raise ValueError(f"{name} must name a folder, got {path!r}")
    try:
        folder = Path(path)
        existing = folder
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise ValueError(f"{name} {str(path)!r} is not a folder ({existing} is a file)")
    except (OSError, ValueError) as error:   # a NUL byte, a name too long, a loop of links
        if str(error).startswith(name):
            raise
        raise ValueError(f"{name} {str(path)!r} is not a usable path: {error}") from None
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"{name} {str(path)!r} is not writable ({existing} is read-only)")
    return folder


def repository_root():
    """The folder holding ``_toc.yml``, searched from the working directory upward (else the working
    directory): chapters run from ``book/`` and from the root agree on it."""
    here = Path.cwd().resolve()
    return next((p for p in (here, *here.parents) if (p / "_toc.yml").exists()), here)


def to_plain(value):
    """Tensors and tuples to lists and floats, so ``json`` can write them."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().tolist()
    if isinstance(value, dict):
        return {str(k): to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v) for v in value]
    return value


def write_atomically(path, write):
    """Write ``path`` through ``write(binary file)`` so that it is either the old file or the whole
    new one: the bytes go to a temporary file in the same folder, are synced to disk, and the
    temporary file is renamed over ``path`` (one step on POSIX). Any OSError (a full disk, a
    read-only folder) becomes a :class:`RecordError` naming ``path``; the temporary file is removed."""
    path = Path(path)
    try:
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as error:
        raise RecordError(f"cannot write {path}: {error.strerror or error}") from None
    try:
        with os.fdopen(handle, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        # mkstemp makes the file 0600; keep the old file's mode, or the usual 0644 for a new one
        os.chmod(temporary, path.stat().st_mode & 0o777 if path.is_file() else 0o644)
        os.replace(temporary, path)
    except BaseException as error:
        Path(temporary).unlink(missing_ok=True)
        if isinstance(error, OSError):
            raise RecordError(f"cannot write {path}: {error.strerror or error} (the old file, if any, "
                              "is unchanged)") from None
        raise
    return path


def non_finite_field(value, where=""):
    """The key path of the first nan or infinity in a plain record (``"models[3].loss[7]"``), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "(the record itself)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = non_finite_field(item, f"{where}[{key}]" if isinstance(key, int) else
                                 f"{where}.{key}" if where else key)
        if found:
            return found
    return None


def write_json(path, data):
    """``data`` as JSON at ``path`` (sorted keys, so the same numbers give the same bytes), written
    atomically. JSON has no nan or infinity: a record holding one is refused, naming the field
    (a diverged loss is written as null by the code that records it)."""
    plain = to_plain(data)
    bad = non_finite_field(plain)
    if bad:
        raise RecordError(f"cannot write {path}: field {bad} is not a finite number (JSON has no nan or "
                          "infinity; record a divergence as None)")
    text = json.dumps(plain, sort_keys=True, indent=1, allow_nan=False) + "\n"
    return write_atomically(path, lambda file: file.write(text.encode("utf-8")))


def save_result(folder, name, data, figure=None, dpi=160):
    """Write ``name.json`` (:func:`write_json`) and ``name.png``, each atomically.

    Returns the paths written. The figure is closed, so a notebook shows it once, from the file.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {"json": write_json(folder / f"{name}.json", data)}
    if figure is not None:
        import matplotlib.pyplot as plt

        try:
            paths["png"] = write_atomically(folder / f"{name}.png", lambda file: figure.savefig(
                file, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": None}))
        finally:
            plt.close(figure)
    return paths


def refuse_constant(token):
    raise ValueError(f"a bare {token} (JSON has no nan or infinity; a divergence is recorded as null)")


# what ``expect`` of :func:`load_result` may name: a type, or a tuple of types
NUMBER = (int, float, type(None))   # a number, or null: a recorded divergence


def load_result(folder, name, expect=None):
    """The record ``name.json`` in ``folder``; a missing, truncated or non-JSON file, a bare ``NaN``
    or ``Infinity`` token, or a field of ``expect`` missing or of another type is a
    :class:`RecordError` naming the file (and the field). ``null`` is read as None.

    ``expect`` maps key paths to types: ``{"models": list, "models[].test_loss": NUMBER}``, where
    ``[]`` stands for every element of a list (or every value of a dict). ``float`` also accepts
    integers; ``bool`` is never a number.
    """
    path = Path(folder) / f"{name}.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecordError(f"{path} is missing") from None
    except (OSError, UnicodeDecodeError) as error:
        raise RecordError(f"cannot read {path}: {getattr(error, 'strerror', None) or error}") from None
    try:
        record = json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as error:
        raise RecordError(f"{path} is not valid JSON (truncated?): {error.msg} at line {error.lineno}, "
                          f"column {error.colno}") from None
    except ValueError as error:
        raise RecordError(f"{path}: {error}") from None
    for key_path, types in (expect or {}).items():
        check_field(record, [part for part in key_path.replace("[]", ".[]").split(".") if part], types, path, "")
    return record


def check_field(value, parts, types, path, where):
    """Walk ``parts`` of a key path into ``value``; the value(s) at its end must be of ``types``."""
    if not parts:
        types = types if isinstance(types, tuple) else (types,)
        if float in types:
            types = (*types, int)
        if isinstance(value, bool) and bool not in types or not isinstance(value, types):
            names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise RecordError(f"{path}: field {where or '(the record)'} must be {names}, "
                              f"got {type(value).__name__} {str(value)[:40]}")
        return
    part, rest = parts[0], parts[1:]
    if part == "[]":
        if not isinstance(value, (list, dict)):
            raise RecordError(f"{path}: field {where} must be a list, got {type(value).__name__}")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            check_field(item, rest, types, path, f"{where}[{key}]" if isinstance(key, int) else f"{where}.{key}")
        return
    if not isinstance(value, dict):
        raise RecordError(f"{path}: {'field ' + where if where else 'the record'} must be an object, "
                          f"got {type(value).__name__}")
    if part not in value:
        raise RecordError(f"{path}: field {(where + '.' if where else '') + part} is missing")
    check_field(value[part], rest, types, path, (where + "." if where else "") + part)
