#!/bin/sh
# eval_mpi_test.sh ZINF MPIEXEC CONFIG
#
# zinf eval under mpirun: a checkpoint two ranks saved is evaluated by two
# ranks (each scores half of the windows; rank 0 alone prints), and gives the
# loss one rank gives on the same weights (the run's one-file export), to
# the 9 digits printed. The token file holds an even number of windows, so
# two ranks score every window one rank scores. One rank cannot load the
# two-rank checkpoint: the error says why.
set -eu
ZINF="$1"
MPIEXEC="$2"
CONFIG="$3"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-eval-mpi.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
MPI="$MPIEXEC --allow-run-as-root --oversubscribe -np 2"
FLAGS="--config $CONFIG --model tiny --device host"

# shellcheck disable=SC2086
$MPI "$ZINF" train $FLAGS --steps 3 --save-dir "$TMP/ckpt" --export "$TMP/w.safetensors" --export-dtype F32 \
  > "$TMP/train.out" 2> "$TMP/train.err" || { cat "$TMP/train.err" >&2; exit 1; }
# 1280 bytes and the end-of-text token: 10 windows of 4 x 32 tokens (and one more token).
yes "the quick brown fox jumps over the lazy dog" | head -c 1280 > "$TMP/t.txt"
"$ZINF" data encode --input "$TMP/t.txt" --output "$TMP/t.bin" > /dev/null

# shellcheck disable=SC2086
two=$($MPI "$ZINF" eval $FLAGS --data "$TMP/t.bin" --resume "$TMP/ckpt" 2> "$TMP/two.err") ||
  { cat "$TMP/two.err" >&2; exit 1; }
# shellcheck disable=SC2086
one=$("$ZINF" eval $FLAGS --data "$TMP/t.bin" --init-from "$TMP/w.safetensors" 2> "$TMP/one.err") ||
  { cat "$TMP/one.err" >&2; exit 1; }
grep -q "10 windows of 4 x 32 tokens" "$TMP/two.err"
[ "$(grep -c "windows of" "$TMP/two.err")" -eq 1 ] || { echo "more than rank 0 printed" >&2; exit 1; }
echo "$two" | grep -Eq '^loss [0-9]\.[0-9]{8}$'
if [ "$one" != "$two" ]; then
  echo "two ranks and one differ:" >&2
  echo "$two" "$one" >&2
  exit 1
fi
# shellcheck disable=SC2086
if "$ZINF" eval $FLAGS --data "$TMP/t.bin" --resume "$TMP/ckpt" > /dev/null 2> "$TMP/err"; then
  echo "one rank loaded a two-rank checkpoint" >&2
  exit 1
fi
grep -q "as many ranks as saved it" "$TMP/err" || { cat "$TMP/err" >&2; exit 1; }
echo "eval mpi test: 2 ranks = 1 rank ($(echo "$two" | head -1))"
echo "eval mpi test: OK"
