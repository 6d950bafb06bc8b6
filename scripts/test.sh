#!/usr/bin/env bash
# Run every test: unit tests of icl_lens and every chapter executed (quick mode), then the book build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export ICL_LENS_QUICK=1
python -m pytest tests -v --timeout=1200 --durations=12 "$@"
