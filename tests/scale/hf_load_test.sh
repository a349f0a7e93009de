#!/bin/sh
# hf_load_test.sh ZINF MEMCG_RUN [LAYERS] [LIMIT_BYTES]
#
# Loads a Hugging Face checkpoint inside a memory cgroup smaller than the
# checkpoint's file (memcg_run.sh; exits 77, skipped, where no memory
# controller is writable), trains one step with parameters and optimizer
# state on NVMe (a directory here) and exports a HF folder, and checks the
# step's loss (17 digits) and the exported file against the same run
# uncapped, bit for bit.
#
# The checkpoint is made by zinf itself (CI has no torch): a random-init
# GPT-2 of LAYERS layers of width 768 exported as an F32 HF folder
# (LAYERS 24: 170M parameters, a 0.68 GB model.safetensors). The cap
# (default 380 MB) is about half the file. What it must hold, measured on
# this shape: the process's fixed part, about 190 MB at load (the 128 MiB
# host device budget, the pinned windows; the same with random init, so the
# loader adds nothing that grows with the model), 250 MB while training,
# 320 MB while exporting (the engine gathers one 28 MB block three times
# over). A load that held the model in RAM would need the fixed part plus
# the file, 0.87 GB, more than twice the cap (zinf eval of the trained
# checkpoint then runs under the same cap): the test proves the cap is
# that tight by reading the file into one buffer (dd bs=FILE) under the
# same cap, which must fail (and a loader changed by hand to read the file
# into one buffer first was killed by it). Page cache counts too: the file is evicted
# before the capped run, so its reads are charged to the cgroup (clean
# pages there are reclaimable; anonymous memory is not).
#
# Disk: about 7 GB in ${TMPDIR:-/tmp} at the peak (three 0.68 GB files, one
# run's NVMe state and its 2 GB checkpoint).
set -eu
ZINF="$1"
MEMCG_RUN="$2"
LAYERS="${3:-24}"
LIMIT="${4:-380000000}"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/zinf-hfload.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$TMP/nvme-ref" "$TMP/nvme-cap"

cat > "$TMP/model.json" <<JSON
{"vocab_size": 257, "seq_len": 64, "n_layer": $LAYERS, "n_head": 12, "n_embd": 768}
JSON
# The scale test's tiers (both on NVMe, DeepSpeed's buffers).
. "$(dirname "$0")/nvme_config.sh"
. "$(dirname "$0")/capped.sh"
scale_nvme_config "$TMP/nvme-ref" > "$TMP/ref.json"
scale_nvme_config "$TMP/nvme-cap" > "$TMP/cap.json"
# train [PREFIX...] -- ZINF-TRAIN-ARGS...: zinf train with the shared flags, run under PREFIX.
train() {
  prefix=""
  while [ "$1" != "--" ]; do prefix="$prefix $1"; shift; done
  shift
  $prefix "$ZINF" train --device host --device-budget 128M --eval-every 0 --holdout 0 --exact-losses \
    --export-dtype F32 "$@"
}

# The checkpoint: the random-init model's weights, no training.
train -- --model "$TMP/model.json" --config "$TMP/ref.json" --steps 0 --export "$TMP/ckpt" \
  > "$TMP/make.out" 2> "$TMP/make.err" || { cat "$TMP/make.err" >&2; exit 1; }
file="$TMP/ckpt/model.safetensors"
bytes=$(wc -c < "$file")
echo "hf load test: checkpoint $bytes B (F32, $LAYERS layers), cgroup limit $LIMIT B"
if [ "$bytes" -le "$LIMIT" ]; then
  echo "hf load test: the checkpoint is not larger than the cap" >&2
  exit 1
fi

# The reference: uncapped.
train -- --model "$TMP/ckpt" --config "$TMP/ref.json" --steps 1 --export "$TMP/ref" \
  > "$TMP/ref.out" 2> "$TMP/ref.err" || { cat "$TMP/ref.err" >&2; exit 1; }
grep "exact loss" "$TMP/ref.err" > "$TMP/ref.losses"
[ "$(wc -l < "$TMP/ref.losses")" -eq 1 ] || { cat "$TMP/ref.err" >&2; exit 1; }
rm -rf "$TMP/nvme-ref"  # its 2.4 GB of state: disk is often short

# Out of the page cache (dd's nocache with count=0 drops the whole file),
# so that the capped run's reads are its own.
evict() { dd if="$1" iflag=nocache count=0 2> /dev/null || true; }

