#!/bin/sh
# zinf eval and zinf train's --data-order / --holdout as a user runs them:
# a token file from zinf data corpus; training in file order with nothing
# held out (so no evaluation lines), resumed in the same order; then the
# checkpoint and the F32 export of its weights evaluate to the same loss,
# printed with 9 significant digits; bad flag values are named.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-eval-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

"$ZINF" data corpus --output "$TMP/c.bin" --bytes 64K > /dev/null
"$ZINF" train --config "$CONFIG" --model tiny --device host --data "$TMP/c.bin" --steps 4 --data-order sequential \
  --holdout 0 --save-dir "$TMP/ckpt" --save-every 2 > "$TMP/out1" 2> "$TMP/err1"
grep -q "zinf train: 4 steps" "$TMP/out1"
if grep -q "eval loss\|eval [0-9]" "$TMP/out1" "$TMP/err1"; then echo "--holdout 0 still evaluated" >&2; exit 1; fi
"$ZINF" train --config "$CONFIG" --model tiny --device host --data "$TMP/c.bin" --steps 6 --data-order sequential \
  --holdout 0 --save-dir "$TMP/ckpt" --resume "$TMP/ckpt" --export "$TMP/w.safetensors" --export-dtype F32 \
  > "$TMP/out2" 2> "$TMP/err2"
grep -q "resumed at step 4" "$TMP/err2"
# The order is part of the checkpoint.
if "$ZINF" train --config "$CONFIG" --model tiny --device host --data "$TMP/c.bin" --steps 8 --holdout 0 \
     --resume "$TMP/ckpt" > /dev/null 2> "$TMP/err3"; then
  echo "a shuffled run resumed a sequential checkpoint" >&2
  exit 1
fi
grep -q "trainer.data_order was sequential" "$TMP/err3"

a=$("$ZINF" eval --config "$CONFIG" --model tiny --device host --data "$TMP/c.bin" --resume "$TMP/ckpt" 2> "$TMP/err4")
b=$("$ZINF" eval --config "$CONFIG" --model tiny --device host --data "$TMP/c.bin" --init-from "$TMP/w.safetensors" \
  2> /dev/null)
echo "$a" | grep -Eq '^loss [0-9]\.[0-9]{8}$'
echo "$a" | grep -Eq '^perplexity [0-9.]+$'
grep -q "windows of 4 x 32 tokens" "$TMP/err4"
test "$a" = "$b"

for bad in "--data-order random" "--holdout 0.7"; do
  # shellcheck disable=SC2086
  if "$ZINF" train --config "$CONFIG" --model tiny --device host --steps 1 $bad > /dev/null 2> "$TMP/err5"; then
    echo "train accepted $bad" >&2
    exit 1
  fi
  grep -q -- "${bad%% *}" "$TMP/err5"
done
echo "eval test: OK ($a)"
