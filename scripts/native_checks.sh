#!/usr/bin/env bash
# The native library's own checks after the tests, side by side: scripts/sanitize.sh (the tests
# that drive libkvgguf, against an ASan+UBSan build) and scripts/neon_check.sh (the NEON kernels
# under qemu, one core for about two minutes). Each mostly keeps one core busy, so on two cores
# both take about as long as the longer one. The sanitizer run prints as it goes; the NEON
# check's output follows it. Fails if either fails.
#
#   bash scripts/native_checks.sh            # after the README's test install
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/neon_check.log
bash scripts/neon_check.sh > "$log" 2>&1 &
neon=$!
bash scripts/sanitize.sh
sanitize=$?
wait "$neon"
neon_status=$?
cat "$log"
if [ "$sanitize" -ne 0 ] || [ "$neon_status" -ne 0 ]; then
    echo "native_checks: sanitize.sh exited $sanitize, neon_check.sh $neon_status"
    exit 1
fi
echo "native_checks: both passed"
