#!/usr/bin/env bash
# make check-layers: every #include of src/ and perf/ points down the arrows.
#
# A file of src/<layer>/ may include its own layer's headers and those of the
# layers its layer may use (DEPS below, followed transitively); a header of
# include/zinf/ belongs to the layer whose zinf_layer_include_root call names
# it in PUBLIC_HEADERS (src/<layer>/CMakeLists.txt). perf/ is compiled into
# the zinf executable beside cli and registers its commands through it.
# The build enforces the same arrows (cmake/Layers.cmake: a layer's target
# sees only the headers of what it links); this script says it before
# anything compiles, for code the build does not compile here too (CUDA
# branches), and with the rule each include breaks. It also checks that no
# src/<layer>/CMakeLists.txt links a zinf_<layer> target the table forbids,
# so the table and the CMake links cannot drift apart unnoticed.
#
# Prints each offending include as file:line and exits 1; exits 0 when every
# include follows the arrows.
set -euo pipefail
cd "$(dirname "$0")/.."

# The arrows, bottom-up: each layer and the layers it uses directly (its
# target_link_libraries). A layer may include everything reachable from it.
LAYERS=(core kernels device aio optim comm swap zero3 model cli perf)
declare -A DEPS=(
  [core]=""
  [kernels]="core"
  [device]="core"
  [aio]="device core"
  [optim]="core"
  [comm]="device optim core"
  [swap]="aio optim core"
  [zero3]="swap comm optim aio device core"
  [model]="zero3 kernels device core"
  [cli]="model zero3 swap comm optim aio device kernels core"
  [perf]="cli"
)

# REACH[layer]: " a b c " — every layer `layer` may include, itself included.
declare -A REACH=()
reach_of() {
  local layer=$1 out=" $1 " todo=(${DEPS[$1]}) next
  while ((${#todo[@]})); do
    next=${todo[0]}
    todo=("${todo[@]:1}")
    [[ $out == *" $next "* ]] && continue
    out+="$next "
    todo+=(${DEPS[$next]})
  done
  REACH[$layer]=$out
}
for layer in "${LAYERS[@]}"; do reach_of "$layer"; done

# OWNER[file]: the layer that owns include/zinf/<file>.
declare -A OWNER=()
while read -r layer headers; do
  for h in $headers; do OWNER[$h]=$layer; done
done < <(sed -n 's/^[[:space:]]*zinf_layer_include_root([^[:space:]]*[[:space:]]\+\([a-z0-9_]*\)[[:space:]]\+PUBLIC_HEADERS[[:space:]]\+\([^)]*\)).*/\1 \2/p' \
           src/*/CMakeLists.txt)

errors=0
includes=0
report() {  # where, what, why
  echo "$1: $2: $3"
  errors=$((errors + 1))
}
allowed() {  # layer, target layer
  [[ ${REACH[$1]} == *" $2 "* ]]
}
# upward or sideways, and what `layer` may include instead.
rule() {  # layer, target layer
  local kind="sideways: $2 is not below $1"
  allowed "$2" "$1" && kind="upward: $2 is above $1"
  echo "$kind ($1 may include:${REACH[$1]% })"
}

# Every folder of src/ is a layer of the table.
for dir in src/*/; do
  layer=$(basename "$dir")
  [[ -n ${DEPS[$layer]+set} ]] || report "$dir" "a folder that is no layer" "add it to the table of $0"
done

# The CMake links follow the table.
for layer in "${LAYERS[@]}"; do
  file=src/$layer/CMakeLists.txt
  [[ -f $file ]] || continue
  while IFS=: read -r line token; do
    target=${token#zinf_}
    [[ -n ${DEPS[$target]+set} && $target != "$layer" ]] || continue
    allowed "$layer" "$target" || report "$file:$line" "names $token" "$(rule "$layer" "$target")"
  done < <(sed 's/#.*//' "$file" | grep -noE '\bzinf_[a-z0-9_]+\b' || true)
done

# The includes.
while IFS= read -r -d '' file; do
  case $file in
    perf/*) layer=perf ;;
    *) layer=${file#src/}; layer=${layer%%/*} ;;
  esac
  [[ -n ${DEPS[$layer]+set} ]] || continue
  while IFS=: read -r line text; do
    [[ $text =~ include[[:space:]]*[\<\"]([^\">]+) ]] || continue
    path=${BASH_REMATCH[1]}
    first=${path%%/*}
    if [[ $path != */* ]]; then
      # Beside the including file: its own layer (perf's report.h).
      [[ -f $(dirname "$file")/$path ]] && includes=$((includes + 1))
      continue
    fi
    if [[ $first == zinf ]]; then
      includes=$((includes + 1))
      target=${OWNER[${path#zinf/}]:-}
      if [[ -z $target ]]; then
        report "$file:$line" "$text" "include/$path is no layer's public header (PUBLIC_HEADERS in src/<layer>/CMakeLists.txt)"
        continue
      fi
    elif [[ -n ${DEPS[$first]+set} ]]; then
      includes=$((includes + 1))
      target=$first
    else
      continue  # a system or third-party header
    fi
    allowed "$layer" "$target" || report "$file:$line" "$text" "$(rule "$layer" "$target")"
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*[<"][^">]+[">]' "$file" || true)
done < <(find src perf -type f \( -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' \) -print0 | sort -z)

if ((errors)); then
  echo "check-layers: $errors include(s) or link(s) break the arrows (the table: $0)"
  exit 1
fi
echo "check-layers: $includes includes of src/ and perf/ follow the arrows"
