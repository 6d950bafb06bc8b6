#!/usr/bin/env bash
# Build the book: every chapter executed from scratch, Sphinx warnings are errors, HTML in _build/html.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
# a clean build: the execution cache does not notice changes to icl_lens, and a re-build after a
# failure would pass without re-running the failed chapter
rm -rf _build
jupyter-book build . -W --keep-going --all "$@"
echo "book built: $PWD/_build/html/index.html"
