#!/usr/bin/env bash
# Everything the tests need, so that none skips on a CPU machine: .venv with meshplan and its `dev` extra (pytest,
# ruff, matplotlib, Jinja2, vl-convert-python, Playwright, Ray, pandas, CPU PyTorch, transformers, DeepSpeed, the
# `rl` extra), verl and OpenRLHF without their dependencies (tests/test_rl_launch.py), and headless
# Chromium (Debian's package, which Playwright drives: it downloads no browser) for the browser tests of the HTML
# reports, and the frameworks' own argument parsers (.ci/parsers.py). Idempotent and quick when everything is already
# there; each step says what it fetches. The README's test command runs it.
#
# What it needs: python3 with venv and network access to PyPI (the `dev` extra). Chromium comes from apt-get, which
# needs root or password-less sudo; without them (or without apt-get, or offline) it says so and goes on: the browser
# tests (tests/test_report_browser.py, tests/test_serve_report_browser.py) then skip with that reason, the rest runs.
set -euo pipefail
cd "$(dirname "$0")/.."
have_chromium() { type -P chromium >/dev/null 2>&1 || type -P chromium-browser >/dev/null 2>&1; }  # files only (type -P), never a function
skip_browser() {
  echo "install-extras: Chromium not installed ($1): the browser tests will skip; to run them: as root," \
       "apt-get install chromium fonts-dejavu-core" >&2
}
install_chromium() {
  have_chromium && return
  local as_root=""
  if [ "$(id -u)" = 0 ]; then as_root="yes"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then as_root="sudo -n"
  fi
  if ! command -v apt-get >/dev/null 2>&1; then
    skip_browser "no apt-get on this system"
  elif [ -z "$as_root" ]; then
    skip_browser "not root and no password-less sudo"
  else
    local run=""
    if [ "$as_root" != "yes" ]; then run="$as_root"; fi
    export DEBIAN_FRONTEND=noninteractive
    if ! { $run apt-get update -qq || { sleep 5 && $run apt-get update -qq; }; } ||
       ! $run apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null; then
      skip_browser "apt-get could not install it (offline?)"
    fi
  fi
}
# Chromium (apt-get) and the frameworks' parsers (pip download, into a folder of their own) are fetched while pip
# installs the dev extra: pip fetches one file at a time (no option for more; pypa/pip#8771, parallel wheel downloads,
# was closed unmerged), so the three wait on the network side by side; neither writes into .venv's site-packages.
# Chromium only ever warns; a failed parsers step fails this script at its `wait`; a script that stops early still
# waits for both (no apt-get or pip left running behind it; after Ctrl-C too, since background jobs ignore SIGINT:
# apt-get is not stopped inside dpkg).
trap wait EXIT
install_chromium & chromium_pid=$!
[ -x .venv/bin/pip ] || python3 -m venv .venv
# pip's own lines, less its "Requirement already satisfied" ones: what it downloads and installs, as it goes
echo "install-extras: meshplan and the dev extra into .venv (first run: about 1 GB of wheels, 3.4 GB installed," \
     "5-15 minutes; later runs: seconds)" >&2
# the frameworks' own parsers that cannot share the dev extra's pins (Megatron-LM's megatron/training, vLLM, SGLang):
# their wheels' Python files in .venv/framework-parsers for tests/framework_parsers.py (.ci/parsers.py)
.venv/bin/python .ci/parsers.py .venv/framework-parsers & parsers_pid=$!
.venv/bin/pip install --disable-pip-version-check -e '.[dev]' 2>&1 |
  { grep --line-buffered -E '^ *(Collecting|Downloading|Installing|Successfully|ERROR|error)' || true; }
# verl's and OpenRLHF's config code for tests/test_rl_launch.py, without their dependencies (pyproject.toml's rl extra)
.venv/bin/pip install -q --disable-pip-version-check --no-deps verl==0.9.1 openrlhf==0.11.2
wait "$parsers_pid"
# Byte-compiled once, here: with PYTHONDONTWRITEBYTECODE set (as on the project's machines) every process the tests
# start (the CLI, the benchmark scripts, each gloo rank) would otherwise compile meshplan's sources again (~0.7 s of
# CPU each); Python still recompiles any file edited since.
.venv/bin/python -m compileall -q -j 0 src benchmarks tests >/dev/null
# and the frameworks' parsers the tests import in a child process (tests/framework_parsers.py): .ci/parsers.py unpacks
# their Python files only, so every such child compiled each module it imports (vLLM's and SGLang's child: 16.1 s of
# CPU, 12.6 s with their bytecode; Megatron-LM's: 9.0, 8.5; measured on copies at load 12). About 45 s of CPU the
# first time, then a check of each file's time stamp.
.venv/bin/python -m compileall -q -j 0 .venv/framework-parsers/engines .venv/framework-parsers/megatron-lm >/dev/null
# and, for the same reason, the code of the methods dataclasses writes (meshplan/cli/codecache.py: kept beside the
# bytecode, never written where PYTHONDONTWRITEBYTECODE is set): one plan, with bytecode writing on for it alone
PYTHONDONTWRITEBYTECODE= .venv/bin/meshplan plan --model llama3-70b --system h100 --gpus 1024 --global-batch 512 \
  >/dev/null
# and the test files as pytest rewrites their asserts (tests/__pycache__/*-pytest-*.pyc, which pytest writes only where
# bytecode writing is on): every pytest-xdist worker collects every file, and rewriting them took 13-14 s of CPU in
# each (collect-only: 23.8 s of CPU without these files, 9.7 s with them); pytest rewrites again any file edited since
# (a collection error is not this step's to report: the test run that follows reports it)
PYTHONDONTWRITEBYTECODE= .venv/bin/python -m pytest -q -p no:cacheprovider --collect-only -n 0 >/dev/null || true
wait "$chromium_pid"
echo "install-extras: done" >&2
