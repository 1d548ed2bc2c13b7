#!/usr/bin/env bash
# Everything the tests need, so that none skips on a CPU machine: .venv with meshplan and its `dev` extra (pytest,
# ruff, matplotlib, Jinja2, vl-convert-python, Playwright, Ray, pandas, CPU PyTorch, transformers, DeepSpeed) and headless
# Chromium (Debian's package, which Playwright drives: it downloads no browser) for the browser
# test of the HTML report. Idempotent and quick when everything is already there. The README's test command runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1; then
    sudo=""
    if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq || (sleep 5 && $sudo apt-get update -qq)
    $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
  else
    echo "install-extras: no apt-get here: install Chromium yourself for tests/test_report.py's browser test" >&2
  fi
fi
[ -x .venv/bin/pip ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[dev]'
