#!/bin/sh
# DeepSpeed's csv_monitor and tensorboard sections as a user writes them:
# zinf train leaves one CSV row per step in each Train_Samples_*.csv and one
# per evaluation in Eval_Samples_eval_loss.csv under output_path/job_name,
# and an events.out.tfevents.* file there; --report leaves the finished page. Where Python has the tensorboard
# package, its EventAccumulator reads the event file back: one train_loss
# event per step, at DeepSpeed's x axis (samples), equal to the CSV's values.
set -eu
ZINF="$1"
CONFIG="$2"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-monitors-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
fail() { echo "$1" >&2; exit 1; }

# The shipped config plus the two monitor sections (and wandb, ignored).
. "$(dirname "$0")/monitors_config.sh"
write_monitors_config "$CONFIG" "$TMP/config.json" "$TMP" ', "wandb": {"enabled": true, "project": "p"}'
"$ZINF" train --config "$TMP/config.json" --model tiny --steps 5 --eval-every 2 --device host \
  --report "$TMP/run.html" > "$TMP/out" 2> "$TMP/err" || { cat "$TMP/err" >&2; fail "zinf train failed"; }
grep -q "zinf train: 5 steps" "$TMP/out"
grep -q "wandb (a network service" "$TMP/err" || fail "wandb not reported as ignored with its reason"

for f in "$TMP"/csv/run/Train_Samples_*.csv; do
  rows=$(($(wc -l < "$f") - 1))
  [ "$rows" = 5 ] || fail "$f: $rows rows, expected one per step (5)"
done
[ -f "$TMP/csv/run/Train_Samples_train_loss.csv" ] || fail "no train_loss CSV"
head -1 "$TMP/csv/run/Train_Samples_train_loss.csv" | grep -qx "step,train_loss" || fail "train_loss CSV header"
# Evaluations before the first step, after step 2 and 4, and after the last.
rows=$(($(wc -l < "$TMP/csv/run/Eval_Samples_eval_loss.csv") - 1))
[ "$rows" = 4 ] || fail "eval CSV: $rows rows, expected 4"

set -- "$TMP"/tb/run/events.out.tfevents.*
[ $# = 1 ] && [ -s "$1" ] || fail "expected one event file under $TMP/tb/run"
EVENTS="$1"

if python3 -c 'import tensorboard' 2>/dev/null; then
  python3 - "$EVENTS" "$TMP/csv/run/Train_Samples_train_loss.csv" <<'PY' || fail "tensorboard could not read the event file"
import sys, warnings
warnings.filterwarnings("ignore")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1])
acc.Reload()
ev = acc.Scalars("Train/Samples/train_loss")
rows = [l.strip().split(",") for l in open(sys.argv[2]).readlines()[1:]]
assert len(ev) == 5, len(ev)
for e, (step, value) in zip(ev, rows):
    assert e.step == int(step), (e.step, step)
    assert abs(e.value - float(value)) <= 1e-6 * abs(float(value)), (e.value, value)
assert len(acc.Scalars("Eval/Samples/eval_loss")) == 4
print("tensorboard read 5 train_loss events")
PY
else
  echo "note: python3 has no tensorboard package; the event file's format is checked by cli_tensorboard_monitor_test"
fi
# --report: the finished page, four charts, no scripts, nothing left beside it.
grep -q "Finished" "$TMP/run.html" || fail "report not rewritten at the end"
[ "$(grep -o '<svg' "$TMP/run.html" | wc -l)" = 4 ] || fail "report: expected 4 charts"
grep -q '<script' "$TMP/run.html" && fail "report has a script"
grep -q 'eval (held out) at 4: ' "$TMP/run.html" || fail "report: no evaluation after step 4"
[ "$(ls "$TMP" | grep -c 'run.html')" = 1 ] || fail "report: a temporary file left"
echo "train monitors test: OK"
