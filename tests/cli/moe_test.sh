#!/bin/sh
# zinf train on a mixture-of-experts checkpoint (tests/model/hf/qwen3_moe:
# Qwen3-MoE's layers, 4 experts, 2 a token; qwen2_moe: a shared expert
# beside them; qwen3_moe-dense: two of four layers dense; glm4_moe: GLM-4.5's
# sigmoid router with its frozen selection bias; ernie4_5_moe: ERNIE 4.5's
# softmax router with one, layers 0 and 3 dense; deepseek_v3: GLM-4.5's
# router beside latent attention; deepseek_v2: a softmax router in
# groups beside it): the losses to the last digit
# (--exact-losses) are the same with parameters and optimizer in RAM and on
# NVMe, activations recomputed or kept, layers whole or one group a piece
# (the router and every expert's gate and up in one). With an mpirun, two
# ranks on NVMe give two ranks' in-RAM losses.
# Usage: moe_test.sh ZINF MODEL_DIR [MPIEXEC]
set -eu
ZINF="$1"
MODEL="$2"
MPIEXEC="${3:-}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-moe-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tiny_nvme_config.sh"
write_tiny_nvme_config "$TMP"
# The same config with every tier in RAM.
sed -e 's/"device": "nvme"/"device": "none"/g' "$TMP/config.json" > "$TMP/ram.json"
# 20000 tokens of the fixture's 100 (zinf's token file, version 2: uint32).
python3 -c '
import struct, sys
n = 20000
header = struct.pack("<3i", 20240520, 2, n) + bytes(4 * 253)
sys.stdout.buffer.write(header + struct.pack("<%dI" % n, *[(i * 37 + i // 7) % 100 for i in range(n)]))
' > "$TMP/tokens.bin"
FLAGS="--model $MODEL --data $TMP/tokens.bin --seq-len 16 --steps 4 --device host --eval-every 0 --exact-losses"

run() {  # run OUT_PREFIX CONFIG [zinf train flags...]: the exact losses in OUT_PREFIX.losses
  out="$1"
  config="$2"
  shift 2
  rm -rf "$TMP/nvme"/*
  # shellcheck disable=SC2086
  "$ZINF" train --config "$config" $FLAGS "$@" > "$out.out" 2> "$out.err" || { cat "$out.err" >&2; exit 1; }
  grep "exact loss" "$out.err" > "$out.losses"
  test "$(wc -l < "$out.losses")" -eq 4
}

run "$TMP/ram" "$TMP/ram.json" --activations recompute
# With dense layers, the routed ones are counted.
case "$MODEL" in
  *-dense) grep -q "2 of 4 experts a token in 2 layers" "$TMP/ram.err" ;;
  *glm4_moe | *ernie4_5_moe) grep -q "3 of 8 experts a token and a shared one in 2 layers" "$TMP/ram.err" ;;
  *deepseek_v3 | *deepseek_v2)
    grep -q "heads (latent attention: kv rank 12, q rank 10)" "$TMP/ram.err"
    grep -q "3 of 8 experts a token and a shared one in 2 layers" "$TMP/ram.err"
    ;;
  *) grep -q "2 of 4 experts a token" "$TMP/ram.err" ;;
esac
for variant in "nvme --activations recompute" "nvme --activations keep" "nvme --fetch-unit 1" "ram --activations keep --fetch-unit 1"; do
  set -- $variant
  config="$TMP/config.json"
  [ "$1" = ram ] && config="$TMP/ram.json"
  shift
  run "$TMP/v" "$config" "$@"
  cmp "$TMP/ram.losses" "$TMP/v.losses" || { echo "moe test: $variant changed the losses" >&2; exit 1; }
done

if [ -n "$MPIEXEC" ]; then
  for tier in ram nvme; do
    config="$TMP/config.json"
    [ "$tier" = ram ] && config="$TMP/ram.json"
    rm -rf "$TMP/nvme"/*
    # shellcheck disable=SC2086
    timeout 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$ZINF" train --config "$config" $FLAGS \
      > "$TMP/mpi-$tier.out" 2> "$TMP/mpi-$tier.err" || { cat "$TMP/mpi-$tier.err" >&2; exit 1; }
    grep "exact loss" "$TMP/mpi-$tier.err" > "$TMP/mpi-$tier.losses"
    test "$(wc -l < "$TMP/mpi-$tier.losses")" -eq 4
  done
  cmp "$TMP/mpi-ram.losses" "$TMP/mpi-nvme.losses" || { echo "moe test: NVMe changed the 2-rank losses" >&2; exit 1; }
  echo "moe test: 2 ranks agree"
fi
echo "moe test: OK"
