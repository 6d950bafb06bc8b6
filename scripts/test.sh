#!/usr/bin/env bash
# Run every test: unit tests of icl_lens and every chapter executed (quick mode), then the book build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export ICL_LENS_QUICK=1
# Two pytest workers, one thread each: the book build (and the tests that read the built book,
# one xdist group) runs on one core while the unit tests and the chapters run on the other. One
# thread each, since two processes with two threads each on two cores spend their time waiting.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
python -m pytest tests -v --timeout=1200 --durations=12 -n "${TEST_WORKERS:-2}" --dist loadgroup "$@"
