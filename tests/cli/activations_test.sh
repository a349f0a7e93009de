#!/bin/sh
# zinf train --activations: every layer's activations kept for the
# backward, and the layer inputs offloaded to pinned host memory
# (--activations offload, or auto with the config's
# activation_checkpointing.cpu_checkpointing), give the recompute's losses
# to the last digit (--exact-losses), with layers whole and in pieces; the
# startup line says which was chosen; a bad value exits 2 naming the flag. With an mpirun: two ranks that asked for
# different ones agree on the recompute (the rank that recomputes fetches
# blocks the other would not; so does one that offloads its layer inputs)
# and give the one-choice run's losses.
# Usage: activations_test.sh ZINF [MPIEXEC]
set -eu
ZINF="$1"
MPIEXEC="${2:-}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-activations-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
. "$(dirname "$0")/tiny_nvme_config.sh"
write_tiny_nvme_config "$TMP"
FLAGS="--config $TMP/config.json --model tiny --steps 5 --device host --eval-every 0 --exact-losses"

losses() {  # losses OUT_PREFIX: the exact losses of OUT_PREFIX.err, 5 of them
  grep "exact loss" "$1.err" > "$1.losses"
  test "$(wc -l < "$1.losses")" -eq 5
}

run() {  # run OUT_PREFIX [zinf train flags...]
  out="$1"
  shift
  # shellcheck disable=SC2086
  "$ZINF" train $FLAGS "$@" > "$out.out" 2> "$out.err" || { cat "$out.err" >&2; exit 1; }
  losses "$out"
}

run "$TMP/recompute" --activations recompute
grep -q "activations recompute: each layer's recomputed" "$TMP/recompute.err"
run "$TMP/keep" --activations keep
grep -q "activations keep: every layer's kept for the backward" "$TMP/keep.err"
cmp "$TMP/recompute.losses" "$TMP/keep.losses" || { echo "kept activations changed the losses" >&2; exit 1; }
run "$TMP/keep-cut" --activations keep --fetch-unit 6000
cmp "$TMP/recompute.losses" "$TMP/keep-cut.losses" || { echo "kept activations in pieces changed the losses" >&2; exit 1; }
run "$TMP/auto"
grep -q "activations auto: every layer's kept" "$TMP/auto.err"  # tiny's are small beside the host's memory
run "$TMP/offload" --activations offload --fetch-unit 6000
grep -q "activations offload: .*the inputs in pinned host memory (.*pinned)" "$TMP/offload.err" || { cat "$TMP/offload.err" >&2; exit 1; }
cmp "$TMP/recompute.losses" "$TMP/offload.losses" || { echo "offloaded layer inputs changed the losses" >&2; exit 1; }
sed '1s/^{$/{ "activation_checkpointing": {"cpu_checkpointing": true, "partition_activations": true},/' \
  "$TMP/config.json" > "$TMP/cpu-checkpointing.json"
# shellcheck disable=SC2086
"$ZINF" train $FLAGS --config "$TMP/cpu-checkpointing.json" > "$TMP/cpu-ckpt.out" 2> "$TMP/cpu-ckpt.err" || { cat "$TMP/cpu-ckpt.err" >&2; exit 1; }
losses "$TMP/cpu-ckpt"
grep -q "activations auto: .*the inputs in pinned host memory" "$TMP/cpu-ckpt.err" || { cat "$TMP/cpu-ckpt.err" >&2; exit 1; }
cmp "$TMP/recompute.losses" "$TMP/cpu-ckpt.losses" || { echo "cpu_checkpointing changed the losses" >&2; exit 1; }

set +e
"$ZINF" train $FLAGS --activations sometimes > "$TMP/b.out" 2> "$TMP/b.err"
rc=$?
set -e
test "$rc" -eq 2 || { echo "bad --activations: exit $rc, expected 2" >&2; exit 1; }
grep -q -- "--activations: expected auto, keep, recompute or offload.*\"sometimes\"" "$TMP/b.err" || { cat "$TMP/b.err" >&2; exit 1; }

if [ -n "$MPIEXEC" ]; then
  rm -rf "$TMP/nvme"/*
  # shellcheck disable=SC2086
  "$MPIEXEC" --allow-run-as-root --oversubscribe -np 2 "$ZINF" train $FLAGS --activations keep \
    > "$TMP/mpi-keep.out" 2> "$TMP/mpi-keep.err" || { cat "$TMP/mpi-keep.err" >&2; exit 1; }
  losses "$TMP/mpi-keep"
  rm -rf "$TMP/nvme"/*
  # shellcheck disable=SC2086
  timeout 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 1 "$ZINF" train $FLAGS --activations keep : \
    -np 1 "$ZINF" train $FLAGS --activations recompute \
    > "$TMP/mpi-mixed.out" 2> "$TMP/mpi-mixed.err" || { cat "$TMP/mpi-mixed.err" >&2; exit 1; }
  losses "$TMP/mpi-mixed"
  grep -q "activations keep: each layer's recomputed" "$TMP/mpi-mixed.err"  # rank 0 asked to keep
  cmp "$TMP/mpi-keep.losses" "$TMP/mpi-mixed.losses" || { echo "mixed choices changed the 2-rank losses" >&2; exit 1; }
  rm -rf "$TMP/nvme"/*
  # shellcheck disable=SC2086
  timeout 120 "$MPIEXEC" --allow-run-as-root --oversubscribe -np 1 "$ZINF" train $FLAGS --activations keep : \
    -np 1 "$ZINF" train $FLAGS --activations offload \
    > "$TMP/mpi-offload.out" 2> "$TMP/mpi-offload.err" || { cat "$TMP/mpi-offload.err" >&2; exit 1; }
  losses "$TMP/mpi-offload"
  grep -q "activations keep: each layer's recomputed" "$TMP/mpi-offload.err"  # an offloading rank recomputes
  cmp "$TMP/mpi-keep.losses" "$TMP/mpi-offload.losses" || { echo "keep beside offload changed the 2-rank losses" >&2; exit 1; }
  echo "activations test: 2 ranks agree"
fi
echo "activations test: OK"
