#!/bin/sh
# zinf bench step as a user runs it, shortened: the tiny model, NVMe offload
# in a temporary directory, one repetition of three steps, with the HTML page
# and a JSON copy. The page must be self-contained (inline SVG, no scripts,
# nothing fetched) and carry the figures; the JSON must have the keys the
# README documents. Without fio the NVMe part is skipped (--no-fio).
set -eu
ZINF="$1"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-bench-step-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
FIO=""
command -v fio > /dev/null 2>&1 || FIO="--no-fio"

"$ZINF" bench step --model tiny --steps 3 --reps 1 --nvme-path "$TMP" $FIO \
  --html "$TMP/step.html" --json "$TMP/step.json" > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; exit 1; }

for key in '"ratio_to_bound"' '"ratio_to_bound_runs"' '"step_s"' '"bound_s"' '"parts"' '"compute_s"' \
           '"adam_s"' '"nvme_s"' '"pcie_s"' '"comm_s"' '"breakdown"' '"waiting_s"' '"optimizer_s"'; do
  grep -q "$key" "$TMP/out" || { echo "stdout JSON lacks $key" >&2; exit 1; }
  grep -q "$key" "$TMP/step.json" || { echo "--json file lacks $key" >&2; exit 1; }
  grep -q "$(printf '%s' "$key" | sed 's/"/\&quot;/g')" "$TMP/step.html" || { echo "HTML lacks $key" >&2; exit 1; }
done
grep -q "<svg" "$TMP/step.html" || { echo "HTML has no <svg" >&2; exit 1; }
grep -q "Key figures" "$TMP/step.html" || { echo "HTML has no table of key figures" >&2; exit 1; }
grep -q "where the time went" "$TMP/step.html" || { echo "HTML has no timeline" >&2; exit 1; }
if sed 's#http://www.w3.org/2000/svg##g' "$TMP/step.html" | grep -qi -e "<script" -e "https\?://" -e "url(" -e "@import"; then
  echo "HTML is not self-contained" >&2
  exit 1
fi
# The scratch directory inside --nvme-path is gone.
if ls "$TMP" | grep -q "zinf-bench-step\."; then echo "scratch directory left behind" >&2; exit 1; fi
echo "bench step test: OK"
