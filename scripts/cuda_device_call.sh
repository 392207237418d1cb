#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool, ../shared/gpu-kit): scripts/cuda_check.sh, then
# compute-sanitizer's memcheck and racecheck on the check binary (--quick --no-timing, each with a
# time limit), with every log packed into one archive: the tool brings back only a few files.
#
#   OUT=/path bash scripts/cuda_device_call.sh [--full]
#
# Writes $OUT/cuda_device_call.tgz (cuda_check's report and logs, the sanitizers' logs) and prints
# the report's summary lines. KVGGUF_LLAMA_SDIST (the kit's trimmed sdist) is needed for --full;
# SANITIZE_TIMEOUT (default 90 s) bounds each sanitizer run (racecheck takes minutes in full).
# Exit status: cuda_check.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to a folder for the archive}
mkdir -p "$out"
work=$(mktemp -d)
t0=$(date +%s)
say() { echo "[t+$(( $(date +%s) - t0 ))s] $*"; }

OUT=$work/check bash scripts/cuda_check.sh "$@" > "$work/cuda_check.stdout" 2>&1
status=$?
say "cuda_check.sh exit $status"
grep -E "^build|^## |^attend|^  attend|^  (rotq|kivi)|^cuda_check|^MISMATCH|^RESULT|MISSING|FAILED" \
    "$work/check/cuda_check_report.txt" 2> /dev/null | head -80

bin=build/cuda-check/kvgguf_cuda_check
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "$status" -ne 77 ] && [ -x "$bin" ] && [ -x "$cs" ]; then
    for tool in memcheck racecheck; do
        timeout "${SANITIZE_TIMEOUT:-90}" "$cs" --tool "$tool" "$bin" --quick --no-timing > "$work/$tool.log" 2>&1
        say "compute-sanitizer --tool $tool: exit $? (124: stopped at ${SANITIZE_TIMEOUT:-90} s)"
        grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Program hit" "$work/$tool.log" | sort | uniq -c | head -5
    done
else
    say "sanitizers skipped (no GPU, no check binary, or no compute-sanitizer)"
fi

# The tool brings back files of at most 16 MiB: keep each log's first and last MiB, and the
# report beside the archive.
find "$work" -type f -size +2M | while read -r f; do
    { head -c 1M "$f"; printf '\n[... cut by cuda_device_call.sh ...]\n'; tail -c 1M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
done
cp "$work/check/cuda_check_report.txt" "$out/" 2> /dev/null
tar czf "$out/cuda_device_call.tgz" -C "$work" . && rm -rf "$work"
say "logs: $out/cuda_device_call.tgz"
exit "$status"
