#!/usr/bin/env bash
# Optional extras for the tests (report, sweep, calibrate, trace, model): headless Chromium (Debian's package) for the
# browser test, and the plot / ray extras (+ pandas, which the sweep test reads the CSV / JSON with) in .venv.
# Idempotent and quick when everything is already there. Called by .ci/run before the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v chromium >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq || (sleep 5 && $sudo apt-get update -qq)
  $sudo apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
fi
[ -x .venv/bin/pip ] || python3 -m venv .venv
.venv/bin/pip install -q -e '.[test,plot,ray]' 'pandas>=2'
.venv/bin/pip install -q 'torch==2.13.0'  # tests/test_calibrate.py and test_trace.py: on CPU (gloo, fake tensors)
.venv/bin/pip install -q 'transformers>=4.40'  # tests/test_model.py: parameter counts against HF models on meta
