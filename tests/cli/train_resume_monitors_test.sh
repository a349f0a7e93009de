#!/bin/sh
# zinf train --resume goes on in the metrics files the earlier run wrote:
# --metrics, csv_monitor and tensorboard keep the steps up to the checkpoint,
# drop the earlier run's later steps and get the resumed run's, so each step
# is there once, in order (the resumed steps' losses are the earlier run's,
# bit for bit). And a metrics file that cannot be written (/dev/full) is
# warned of once while training runs to its end.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-resume-monitors-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "$1" >&2; exit 1; }

. "$(dirname "$0")/monitors_config.sh"
write_monitors_config "$CONFIG" "$TMP/config.json" "$TMP"
train() {
  "$ZINF" train --config "$TMP/config.json" --model tiny --steps 6 --eval-every 3 --device host \
    --metrics "$TMP/m.jsonl" "$@" > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; fail "zinf train $* failed"; }
}
train --save-dir "$TMP/ck" --save-every 3
cp "$TMP/m.jsonl" "$TMP/first.jsonl"
cp "$TMP/csv/run/Train_Samples_train_loss.csv" "$TMP/first.csv"
# Resume at step 3: steps 4..6 again (and a cut-short last line, as a run
# killed mid-write leaves, must go too).
printf '{"step":7,"lo' >> "$TMP/m.jsonl"
sleep 1  # the new event file's name (seconds since the epoch) sorts after the first one's
train --resume "$TMP/ck/rank-0/step-00000003"
cat "$TMP/out" "$TMP/err" | grep -q "resumed at step 3" || fail "not resumed at step 3"

order=$(sed 's/^{"step":\([0-9]*\),"\([a-z_]*\)".*/\1\2/' "$TMP/m.jsonl" | tr '\n' ' ')
[ "$order" = "0eval_loss 1loss 2loss 3loss 3eval_loss 4loss 5loss 6loss 6eval_loss " ] ||
  fail "metrics lines after the resume: $order"
[ "$(grep '"loss":' "$TMP/m.jsonl" | sed 's/"time".*//')" = "$(grep '"loss":' "$TMP/first.jsonl" | sed 's/"time".*//')" ] ||
  fail "resumed steps' metrics differ from the first run's"
for f in "$TMP"/csv/run/Train_Samples_*.csv; do
  rows=$(($(wc -l < "$f") - 1))
  [ "$rows" = 6 ] || fail "$f: $rows rows after the resume, expected 6"
done
cmp -s "$TMP/csv/run/Train_Samples_train_loss.csv" "$TMP/first.csv" || fail "train_loss CSV differs from the first run's"
rows=$(($(wc -l < "$TMP/csv/run/Eval_Samples_eval_loss.csv") - 1))
[ "$rows" = 3 ] || fail "eval CSV: $rows rows, expected 3 (steps 0, 3, 6)"
set -- "$TMP"/tb/run/events.out.tfevents.*
[ $# = 2 ] || fail "expected an event file per run under $TMP/tb/run"
if python3 -c 'import tensorboard' 2>/dev/null; then
  python3 - "$TMP/tb/run" <<'PY' || fail "tensorboard does not see each step once"
import sys, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
steps = [e.step for e in acc.Scalars("Train/Samples/step")]
assert steps == sorted(set(steps)) and len(steps) == 6, steps
PY
fi

# A metrics file on a full disk: one warning naming it, and the run finishes.
"$ZINF" train --config "$CONFIG" --model tiny --steps 4 --eval-every 2 --device host \
  --metrics /dev/full > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; fail "a full metrics file failed the run"; }
grep -q "zinf train: 4 steps" "$TMP/out" || fail "training did not finish"
warnings=$(grep -c "warning: .*/dev/full" "$TMP/err") || true
[ "$warnings" = 1 ] || { cat "$TMP/err" >&2; fail "expected one warning naming /dev/full, got $warnings"; }
echo "train resume monitors test: OK"
