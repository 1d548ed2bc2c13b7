#!/usr/bin/env bash
# One lent-GPU session's measurements (issue 46, item 3; the brief: "calibrate on it, run real training steps of small
# models, and commit the measured results as dated data files with the device named"). Run from the repository root
# on the GPU machine with meshplan importable from src/ and an output folder OUT:
#
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh          # stages 1-3
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh more     # stages 4-5
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh megatron # stage 6 (megatron-core's wheel carried in .whl/)
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh compiled # stage 7
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh zoo      # stage 8
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh mds      # stage 9 (.gpu/mds, .gpu/ds and .whl/ carried)
#     OUT=/tmp/out bash benchmarks/measure/gpu_session.sh deepspeed # stage 10 (.gpu/ds and .whl/ carried)
#
# 1. benchmarks/measure/small_work_gpu.py: eager GPT training passes, host vs GPU time, kernel floors, dispatch fit;
# 2. meshplan calibrate on the GPU (GEMM, memory, attention, dispatch; one GPU: no collectives), with the calibrated
#    hardware TOML and a pytorch-fsdp stack whose host_dispatch is this host's;
# 3. benchmarks/docs/measured.py: check-step on the research zoo (predicted by replay, measured for real), on the host CPU;
# 4. benchmarks/measure/small_work_gpu.py --phases: forward / backward apart with their kernels, and check-step's host
#    microbenchmarks on the GPU's host;
# 5. benchmarks/docs/measured.py --device cuda: the zoo's check-step on the GPU;
# 6. small_work_gpu.py --stack megatron (rows and phases): the same GPT built by Megatron-Core's module code, with the
#    plain-PyTorch rows again in the same call as the baseline.
# 7. small_work_gpu.py --stack compiled (rows at micro-batch 1 and 8, phases at 1): each block under torch.compile
#    as torchtitan compiles it, with the plain-PyTorch rows again in the same call as the baseline.
# 8. benchmarks/docs/measured.py --device cuda alone: the zoo's check-step on the GPU, its records holding the step's
#    Python glue measured on the GPU's own host (measure/glue.py).
# 9. small_work_gpu.py --stack mds (rows, with DeepSpeed's BF16_Optimizer per-micro-batch work timed beside each,
#    and phases at 1 and 8): the same GPT built by Megatron-DeepSpeed's own model code (small_work_mds.py; a checkout
#    of microsoft/Megatron-DeepSpeed in .gpu/mds, DeepSpeed 0.19.8's pure-Python package in .gpu/ds, the wheels it
#    needs and the GPU image lacks in .whl/), one smoke row first; then the plain-PyTorch rows, floors and dispatch fit
#    in the same call as the baseline.
# 10. benchmarks/measure/deepspeed_engine_gpu.py: DeepSpeed 0.19.8's own engine (deepspeed.initialize) training the
#    plain-PyTorch GPT under ZeRO settings that pick BF16_Optimizer or the ZeRO optimizer (DeepSpeed's pure-Python
#    package in .gpu/ds, the wheels it needs in .whl/), one smoke row first.
# Each stage has its own time limit so that one that hangs leaves the others theirs; every output lands in OUT.
set -u
export PYTHONUNBUFFERED=1
EP=/tmp/meshplan-ep/meshplan-0.0.dist-info   # check-step finds the zoo through an entry point: register it
mkdir -p "$EP" "$OUT"
printf 'Metadata-Version: 2.1\nName: meshplan\nVersion: 0.0\n' > "$EP/METADATA"
printf '[meshplan.research]\nzoo = meshplan_research.zoo:ZOO\nlearned = meshplan_research.learned:apply_learned\n' \
  > "$EP/entry_points.txt"
export PYTHONPATH="$PWD/src:$(dirname "$EP")"
LOG="$OUT/log.txt"
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit --format=csv;
  lscpu | grep -E 'Model name|^CPU\(s\)'; python3 -c 'import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)'; } >> "$LOG" 2>&1
zoo() {  # the zoo's check-step on the GPU (stages 5 and 8), within T_ZOO or $1 seconds; ends the script
  echo "== zoo on cuda $(date -u +%T)" >> "$LOG"
  timeout "${T_ZOO:-$1}" python3 benchmarks/docs/measured.py --device cuda --rounds 2 --data "$OUT/zoo-cuda.jsonl.gz" \
    --doc "$OUT/MEASURED_GPU.md" >> "$LOG" 2>&1
  echo "== done rc=$? $(date -u +%T)" >> "$LOG"
  exit 0
}
if [ "${1:-}" = more ]; then
  echo "== phases $(date -u +%T)" >> "$LOG"
  timeout "${T_PHASES:-90}" python3 benchmarks/measure/small_work_gpu.py --phases --batches 1,8 --out "$OUT/phases.json" \
    >> "$LOG" 2>&1
  echo "== phases rc=$?" >> "$LOG"
  zoo 240
