#!/bin/sh
# zinf train --fetch-unit: layers fetched in pieces give the whole-layer
# run's losses to the last digit (--exact-losses), on one rank and, when
# an mpirun is given, on two; the startup line names the cut; a checkpoint
# resumes only under the same cut (the refusal names --fetch-unit), and
# --fetch-unit auto (or none) adopts the checkpoint's cut; a bad value exits
# 2 naming the flag.
# Usage: fetch_unit_test.sh ZINF [MPIEXEC]
set -eu
ZINF="$1"
MPIEXEC="${2:-}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-fetch-unit-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tiny_nvme_config.sh"
write_tiny_nvme_config "$TMP"

run() {  # run OUT_PREFIX [zinf train flags...]
  out="$1"
  shift
  "$@" --config "$TMP/config.json" --model tiny --steps 5 --device host --eval-every 0 --exact-losses \
    > "$out.out" 2> "$out.err" || { cat "$out.err" >&2; exit 1; }
  grep "exact loss" "$out.err" > "$out.losses"
  test "$(wc -l < "$out.losses")" -eq 5
}

run "$TMP/whole" "$ZINF" train --fetch-unit layer
grep -q "fetch unit layer: whole layers" "$TMP/whole.err"
run "$TMP/cut" "$ZINF" train --fetch-unit 6000 --save-dir "$TMP/ckpt"
grep -q "fetch unit 6000: 3 pieces per layer: norm1-norm2 | mlp_in | mlp_out" "$TMP/cut.err"
cmp "$TMP/whole.losses" "$TMP/cut.losses" || { echo "pieces changed the losses" >&2; exit 1; }
run "$TMP/fine" "$ZINF" train --fetch-unit 1
cmp "$TMP/whole.losses" "$TMP/fine.losses" || { echo "one group a piece changed the losses" >&2; exit 1; }

# Another cut cannot resume the checkpoint.
if "$ZINF" train --config "$TMP/config.json" --model tiny --steps 6 --device host --fetch-unit layer \
     --resume "$TMP/ckpt" > "$TMP/r.out" 2> "$TMP/r.err"; then
  echo "resume under another cut succeeded" >&2
  exit 1
fi
grep -q "trainer.fetch_layout was 3 pieces per layer.*--fetch-unit" "$TMP/r.err" || { cat "$TMP/r.err" >&2; exit 1; }
# auto (here: no flag, which would cut whole layers) takes the checkpoint's.
"$ZINF" train --config "$TMP/config.json" --model tiny --steps 6 --device host --eval-every 0 \
  --resume "$TMP/ckpt" > "$TMP/a.out" 2> "$TMP/a.err" || { cat "$TMP/a.err" >&2; exit 1; }
grep -q "fetch unit auto (the resumed checkpoint's, 6000): 3 pieces per layer" "$TMP/a.err" ||
  { cat "$TMP/a.err" >&2; exit 1; }
grep -q "resumed at step 5" "$TMP/a.err" || { cat "$TMP/a.err" >&2; exit 1; }

set +e
"$ZINF" train --config "$TMP/config.json" --model tiny --steps 1 --device host --fetch-unit half \
  > "$TMP/b.out" 2> "$TMP/b.err"
rc=$?
set -e
test "$rc" -eq 2 || { echo "bad --fetch-unit: exit $rc, expected 2" >&2; exit 1; }
grep -q -- "--fetch-unit: expected auto, layer or a positive element count.*\"half\"" "$TMP/b.err" ||
  { cat "$TMP/b.err" >&2; exit 1; }

if [ -n "$MPIEXEC" ]; then
  rm -rf "$TMP/nvme"/*
  run "$TMP/mpi-whole" "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$ZINF" train --fetch-unit layer
  rm -rf "$TMP/nvme"/*
  run "$TMP/mpi-cut" "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$ZINF" train --fetch-unit 6000
  cmp "$TMP/mpi-whole.losses" "$TMP/mpi-cut.losses" || { echo "pieces changed the 2-rank losses" >&2; exit 1; }
  echo "fetch unit test: 2 ranks identical"
fi
echo "fetch unit test: OK"
