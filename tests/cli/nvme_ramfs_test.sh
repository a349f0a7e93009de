#!/bin/sh
# zinf train --nvme-path on a filesystem that refuses O_DIRECT (ramfs, which
# also reports 0 B free): the error says what `zinf nvme-check` says there
# (O_DIRECT refused) and names the flag, not the config key. Mounting needs
# root: without it the test is skipped (exit 77) with the reason.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-ramfs-test.XXXXXX")
MOUNTED=
trap '[ -n "$MOUNTED" ] && umount "$TMP/ramfs"; rm -rf "$TMP"' EXIT
mkdir -p "$TMP/ramfs"
if ! mount -t ramfs none "$TMP/ramfs" 2> "$TMP/mount-err"; then
  echo "skipped: cannot mount a ramfs here (needs root): $(cat "$TMP/mount-err")"
  exit 77
fi
MOUNTED=1

if "$ZINF" train --config "$CONFIG" --nvme-path "$TMP/ramfs/nvme" --model tiny --steps 2 \
     > "$TMP/out" 2> "$TMP/err"; then
  echo "training on a ramfs swap path was not refused" >&2
  exit 1
fi
cat "$TMP/err"
grep -q -- "--nvme-path $TMP/ramfs/nvme: .*O_DIRECT is refused by this filesystem (ramfs)" "$TMP/err" ||
  { echo "the error does not say O_DIRECT is refused, naming --nvme-path" >&2; exit 1; }
if grep -q "zero_optimization.offload_.*nvme_path" "$TMP/err"; then
  echo "the error names the config key, not --nvme-path" >&2
  exit 1
fi
"$ZINF" nvme-check "$TMP/ramfs" > "$TMP/check" 2>&1 || true
grep -q "O_DIRECT is refused by this filesystem (ramfs)" "$TMP/check" || { cat "$TMP/check" >&2; exit 1; }
echo "nvme ramfs test: OK"
