#!/bin/sh
# zinf bench swap, shortened and without fio: its JSON says how full the
# engine kept its queues over the timed steps. The pipelined step keeps
# pieces in flight, some of the time reads and writes together; every
# fraction lies in [0, 1] and the parts add up to the busy time.
set -eu
ZINF="$1"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-bench-swap-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

"$ZINF" bench swap --params 2097152 --sub-group 262144 --steps 2 --queue-depth 4 --no-fio --nvme "$TMP" \
  --json "$TMP/swap.json" > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; exit 1; }

python3 - "$TMP/swap.json" <<'PY'
import json, sys
q = json.load(open(sys.argv[1]))["queue"]
for k in ("busy", "full", "mixed", "read_only", "write_only"):
    if not 0.0 <= q[k] <= 1.0:
        sys.exit(f"queue.{k} = {q[k]} is not a fraction")
if q["busy"] <= 0 or q["mixed"] <= 0:
    sys.exit(f"the pipelined step shows no time in flight or no mixed time: {q}")
if abs(q["mixed"] + q["read_only"] + q["write_only"] - q["busy"]) > 1e-9:
    sys.exit(f"the directions do not add up to the busy time: {q}")
if q["full"] > q["busy"] + 1e-9:
    sys.exit(f"full exceeds busy: {q}")
PY
echo "bench swap test: OK"
