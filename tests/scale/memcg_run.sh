#!/bin/sh
# memcg_run.sh LIMIT_BYTES COMMAND...
#
# Runs COMMAND in a new memory cgroup capped at LIMIT_BYTES (everything the
# process holds in RAM counts: heap, pinned pools, the host device's memory,
# page cache it fills), then prints "memcg: peak P bytes, limit L bytes" on
# stderr and exits with COMMAND's status (137 when the OOM killer ended it).
# cgroup v2 (a child of the cgroup2 mount with the memory controller:
# memory.max, memory.swap.max 0, memory.peak) or v1 (the memory hierarchy:
# memory.limit_in_bytes, memory.memsw.limit_in_bytes where present,
# memory.max_usage_in_bytes). Where no memory controller can be written
# (not root, a read-only /sys/fs/cgroup, no controller) it prints
# "memcg: SKIP: <reason>" and exits 77, ctest's SKIP_RETURN_CODE.
set -u
[ $# -ge 2 ] || { echo "usage: memcg_run.sh LIMIT_BYTES COMMAND..." >&2; exit 2; }
limit=$1
shift
case "$limit" in '' | *[!0-9]*) echo "memcg_run.sh: LIMIT_BYTES must be a byte count, got '$limit'" >&2; exit 2 ;; esac

skip() { echo "memcg: SKIP: $*" >&2; exit 77; }

# The mount points of the memory controller, from the kernel's own table.
v1=$(awk '$3 == "cgroup" && $4 ~ /(^|,)memory(,|$)/ { print $2; exit }' /proc/self/mounts)
v2=$(awk '$3 == "cgroup2" { print $2; exit }' /proc/self/mounts)
dir=""
if [ -n "$v1" ] && [ -w "$v1" ]; then
  kind=v1
  parent=$v1
elif [ -n "$v2" ] && grep -qw memory "$v2/cgroup.controllers" 2>/dev/null; then
  kind=v2
  parent=$v2
  # Children get the memory controller only when the parent hands it down.
  grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null ||
    echo +memory > "$parent/cgroup.subtree_control" 2>/dev/null ||
    skip "cannot enable the memory controller in $parent/cgroup.subtree_control"
else
  skip "no writable cgroup memory controller (v1: ${v1:-not mounted}; v2: ${v2:-not mounted})"
fi
dir="$parent/zinf-memcg-$$"
mkdir "$dir" 2>/dev/null || skip "cannot create a cgroup under $parent (needs root)"
cleanup() { rmdir "$dir" 2>/dev/null; }
trap cleanup EXIT
if [ "$kind" = v1 ]; then
  echo "$limit" > "$dir/memory.limit_in_bytes" || skip "cannot set $dir/memory.limit_in_bytes"
  [ -f "$dir/memory.memsw.limit_in_bytes" ] && echo "$limit" > "$dir/memory.memsw.limit_in_bytes"
  peak_file=memory.max_usage_in_bytes
else
  echo "$limit" > "$dir/memory.max" || skip "cannot set $dir/memory.max"
  [ -f "$dir/memory.swap.max" ] && echo 0 > "$dir/memory.swap.max"
  peak_file=memory.peak
  [ -f "$dir/$peak_file" ] || skip "$dir has no memory.peak (kernel before 5.19)"
fi

# The child joins the cgroup, then becomes COMMAND (so COMMAND and all it
# starts are charged from their first page).
sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' memcg "$dir" "$@"
rc=$?
echo "memcg: peak $(cat "$dir/$peak_file") bytes, limit $limit bytes ($kind)" >&2
exit $rc
