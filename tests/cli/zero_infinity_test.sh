#!/bin/sh
# DeepSpeed's ZeRO-Infinity buffer settings as its examples set them:
# offload_optimizer buffer_count 4 with pipeline_read and pipeline_write (the
# pipeline keeps 12 sub-group buffers: master, m, v and gradient x 3) and offload_param buffers smaller than
# the model's largest shard. config-check accepts the config and says what it
# fitted; zinf train runs it and ends with weights bit-identical to the same
# config with buffers that need no fitting. No held-out split (--holdout 0):
# the two evaluations were most of the test's 14 minutes under ASan on a
# 2-core Zen 4 VM, and the check is the training's.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-zero-infinity.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/nvme"

"$ZINF" config-check "$CONFIG" --model small --device host > /dev/null 2> "$TMP/check"
grep -q "fitted: offload_optimizer.buffer_count 4 .* sub-groups split from 1.00M to 332.80K elements" "$TMP/check" ||
  { cat "$TMP/check" >&2; exit 1; }
grep -q "fitted: offload_param: the largest parameter shard" "$TMP/check" || { cat "$TMP/check" >&2; exit 1; }

# The same config with enough buffers: nothing to fit.
sed -e 's/"buffer_count": 4,/"buffer_count": 12,/' -e 's/"buffer_size": 1e6,/"buffer_size": 2e6,/' "$CONFIG" > "$TMP/unfitted.json"
"$ZINF" config-check "$TMP/unfitted.json" --model small --device host > /dev/null 2> "$TMP/check2"
if grep -q "fitted:" "$TMP/check2"; then cat "$TMP/check2" >&2; exit 1; fi

for run in fitted unfitted; do
  config="$CONFIG"
  [ "$run" = unfitted ] && config="$TMP/unfitted.json"
  rm -rf "$TMP/nvme" && mkdir -p "$TMP/nvme"
  "$ZINF" train --config "$config" --nvme-path "$TMP/nvme" --model small --steps 3 --device host \
    --holdout 0 --export "$TMP/$run.safetensors" --export-dtype F32 > "$TMP/$run.out" 2> "$TMP/$run.err" ||
    { cat "$TMP/$run.err" >&2; exit 1; }
  grep -q "zinf train: 3 steps" "$TMP/$run.out"
done
grep -q "fitted: offload_optimizer.buffer_count 4" "$TMP/fitted.err" || { cat "$TMP/fitted.err" >&2; exit 1; }
cmp "$TMP/fitted.safetensors" "$TMP/unfitted.safetensors"
grep "^step .*/3 " "$TMP/fitted.err" | sed 's/  *[0-9,.KM]* tok\/s.*//' > "$TMP/fitted.losses"
grep "^step .*/3 " "$TMP/unfitted.err" | sed 's/  *[0-9,.KM]* tok\/s.*//' > "$TMP/unfitted.losses"
test -s "$TMP/fitted.losses"
cmp "$TMP/fitted.losses" "$TMP/unfitted.losses"
echo "zero infinity test: OK"
