#!/bin/sh
# zinf plan for GPT-3 175B on one GPU, 128 GiB of RAM and 8 TiB of NVMe
# (--json): the option with offload_param and offload_optimizer both on NVMe
# fits in RAM (fits.ram), its RAM being the engine's bounded windows, and on
# the GPU (fits.gpu), its layers in pieces (--fetch-unit auto): on 24 GiB
# with every layer input on the GPU (--activations auto chose recompute; the
# 16-bit mode's fused attention keeps no T x T probabilities), on 16 GiB
# with those inputs in pinned RAM (auto chose offload).
# Needs python3 to read the JSON (skipped, 77, without it).
set -eu
ZINF="$1"
command -v python3 > /dev/null || { echo "plan 175b test: SKIP: no python3"; exit 77; }
check() {  # GPU memory, the activations auto must choose
  "$ZINF" plan --model 175B --gpu-mem "$1" --cpu-mem 128G --nvme /nvme0 --nvme-bytes 8T --json | python3 -c '
import json, sys
plan = json.load(sys.stdin)
o = [o for o in plan["options"] if o["offload_param"] == "nvme" and o["offload_optimizer"] == "nvme"][0]
ram = o["pinned_ram_bytes"] + o["pageable_ram_bytes"]
print("nvme/nvme on %s: RAM %.2f GiB, fits %s" % (sys.argv[1], ram / 2**30, o["fits"]))
assert o["fits"]["ram"] and o["fits"]["nvme"] and o["fits"]["gpu"], o["fits"]
assert ram <= 128 * 2**30, ram
assert plan["activations"]["layer_activations"] == sys.argv[2], plan["activations"]
' "$1" "$2"
}
check 24G recompute
check 16G offload
echo "plan 175b test: OK"
