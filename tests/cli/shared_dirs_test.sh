#!/bin/sh
# Two runs sharing a --save-dir or --nvme-path: the second is refused naming
# the first's pid, before it touches the first's checkpoints or swap files.
# flock(1) stands in for the first run: it holds the lock file, whose text
# is the holder's pid (4242 here), as zinf's own FileLock does.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-shared-dirs.XXXXXX")
HOLDER=
trap '[ -n "$HOLDER" ] && kill "$HOLDER" 2>/dev/null; rm -rf "$TMP"' EXIT

# Holds lock file $1 (written with pid 4242) in the background until killed.
hold() {
  echo 4242 > "$1"
  # The shell takes the lock on descriptor 9 and becomes `sleep`, which keeps
  # it: killing $HOLDER frees the lock.
  sh -c 'exec 9>>"$1" && flock 9 && exec sleep 300' sh "$1" &
  HOLDER=$!
  while flock -n "$1" true; do sleep 0.1; done
}

mkdir -p "$TMP/ckpt/rank-0" "$TMP/nvme"
hold "$TMP/ckpt/rank-0/.lock"
if "$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 2 --save-dir "$TMP/ckpt" \
     > "$TMP/out1" 2> "$TMP/err1"; then
  echo "a second run on a save dir in use was not refused" >&2
  exit 1
fi
grep -q -- "--save-dir: checkpoint directory $TMP/ckpt/rank-0 is in use.*locked by process 4242" "$TMP/err1" ||
  { cat "$TMP/err1" >&2; exit 1; }
kill "$HOLDER"
wait "$HOLDER" 2>/dev/null || true

hold "$TMP/nvme/zinf-r0.lock"
if "$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 2 --save-dir "$TMP/ckpt" \
     > "$TMP/out2" 2> "$TMP/err2"; then
  echo "a second run on an nvme path in use was not refused" >&2
  exit 1
fi
grep -q -- "--nvme-path: swap directory $TMP/nvme is in use.*locked by process 4242" "$TMP/err2" ||
  { cat "$TMP/err2" >&2; exit 1; }
kill "$HOLDER"
wait "$HOLDER" 2>/dev/null || true
HOLDER=

# Free again: the run goes ahead.
"$ZINF" train --config "$CONFIG" --nvme-path "$TMP/nvme" --model tiny --steps 2 --save-dir "$TMP/ckpt" \
  > "$TMP/out3" 2> "$TMP/err3" || { cat "$TMP/err3" >&2; exit 1; }
grep -q "zinf train: 2 steps" "$TMP/out3"
echo "shared dirs test: OK"
