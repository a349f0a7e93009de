#!/bin/sh
# zinf train --metrics FILE.jsonl as a user runs it: one line per optimizer
# step, in step order, each with the step's loss and time parts; evaluations
# (before the first step, every --eval-every steps and after the last) on
# lines of their own with eval_loss, never loss.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-metrics-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

"$ZINF" train --config "$CONFIG" --model tiny --steps 6 --eval-every 3 --device host \
  --metrics "$TMP/m.jsonl" > "$TMP/out" 2> "$TMP/err"
grep -q "zinf train: 6 steps" "$TMP/out"
fail() { echo "$1" >&2; cat "$TMP/m.jsonl" >&2; exit 1; }
steps=$(grep -c '"loss":' "$TMP/m.jsonl") || true
[ "$steps" = 6 ] || fail "expected 6 step lines, got $steps"
evals=$(grep -c '"eval_loss":' "$TMP/m.jsonl") || true
[ "$evals" = 3 ] || fail "expected 3 evaluation lines (steps 0, 3, 6), got $evals"
grep '"eval_loss":' "$TMP/m.jsonl" | grep -q '"loss":' && fail "an evaluation line has a loss key"
# Steps 1..6 in order, each line a whole object with every key.
order=$(grep '"loss":' "$TMP/m.jsonl" | sed 's/^{"step":\([0-9]*\),.*/\1/' | tr '\n' ' ')
[ "$order" = "1 2 3 4 5 6 " ] || fail "steps out of order: $order"
for key in '"lr":' '"grad_norm":' '"tokens":' '"time":{"total":' '"compute":' '"nvme":' '"pcie":' '"comm":' '"optimizer":'; do
  n=$(grep -c "$key" "$TMP/m.jsonl") || true
  [ "$n" = 6 ] || fail "key $key on $n lines, expected 6"
done
grep -q '^{"step":3,"eval_loss":' "$TMP/m.jsonl" || fail "no evaluation after step 3"
# The first step's loss is the one the summary prints (to its 4 decimals).
first=$(sed -n 's/^zinf train: 6 steps, loss \([0-9.]*\) .*/\1/p' "$TMP/out")
line_loss=$(grep -m1 '"loss":' "$TMP/m.jsonl" | sed 's/.*"loss":\([0-9.e+-]*\),.*/\1/')
[ "$(printf '%.4f' "$line_loss")" = "$first" ] || fail "first loss $line_loss does not print as $first"
# wall_clock_breakdown (the config's key): each step's kernel time on the
# device, on a progress line of its own, in the summary and in every step's
# metrics line; an evaluation's kernels are not a step's.
sed -e 's/^{/{"wall_clock_breakdown": true,/' -e 's/"steps_per_print": *[0-9]*/"steps_per_print": 1/' \
  "$CONFIG" > "$TMP/timed.json"
"$ZINF" train --config "$TMP/timed.json" --model tiny --steps 2 --eval-every 1 --device host \
  --metrics "$TMP/t.jsonl" > "$TMP/tout" 2> "$TMP/terr" || fail "the timed run failed: $(cat "$TMP/terr")"
n=$(grep -c '^ *kernels [0-9.]* s on the device, [0-9]*% busy: [A-Za-z0-9]* [0-9]*% ([0-9]* calls)' "$TMP/terr") || true
[ "$n" = 2 ] || fail "expected 2 kernel lines among the progress lines, got $n: $(cat "$TMP/terr")"
grep -q '^zinf train: kernels [0-9.]* s on the device' "$TMP/tout" || fail "no kernel summary: $(cat "$TMP/tout")"
n=$(grep -c '"kernels":{"busy":[0-9.e-]*,"ops":{.*"AttentionBackward":{"seconds":[0-9.e-]*,"calls":4}' "$TMP/t.jsonl") || true
[ "$n" = 2 ] || fail "expected kernels with AttentionBackward's 4 calls (2 layers, 2 micro-batches) on 2 step lines, got $n: $(cat "$TMP/t.jsonl")"
echo "train metrics test: OK"
