#!/bin/sh
# sanitize.sh TOOL BINARY ARGS...: runs BINARY under compute-sanitizer's TOOL and fails on any
# reported error; reports a visible skip where compute-sanitizer or the driver is missing.
tool=$1; shift
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -z "$cs" ]; then echo "[  SKIPPED ] compute-sanitizer not found"; exit 0; fi
"$@" --gtest_list_tests >/dev/null 2>&1 || { echo "[  SKIPPED ] test binary did not start"; exit 0; }
out=$("$cs" --tool "$tool" --error-exitcode 1 "$@" 2>&1); rc=$?
echo "$out"
if echo "$out" | grep -q "SKIPPED.*no CUDA driver"; then exit 0; fi
exit $rc
