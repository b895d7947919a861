#!/usr/bin/env bash
# Runs a GoogleTest binary as N shards at once (GTEST_TOTAL_SHARDS /
# GTEST_SHARD_INDEX: every test runs in exactly one shard), each shard's
# output printed whole after it ends; fails if any shard fails or runs no
# test. For a binary whose tests are single-threaded (the CUDA emulator), so
# two shards use the two cores the CI machine has.
# Usage: run_gtest_shards.sh N BINARY [ARGS...]
set -uo pipefail
n=$1
shift
[[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run_gtest_shards.sh: the shard count must be a positive integer, got '$n'" >&2; exit 2; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
pids=()
for ((i = 0; i < n; i++)); do
  GTEST_TOTAL_SHARDS=$n GTEST_SHARD_INDEX=$i "$@" > "$dir/$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for ((i = 0; i < n; i++)); do
  wait "${pids[$i]}" || rc=1
  echo "=== shard $i of $n ==="
  cat "$dir/$i.log"
  # A shard that ran nothing (a filter or sharding mistake) must not pass silently.
  grep -q "^\[==========\] [1-9][0-9]* tests\? from" "$dir/$i.log" || { echo "shard $i ran no test" >&2; rc=1; }
done
exit $rc
