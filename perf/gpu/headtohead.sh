#!/bin/bash
# The README's GPU table: zinf against DeepSpeed ZeRO-Infinity (and a resident
# PyTorch run, the compute ceiling) on one GPU, the same weights, batches and
# DeepSpeed JSON (perf/gpu/*.json), cpu/cpu and nvme/nvme, a GPT-2 124M and a
# 1.1B Llama. Here, with network: make device-debs; there (carry .deps), from
# the repository root:
#   make gpu-test && bash perf/gpu/headtohead.sh OUTDIR
# One JSON per row in OUTDIR (perf/gpu_compare.py's), the table on stdout.
# The cpu/cpu rows also run zinf-timed (wall_clock_breakdown): GPU busy by
# CUDA events and each kernel's share, without slowing the row's zinf run.
# MODELS (default /tmp/zinf-models) keeps the random-init folders; NVME
# (default /tmp/zinf-nvme) is the swap directory of the nvme/nvme rows.
set -euo pipefail
out=${1:?usage: headtohead.sh OUTDIR}
mkdir -p "$out"
. perf/gpu/setup.sh
z=perf/gpu/zinf-gpu
c=perf/gpu_compare.py
m=${MODELS:-/tmp/zinf-models}
nvme=${NVME:-/tmp/zinf-nvme}
for shape in gpt2-124m llama-1b; do
  [ -f "$m/$shape/model.safetensors" ] || python3 $c make-model --shape $shape --dir "$m/$shape"
done
row() {  # name model config micro-batch steps trainers
  python3 $c compare --zinf $z --model "$m/$2" --config "perf/gpu/$3.json" --micro-batch "$4" --steps "$5" \
    --trainers "$6" --nvme-path "$nvme" --work "$out/$1" --json "$out/$1.json" 2>&1 | grep gpu_compare || true
}
row gpt2-124m-cpu gpt2-124m bf16-cpu 8 50 zinf,zinf-timed,deepspeed,torch-bf16
row gpt2-124m-nvme gpt2-124m bf16-nvme 8 12 zinf,deepspeed
row llama-1b-cpu llama-1b bf16-cpu 4 10 zinf,zinf-timed,deepspeed,torch-bf16
row llama-1b-nvme llama-1b bf16-nvme 4 8 zinf,deepspeed
python3 $c table "$out"/*.json