# The control: the whole file in one buffer does not fit under the cap.
evict "$file"
set +e
"$MEMCG_RUN" "$LIMIT" dd if="$file" of=/dev/null bs="$bytes" count=1 iflag=fullblock > /dev/null 2> "$TMP/dd.err"
rc=$?
set -e
if [ "$rc" -eq 77 ]; then
  grep "memcg: SKIP" "$TMP/dd.err" >&2
  exit 77
fi
if [ "$rc" -eq 0 ]; then
  cat "$TMP/dd.err" >&2
  echo "hf load test: the whole file fit in one buffer under the cap: the cap proves nothing" >&2
  exit 1
fi
echo "hf load test: the whole file in one buffer under the cap: exit $rc (as it must)"

evict "$file"
capped "hf load test: the capped run" "$TMP/cap" train --model "$TMP/ckpt" --config "$TMP/cap.json" --steps 1 \
  --export "$TMP/cap" --save-dir "$TMP/save"
grep "exact loss" "$TMP/cap.err" > "$TMP/cap.losses"
same "hf load test: losses (uncapped, then capped)" "$TMP/ref.losses" "$TMP/cap.losses"
if ! cmp "$TMP/ref/model.safetensors" "$TMP/cap/model.safetensors" >&2; then
  echo "hf load test: the exported weights differ (uncapped, then capped)" >&2
  exit 1
fi
cat "$TMP/cap.losses"
rm -rf "$TMP/nvme-cap" "$TMP/ref" && mkdir -p "$TMP/nvme-cap" "$TMP/nvme-ref"

# zinf eval under the same cap: its forward-only engine holds the working
# parameters alone (on NVMe here) and reads only the checkpoint's fp32
# master weights (one blob per sub-group of 1e6), streamed home block by
# block. The capped run's checkpoint must score what its export scores
# uncapped, to the 9 digits eval prints (the same bf16 weights: bit for bit).
"$ZINF" data corpus --output "$TMP/eval.bin" --bytes 1K > /dev/null
evaluate() {
  prefix=""
  while [ "$1" != "--" ]; do prefix="$prefix $1"; shift; done
  shift
  $prefix "$ZINF" eval --device host --device-budget 128M --data "$TMP/eval.bin" "$@"
}
evaluate -- --model "$TMP/cap" --config "$TMP/ref.json" > "$TMP/ref-eval.out" 2> "$TMP/ref-eval.err" ||
  { cat "$TMP/ref-eval.err" >&2; exit 1; }
capped "hf load test: the capped eval" "$TMP/cap-eval" evaluate --model "$TMP/ckpt" --resume "$TMP/save" \
  --config "$TMP/cap.json"
grep -q "^loss " "$TMP/ref-eval.out" || { cat "$TMP/ref-eval.err" >&2; exit 1; }
same "hf load test: evals (the export uncapped, then the checkpoint capped)" "$TMP/ref-eval.out" "$TMP/cap-eval.out"
echo "hf load test: eval of the checkpoint under the cap: $(grep '^loss ' "$TMP/cap-eval.out")"
rm -rf "$TMP/save" "$TMP/nvme-cap" && mkdir -p "$TMP/nvme-cap"

# zinf's one-file export and --init-from under the same cap: the file is
# laid out first and written block by block, and read back tensor by
# tensor (the 0.68 GB of F32 weights held in RAM whole would not fit). The
# capped export of the HF folder's weights, evaluated under the cap, scores
# what the folder scores uncapped.
capped "hf load test: the capped one-file export" "$TMP/export" train --model "$TMP/ckpt" --config "$TMP/cap.json" \
  --steps 0 --export "$TMP/w.safetensors"
rm -rf "$TMP/nvme-cap" && mkdir -p "$TMP/nvme-cap"
evaluate -- --model "$TMP/ckpt" --config "$TMP/ref.json" > "$TMP/ref-eval2.out" 2> "$TMP/ref-eval2.err" ||
  { cat "$TMP/ref-eval2.err" >&2; exit 1; }
capped "hf load test: the capped eval --init-from" "$TMP/cap-eval2" evaluate --model "$TMP/ckpt" \
  --init-from "$TMP/w.safetensors" --config "$TMP/cap.json"
same "hf load test: evals (the HF folder uncapped, then its one-file export capped)" "$TMP/ref-eval2.out" \
  "$TMP/cap-eval2.out"
echo "hf load test: one-file export ($(wc -c < "$TMP/w.safetensors") B) and --init-from under the cap: $(grep '^loss ' "$TMP/cap-eval2.out")"
echo "hf load test: OK"
