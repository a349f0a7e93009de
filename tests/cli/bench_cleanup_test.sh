#!/bin/sh
# The benchmarks leave no scratch behind when they fail half-way: a fake fio
# that answers --version but fails every job makes bench step, bench swap and
# bench aio fail after their swap files, scratch directory or test file
# exist; each must exit 1 with fio's failure and leave its directory as it
# found it. A usage error (exit 2) leaves nothing either.
set -eu
ZINF="$1"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-bench-cleanup-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir "$TMP/bin" "$TMP/step" "$TMP/swap" "$TMP/aio"
cat > "$TMP/bin/fio" <<'FIO'
#!/bin/sh
if [ "${1:-}" = "--version" ]; then echo fio-3.33; exit 0; fi
echo "fake fio: refusing the job" >&2
exit 1
FIO
chmod +x "$TMP/bin/fio"
export PATH="$TMP/bin:$PATH"

# expect_failure NAME CODE DIR COMMAND...: COMMAND exits CODE and DIR is empty after.
expect_failure() {
  name=$1 code=$2 dir=$3
  shift 3
  rc=0
  "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" || rc=$?
  if [ "$rc" != "$code" ]; then
    echo "$name: exit $rc, expected $code" >&2
    cat "$TMP/$name.err" >&2
    exit 1
  fi
  if [ -n "$(ls -A "$dir")" ]; then
    echo "$name: left behind in $dir:" >&2
    ls -la "$dir" >&2
    exit 1
  fi
}

expect_failure step 1 "$TMP/step" "$ZINF" bench step --model tiny --steps 1 --reps 1 --nvme-path "$TMP/step"
grep -q "fio" "$TMP/step.err" || { echo "bench step: the error does not name fio" >&2; exit 1; }
expect_failure step_usage 2 "$TMP/step" "$ZINF" bench step --model tiny --nvme-path "$TMP/step" --device-budget -5
expect_failure swap 1 "$TMP/swap" "$ZINF" bench swap --params 100000 --steps 1 --nvme "$TMP/swap"
grep -q "fio" "$TMP/swap.err" || { echo "bench swap: the error does not name fio" >&2; exit 1; }
expect_failure aio 1 "$TMP/aio" \
  "$ZINF" bench aio --file "$TMP/aio/bench.dat" --size 4M --block-size 1M --queue-depth 4 --reps 1
grep -q "fio" "$TMP/aio.err" || { echo "bench aio: the error does not name fio" >&2; exit 1; }
echo "bench cleanup test: OK"
