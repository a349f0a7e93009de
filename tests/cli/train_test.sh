#!/bin/sh
# zinf train as a user runs it: a shipped config with NVMe offload pointed
# at a temporary directory, checkpoints every 3 steps, an export; then a
# resumed run continues from the latest checkpoint to step 9, and a resume
# with another model or weight-decay mode is refused naming what differs; a
# bad --weight-decay-on value is refused naming it.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-train-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/nvme"

"$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 6 \
  --save-dir "$TMP/ckpt" --save-every 3 --export "$TMP/model.safetensors" > "$TMP/out1" 2> "$TMP/err1"
grep -q "zinf train: 6 steps" "$TMP/out1"
grep -q "checkpoint $TMP/ckpt/rank-0/step-00000003" "$TMP/err1"
grep -q "checkpoint $TMP/ckpt/rank-0/step-00000006" "$TMP/err1"
grep -q "wait nvme" "$TMP/err1"
test -s "$TMP/model.safetensors"
grep -q "step-00000006" "$TMP/ckpt/rank-0/latest"

"$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 9 \
  --resume "$TMP/ckpt" > "$TMP/out2" 2> "$TMP/err2"
grep -q "resumed at step 6" "$TMP/err2"
grep -q "zinf train: 9 steps" "$TMP/out2"

# Another model cannot resume this checkpoint.
if "$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model demo --steps 9 \
     --resume "$TMP/ckpt" > "$TMP/out3" 2> "$TMP/err3"; then
  echo "resume with another model succeeded" >&2
  exit 1
fi
grep -q "trainer.model was" "$TMP/err3" || { cat "$TMP/err3" >&2; exit 1; }

# Nor another weight-decay mode (the checkpoint's is the default, matrices).
if "$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 9 --weight-decay-on all \
     --resume "$TMP/ckpt" > "$TMP/out4" 2> "$TMP/err4"; then
  echo "resume with another weight-decay mode succeeded" >&2
  exit 1
fi
grep -q "trainer.weight_decay_on was matrices, this run has all" "$TMP/err4" || { cat "$TMP/err4" >&2; exit 1; }

set +e
"$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 1 --weight-decay-on biases \
  > "$TMP/out5" 2> "$TMP/err5"
rc=$?
set -e
test "$rc" -eq 2 || { echo "bad --weight-decay-on: exit $rc, expected 2" >&2; exit 1; }
grep -q "weight-decay-on.*'biases'" "$TMP/err5" || { cat "$TMP/err5" >&2; exit 1; }
echo "train test: OK"
