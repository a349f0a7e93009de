#!/bin/sh
# ctest's fuzz/config_parser: runs config_fuzz for a bounded time over the
# seed corpus (the shipped configs, the CLI test configs, tests/fuzz/corpus).
# Every seed runs first, so the corpus is also a regression test; then
# libFuzzer mutates. Inputs it finds worth keeping go to WORK/corpus (kept
# between runs in the build tree); a failing input goes to WORK/artifacts.
#
# Usage: run_fuzz.sh FUZZER SOURCE_DIR WORK_DIR
# ZINF_FUZZ_SECONDS (default 60) and ZINF_FUZZ_RUNS (default 1000000) bound
# the run; whichever comes first ends it.
set -eu
fuzzer=$1 src=$2 work=$3
seconds=${ZINF_FUZZ_SECONDS:-60}
runs=${ZINF_FUZZ_RUNS:-1000000}
rm -rf "$work/seeds"
mkdir -p "$work/seeds" "$work/corpus" "$work/artifacts"
cp "$src"/configs/*.json "$src"/tests/cli/*.json "$src"/tests/fuzz/corpus/* "$work/seeds/"
# -error_exitcode: libFuzzer's default (77) is what ctest reads as "skipped"
# elsewhere; a finding here must read as a failure.
if "$fuzzer" -max_total_time="$seconds" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
     -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 \
     -dict="$src/tests/fuzz/config.dict" -artifact_prefix="$work/artifacts/" \
     "$work/corpus" "$work/seeds"; then
  echo "config fuzz: OK"
else
  status=$?
  echo "config fuzz: FAILED (exit $status); reproduce with: $fuzzer $work/artifacts/<crash file>" >&2
  exit "$status"
fi
