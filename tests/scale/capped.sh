# Sourced by the scale tests (scale_test.sh, hf_load_test.sh,
# token_file_test.sh), which set MEMCG_RUN (memcg_run.sh) and LIMIT (bytes).
#
# capped WHAT OUT FN ARGS...: runs `FN "$MEMCG_RUN" "$LIMIT" -- ARGS...` (FN
# is the script's own runner: it puts what comes before -- in front of the
# command), stdout in OUT.out and stderr in OUT.err, and prints the
# cgroup's peak. Exits 77 (the test skipped) where memcg_run.sh finds no
# writable memory controller, and 1 with the run's errors and WHAT when the
# run fails (137: killed at the cgroup limit).
capped() {
  what="$1"
  out="$2"
  fn="$3"
  shift 3
  set +e
  "$fn" "$MEMCG_RUN" "$LIMIT" -- "$@" > "$out.out" 2> "$out.err"
  rc=$?
  set -e
  if [ "$rc" -eq 77 ]; then
    grep "memcg: SKIP" "$out.err" >&2
    exit 77
  fi
  grep "^memcg: peak" "$out.err" || true
  if [ "$rc" -ne 0 ]; then
    cat "$out.err" >&2
    echo "$what failed (exit $rc; 137: killed at the cgroup limit)" >&2
    exit 1
  fi
}

# same WHAT A B: exits 1, showing both, unless files A and B are equal.
same() {
  if ! cmp -s "$2" "$3"; then
    echo "$1 differ:" >&2
    cat "$2" "$3" >&2
    exit 1
  fi
}
