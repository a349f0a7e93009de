#!/usr/bin/env bash
# make example: zinf as an embedder sees it. Installs the build directory
# (default build/, built) into a new temporary prefix, then
#   * checks that include/ there holds include/zinf/*.h and nothing else, and
#     compiles each installed header alone;
#   * builds examples/ against the prefix with find_package(zinf) and runs it
#     twice: state in pinned RAM, and in NVMe files (a temporary directory);
#   * builds the same program with pkg-config's flags (zinf.pc) and runs it;
#   * runs the installed `zinf --help`.
# The example exits non-zero unless its loss fell, and so does this script.
# The prefix is removed afterwards (KEEP=1 keeps it and says where).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
[ -f "$build/build.ninja" ] || { echo "check_install: $build is not a configured build directory" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/zinf-install.XXXXXX")
[ "${KEEP:-0}" = 1 ] && echo "== keeping $work" || trap 'rm -rf "$work"' EXIT
prefix=$work/prefix

echo "== install into $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

echo "== installed headers: include/zinf/ only, each compiling alone"
want=$(cd include && find zinf -type f | sort)
got=$(cd "$prefix/include" && find . -type f | sed 's#^\./##' | sort)
if [ "$want" != "$got" ]; then
  echo "check_install: installed headers differ from include/zinf/:" >&2
  diff <(echo "$want") <(echo "$got") >&2 || true
  exit 1
fi
for h in $got; do
  echo "#include <$h>" | ${CXX:-c++} -std=c++17 -Wall -Wextra -Werror -fsyntax-only -x c++ -I"$prefix/include" - ||
    { echo "check_install: $h does not compile alone" >&2; exit 1; }
done
echo "   $(echo "$got" | wc -l) headers"

echo "== examples/ with find_package(zinf)"
cmake -S examples -B "$work/examples" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/examples"
echo "== run: state in pinned RAM"
"$work/examples/mlp_regression"
echo "== run: state on NVMe ($work/nvme)"
mkdir "$work/nvme"
"$work/examples/mlp_regression" "$work/nvme"

echo "== the same program with pkg-config (zinf.pc)"
pcdir=$(dirname "$(find "$prefix" -name zinf.pc)")
flags=$(PKG_CONFIG_PATH="$pcdir" pkg-config --cflags --libs zinf)
echo "   $flags"
# shellcheck disable=SC2086 # the flags are words
${CXX:-c++} -std=c++17 -O2 examples/mlp_regression.cc -o "$work/mlp_regression_pc" $flags
"$work/mlp_regression_pc" > "$work/pc_run.log" || { cat "$work/pc_run.log"; exit 1; }
tail -1 "$work/pc_run.log"

echo "== installed zinf command"
"$prefix/bin/zinf" --help > /dev/null
echo "check_install: ok"
