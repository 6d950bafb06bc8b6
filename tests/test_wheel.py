"""The package installs as a package: a wheel built from the repository holds every subpackage, and
``python -m icl_lens`` runs from it, outside the repository, with nothing downloaded (the pinned
dependencies are seen from the environment running the tests)."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_and_runs_outside_the_repository(tmp_path):
    source = tmp_path / "source"   # a copy, so the build leaves no build/ or egg-info in the repository
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "icl_lens", source / "icl_lens", ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                    "-q", "-w", str(wheels), str(source)], check=True, cwd=tmp_path, timeout=120)
    (wheel,) = wheels.glob("icl_lens-*.whl")
    packaged = {Path(name).parent.as_posix() for name in zipfile.ZipFile(wheel).namelist()
                if name.endswith(".py")}
    expected = {p.parent.relative_to(ROOT).as_posix() for p in (ROOT / "icl_lens").rglob("__init__.py")}
    assert expected <= packaged and {"icl_lens/training", "icl_lens/studies", "icl_lens/bert",
                                     "icl_lens/figures"} <= expected
    target = tmp_path / "installed"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                    str(target), str(wheel)], check=True, cwd=tmp_path, timeout=120)
    elsewhere = tmp_path / "elsewhere"   # no _toc.yml above it, and the repository not on the path
    elsewhere.mkdir()
    environment = {**os.environ, "PYTHONPATH": str(target), "ICL_LENS_RESULTS": str(tmp_path / "results"),
                   "PYTHONSAFEPATH": "1"}

    def icl_lens(*args):
        return subprocess.run([sys.executable, "-m", "icl_lens", *args], cwd=elsewhere, env=environment,
                              capture_output=True, text=True, timeout=120)

    where = subprocess.run([sys.executable, "-c", "import icl_lens.studies.section5 as m; print(m.__file__)"],
                           cwd=elsewhere, env=environment, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(str(target)), where.stderr   # not the repository's copy
    shown = icl_lens("--help")
    assert shown.returncode == 0 and "reproduce" in shown.stdout, shown.stderr
    # a quick command that imports every subpackage the CLI uses: fig3 redrawn from a saved record
    saved = ROOT / "book" / "data" / "experiments" / "task_linear.json"
    out = tmp_path / "out"
    out.mkdir()
    if saved.exists():
        shutil.copy(saved, out)
        drawn = icl_lens("reproduce", "fig3", "--reuse", "--out", str(out))
        assert drawn.returncode == 0, drawn.stderr
        assert (out / "fig3.png").read_bytes()[:4] == b"\x89PNG"
        (out / "task_linear.json").unlink()
    missing = icl_lens("reproduce", "fig3", "--reuse", "--out", str(out))
    assert missing.returncode == 2 and "task_linear.json is missing" in missing.stderr
