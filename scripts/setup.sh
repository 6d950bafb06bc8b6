#!/usr/bin/env bash
# Make (or refresh) the environment both README commands use: .venv with the pinned packages and
# icl_lens in development mode, plus the JavaScript the book serves itself (_vendor/).
# It reinstalls only when pyproject.toml or js/package-lock.json changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
stamp=.venv/.icl-lens-installed
want=$(cat pyproject.toml js/package-lock.json | sha256sum | cut -d' ' -f1)

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || [ ! -f _vendor/require.js ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    # torch==2.13.0 is pinned in pyproject.toml: an unpinned torch would pull a multi-GB CUDA build
    .venv/bin/python -m pip install --quiet -e ".[book,test,bert,cluster]"
    (cd js && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    mkdir -p _vendor
    cp js/node_modules/requirejs/require.js _vendor/require.js
    mkdir -p _vendor/html-manager
    cp js/node_modules/@jupyter-widgets/html-manager/dist/embed-amd.js _vendor/html-manager/embed-amd.js
    echo "$want" > "$stamp"
fi

# The browser test opens the built pages in Debian's chromium (Playwright drives it; it downloads no
# browser of its own).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ]; then
        (apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium; }) >/dev/null
    else
        echo "setup: chromium is missing; install it (sudo apt-get install chromium) for tests/test_browser.py" >&2
    fi
fi
