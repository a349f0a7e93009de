#!/bin/sh
# token_file_test.sh ZINF MEMCG_RUN CONFIG
#
# A corpus larger than a memory cgroup's share for it trains under the cap:
# the built-in corpus at 40 MiB of text (41.8M tokens, an 84 MB uint16 token
# file) and the tiny model, capped at 200 MB. The file is read in place
# (mapped), so its pages are page cache the cgroup reclaims. Read into memory
# as uint32 tokens (after its own bytes), the same run peaked at 351 MB and
# was killed at this cap (2026-11-29). The step losses (17 digits) are those
# of the same run uncapped. Exits 77 (skipped) where MEMCG_RUN finds no
# writable memory controller. A few seconds.
set -eu
ZINF="$1"
MEMCG_RUN="$2"
CONFIG="$3"
LIMIT=200000000
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-tokens.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

"$ZINF" data corpus --output "$TMP/corpus.bin" --bytes 40M > /dev/null
bytes=$(wc -c < "$TMP/corpus.bin")
. "$(dirname "$0")/capped.sh"
train() {
  prefix=""
  while [ "$1" != "--" ]; do prefix="$prefix $1"; shift; done
  shift
  $prefix "$ZINF" train --config "$CONFIG" --model tiny --device host --data "$TMP/corpus.bin" --steps 2 \
    --eval-every 0 --exact-losses "$@"
}
train -- > "$TMP/ref.out" 2> "$TMP/ref.err" || { cat "$TMP/ref.err" >&2; exit 1; }
grep "exact loss" "$TMP/ref.err" > "$TMP/ref.losses"
[ "$(wc -l < "$TMP/ref.losses")" -eq 2 ] || { cat "$TMP/ref.err" >&2; exit 1; }
dd if="$TMP/corpus.bin" iflag=nocache count=0 2> /dev/null || true
capped "token file test: the capped run" "$TMP/cap" train
grep "exact loss" "$TMP/cap.err" > "$TMP/cap.losses"
same "token file test: losses (uncapped, then capped)" "$TMP/ref.losses" "$TMP/cap.losses"
echo "token file test: a $bytes B token file trained under a $LIMIT B cap"
echo "token file test: OK"
