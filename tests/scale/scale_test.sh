#!/bin/sh
# scale_test.sh ZINF MEMCG_RUN RATIO [STEPS]
#
# Trains a model whose training state (18 B per parameter: fp32 master, m, v,
# gradient, 16-bit parameter and its gradient) is RATIO times a memory cgroup's
# limit, parameters and optimizer state on NVMe (a directory here), under a
# host device budget that the limit includes, and checks that its step losses
# (to 17 digits, --exact-losses) are those of the same run uncapped with all
# state in RAM (both offload devices cpu, no budget), bit for bit. Prints the
# cgroup's peak and the ratios. Exits 77 (skipped) where MEMCG_RUN finds no
# writable memory controller.
#
# The shape: 14 layers of width 768 (99.5M parameters, 1.79 GB of state) so
# that the windows the engine needs for one layer (a gathered block, its
# fp32 gradient, the trainer's scratch, the new-parameter ring) and the
# process's fixed overhead (about 250 MB in all, whatever the model) stay
# well below the limit; a few steps keep the test near a minute on 2 cores. The optimizer's buffers are
# DeepSpeed's ZeRO-Infinity ones (buffer_count 4 with both pipelines: fitted).
set -eu
ZINF="$1"
MEMCG_RUN="$2"
RATIO="$3"
STEPS="${4:-4}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-scale.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/nvme"

cat > "$TMP/model.json" <<'JSON'
{"vocab_size": 257, "seq_len": 64, "n_layer": 14, "n_head": 12, "n_embd": 768}
JSON
. "$(dirname "$0")/nvme_config.sh"
. "$(dirname "$0")/capped.sh"
scale_nvme_config "$TMP/nvme" > "$TMP/nvme.json"
sed 's/"device": "nvme"/"device": "cpu"/g' "$TMP/nvme.json" > "$TMP/cpu.json"
BUDGET=128M
# train [PREFIX...] -- ZINF-TRAIN-ARGS...: zinf train with the shared flags, run under PREFIX.
train() {
  prefix=""
  while [ "$1" != "--" ]; do prefix="$prefix $1"; shift; done
  shift
  $prefix "$ZINF" train --model "$TMP/model.json" --steps "$STEPS" --device host --eval-every 0 --eval-batches 1 \
    --exact-losses "$@"
}

# The reference: all state in RAM, no cap.
train -- --config "$TMP/cpu.json" > "$TMP/ref.out" 2> "$TMP/ref.err" || { cat "$TMP/ref.err" >&2; exit 1; }
grep "exact loss" "$TMP/ref.err" > "$TMP/ref.losses"
[ "$(wc -l < "$TMP/ref.losses")" -eq "$STEPS" ] || { cat "$TMP/ref.err" >&2; exit 1; }

# Parameters from the run's own count ("99.53M parameters"), rounded down.
params=$(sed -n 's/^zinf train: model .*: \([0-9.]*\)M parameters.*/\1/p' "$TMP/ref.err" | awk '{ printf "%d", ($1 - 0.005) * 1e6 }')
[ -n "$params" ] || { cat "$TMP/ref.err" >&2; exit 1; }
state=$((params * 18))
limit=$(awk -v s="$state" -v r="$RATIO" 'BEGIN { printf "%d", s / r }')
echo "scale test: $params parameters, $state B of training state, cgroup limit $limit B (state / limit = $RATIO)"

LIMIT=$limit
capped "scale test: the capped run" "$TMP/cap" train --config "$TMP/nvme.json" --device-budget "$BUDGET"
grep "exact loss" "$TMP/cap.err" > "$TMP/cap.losses"
peak=$(sed -n 's/^memcg: peak \([0-9]*\) bytes.*/\1/p' "$TMP/cap.err")
awk -v s="$state" -v p="$peak" 'BEGIN { printf "scale test: peak %d B, state / peak = %.2f\n", p, s / p }'
same "scale test: losses (uncapped RAM run, then capped NVMe run)" "$TMP/ref.losses" "$TMP/cap.losses"
cat "$TMP/cap.losses"
echo "scale test: OK"
