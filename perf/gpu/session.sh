#!/bin/bash
# One GPU session in one command, for machines lent by the minute (15
# minutes of device time a session, its start included): build only zinf
# and the gpu test binaries, run the gpu tests and a few seconds of zinf
# bench attention on the GPU, then the head-to-head rows in the order issue
# 17 needs them (cpu/cpu first: GPU busy by CUDA events and the ratio to
# DeepSpeed; then the 200-step bf16 against fp32 curve), each started only
# while the time left covers its estimate; the table of what ran. Here,
# with network: make device-debs; there (carry .deps), from the repository
# root:
#   bash perf/gpu/session.sh OUTDIR [SECONDS]
# SECONDS (default 600) is this script's share of the device time. Logs and
# one JSON per row in OUTDIR (perf/gpu/headtohead.sh's layout).
set -uo pipefail
out=${1:?usage: session.sh OUTDIR [SECONDS]}
budget=${2:-600}
t0=$(date +%s)
left() { echo $((budget - ($(date +%s) - t0))); }
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
echo "== $(cat "$out/gpu.txt"), $(nproc) CPUs"
targets="zinf comm_nccl_test device_cuda_test kernels_cuda_kernels_test model_gpt_cuda_test model_trainer_cuda_test \
zero3_engine_cuda_test"
make gpu-test GPU_TARGETS="$targets" JOBS="$(nproc)" > "$out/gpu-test.log" 2>&1
echo "== gpu tests: exit $?, $(grep -E 'tests passed|tests failed' "$out/gpu-test.log" | tail -1) ($(($(date +%s) - t0)) s)"
[ -x build-gpu/zinf ] || { tail -30 "$out/gpu-test.log"; exit 1; }
# The fused attention against the bf16 tensor-core matmul, at the 1.1B
# Llama's width and the rows' micro-batch (a few seconds; checked against
# the host first).
timeout 120 build-gpu/zinf bench attention --device cuda --batch 4 --seq-len 1024 --embd 2048 --heads 32 \
  --json "$out/attention.json" > "$out/attention.log" 2>&1
echo "== attention: exit $?, $(grep -E '"(forward|backward|matmul)_tflops"' "$out/attention.json" 2>/dev/null | tr -d ' \n')"
. perf/gpu/setup.sh
c=perf/gpu_compare.py
m=${MODELS:-/tmp/zinf-models}
nvme=${NVME:-/tmp/zinf-nvme}
row() {  # estimate-seconds name model config micro-batch steps trainers
  if [ "$(left)" -lt "$1" ]; then
    echo "== $2: skipped ($(left) s left, about $1 s needed)"
    return
  fi
  [ -f "$m/$3/model.safetensors" ] || python3 $c make-model --shape "$3" --dir "$m/$3" > "$out/make-$3.log" 2>&1
  python3 $c compare --zinf perf/gpu/zinf-gpu --model "$m/$3" --config "perf/gpu/$4.json" --micro-batch "$5" \
    --steps "$6" --trainers "$7" --nvme-path "$nvme" --work "$out/$2" --json "$out/$2.json" 2>&1 | grep gpu_compare
  echo "== $2 done ($(($(date +%s) - t0)) s)"
}
# The 16-bit mode's losses against the fp32 path's over 200 steps of the
# demo model (issue 17's curve), and its plot; under curve/ so that the
# table below reads only the rows.
curve() {  # estimate-seconds
  if [ "$(left)" -lt "$1" ]; then
    echo "== curve: skipped ($(left) s left, about $1 s needed)"
    return
  fi
  mkdir -p "$out/curve"
  python3 $c curve --zinf perf/gpu/zinf-gpu --model demo --config configs/cpu-offload.json --steps 200 \
    --work "$out/curve/work" --json "$out/curve/demo-200.json" 2>&1 | tail -1
  python3 $c plot "$out/curve/demo-200.json" --svg "$out/curve/demo-200.svg" \
    --title "demo, 200 steps: --gpu-compute 16 against fp32" 2>&1 | tail -1
  echo "== curve done ($(($(date +%s) - t0)) s)"
}
row 150 gpt2-124m-cpu gpt2-124m bf16-cpu 8 30 zinf,zinf-timed,deepspeed,torch-bf16
row 260 llama-1b-cpu llama-1b bf16-cpu 4 10 zinf,zinf-timed,deepspeed,torch-bf16
curve 90
row 180 gpt2-124m-nvme gpt2-124m bf16-nvme 8 12 zinf,deepspeed
row 200 llama-1b-nvme llama-1b bf16-nvme 4 8 zinf,deepspeed
ls "$out"/*.json > /dev/null 2>&1 && python3 $c table "$out"/*.json
echo "== session done in $(($(date +%s) - t0)) s"