fi
if [ "${1:-}" = megatron ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
  for stack in megatron pytorch; do
    echo "== $stack rows $(date -u +%T)" >> "$LOG"
    timeout "${T_ROWS:-120}" python3 benchmarks/measure/small_work_gpu.py --stack $stack --out "$OUT/$stack.json" >> "$LOG" 2>&1
    echo "== $stack phases rc=$? $(date -u +%T)" >> "$LOG"
    timeout "${T_PHASES:-60}" python3 benchmarks/measure/small_work_gpu.py --stack $stack --phases --batches 1,8 \
      --out "$OUT/$stack-phases.json" >> "$LOG" 2>&1
  done
  echo "== done rc=$? $(date -u +%T)" >> "$LOG"
  exit 0
fi
if [ "${1:-}" = mds ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
  export PYTHONPATH="$PYTHONPATH:$PWD/.gpu/mds:$PWD/.gpu/ds:/tmp/site"
  export CUDA_DEVICE_MAX_CONNECTIONS=1  # as Megatron-DeepSpeed's example scripts set it (its validate_args asks)
  echo "== mds smoke $(date -u +%T)" >> "$LOG"
  timeout 120 python3 benchmarks/measure/small_work_gpu.py --stack mds --widths 1024 --batches 2 --depths 2 --steps 2 \
    --warmup 1 --out "$OUT/mds-smoke.json" >> "$LOG" 2>&1 || { echo "== smoke failed $(date -u +%T)" >> "$LOG"; exit 1; }
  echo "== mds rows $(date -u +%T)" >> "$LOG"
  timeout "${T_ROWS:-150}" python3 benchmarks/measure/small_work_gpu.py --stack mds --out "$OUT/mds.json" >> "$LOG" 2>&1
  echo "== mds phases rc=$? $(date -u +%T)" >> "$LOG"
  timeout "${T_PHASES:-60}" python3 benchmarks/measure/small_work_gpu.py --stack mds --phases --batches 1,8 \
    --out "$OUT/mds-phases.json" >> "$LOG" 2>&1
  echo "== pytorch rows rc=$? $(date -u +%T)" >> "$LOG"
  unset CUDA_DEVICE_MAX_CONNECTIONS
  timeout "${T_BASE:-120}" python3 benchmarks/measure/small_work_gpu.py --stack pytorch --out "$OUT/pytorch.json" >> "$LOG" 2>&1
  echo "== done rc=$? $(date -u +%T)" >> "$LOG"
  exit 0
fi
if [ "${1:-}" = deepspeed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl >> "$LOG" 2>&1
  export PYTHONPATH="$PYTHONPATH:$PWD/.gpu/ds:/tmp/site"
  echo "== deepspeed smoke $(date -u +%T)" >> "$LOG"
  timeout 150 python3 benchmarks/measure/deepspeed_engine_gpu.py --settings bf16-optimizer --widths 1024 --depths 2 \
    --batches 1 --steps 1 --warmup 1 --out "$OUT/deepspeed-smoke.json" >> "$LOG" 2>&1 \
    || { echo "== smoke failed $(date -u +%T)" >> "$LOG"; exit 1; }
  echo "== deepspeed rows $(date -u +%T)" >> "$LOG"
  timeout "${T_ROWS:-270}" python3 benchmarks/measure/deepspeed_engine_gpu.py --out "$OUT/deepspeed-engine.json" >> "$LOG" 2>&1
  echo "== done rc=$? $(date -u +%T)" >> "$LOG"
  exit 0
fi
if [ "${1:-}" = zoo ]; then
  zoo 300
fi
if [ "${1:-}" = compiled ]; then
  for stack in pytorch compiled; do
    echo "== $stack rows $(date -u +%T)" >> "$LOG"
    timeout "${T_ROWS:-200}" python3 benchmarks/measure/small_work_gpu.py --stack $stack --batches 1,8 --out "$OUT/$stack.json" \
      >> "$LOG" 2>&1
    echo "== $stack phases rc=$? $(date -u +%T)" >> "$LOG"
    timeout "${T_PHASES:-80}" python3 benchmarks/measure/small_work_gpu.py --stack $stack --phases --batches 1 \
      --out "$OUT/$stack-phases.json" >> "$LOG" 2>&1
  done
  echo "== done rc=$? $(date -u +%T)" >> "$LOG"
  exit 0
fi
echo "== small_work_gpu $(date -u +%T)" >> "$LOG"
timeout "${T_SMALL:-180}" python3 benchmarks/measure/small_work_gpu.py --out "$OUT/small_work.json" >> "$LOG" 2>&1
echo "== calibrate rc=$? $(date -u +%T)" >> "$LOG"
timeout "${T_CAL:-120}" python3 -m meshplan.cli calibrate --device cuda --base h200 --out "$OUT/calibrated.toml" \
  --stack-out "$OUT/eager-stack.toml" --stack-base pytorch-fsdp --json > "$OUT/calibrate.json" 2>> "$LOG"
echo "== measured rc=$? $(date -u +%T)" >> "$LOG"
timeout "${T_ZOO:-180}" python3 benchmarks/docs/measured.py --rounds 2 --data "$OUT/zoo.jsonl.gz" --doc "$OUT/MEASURED.md" \
  >> "$LOG" 2>&1
echo "== done rc=$? $(date -u +%T)" >> "$LOG"
