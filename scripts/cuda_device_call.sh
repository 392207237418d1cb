#!/usr/bin/env bash
# One call on a lent GPU machine (its kit made by scripts/gpu_kit.sh): scripts/cuda_check.sh with
# compute-sanitizer's memcheck and racecheck on the check binary (SANITIZE=1, unless set to 0), with
# every log packed into one archive: the tool brings back only a few files.
#
#   OUT=/path bash scripts/cuda_device_call.sh [--full]
#
# Writes $OUT/cuda_device_call.tgz (cuda_check's report and logs, the sanitizers' logs) and prints
# the report's summary lines. KVGGUF_LLAMA_SDIST (the kit's trimmed sdist) is needed for --full; the
# other settings of cuda_check.sh (KVGGUF_CUDA_PREFIX, KVGGUF_CUDA_CHECK_BIN, GPU_SPEED, GPU_PROFILE) pass through;
# SANITIZE_TIMEOUT (default 90 s) bounds each sanitizer run (racecheck takes minutes in full).
# Exit status: cuda_check.sh's.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:?set OUT to a folder for the archive}
mkdir -p "$out"
work=$(mktemp -d)
t0=$(date +%s)
say() { echo "[t+$(( $(date +%s) - t0 ))s] $*"; }

OUT=$work/check SANITIZE=${SANITIZE:-1} bash scripts/cuda_check.sh "$@" > "$work/cuda_check.stdout" 2>&1
status=$?
say "cuda_check.sh exit $status"
grep -E "^build|^## |^attend|^  attend|^  (rotq|kivi)|^cuda_check|^MISMATCH|^RESULT|MISSING|FAILED|^\| [0-9]+K|^kvgguf |^llama.cpp |^  (the GPU|codes)|^gpu_path|^  kvgguf's ops" \
    "$work/check/cuda_check_report.txt" 2> /dev/null | head -120

# The tool brings back files of at most 16 MiB: keep each log's first and last MiB, and the
# report beside the archive.
find "$work" -type f -size +2M | while read -r f; do
    { head -c 1M "$f"; printf '\n[... cut by cuda_device_call.sh ...]\n'; tail -c 1M "$f"; } > "$f.cut" && mv "$f.cut" "$f"
done
cp "$work/check/cuda_check_report.txt" "$out/" 2> /dev/null
tar czf "$out/cuda_device_call.tgz" --exclude="llama_cpp_python-*" --exclude=ggml_custom_op_check \
    --exclude="*.nsys-rep" --exclude="*.sqlite" -C "$work" . && rm -rf "$work"
say "logs: $out/cuda_device_call.tgz"
exit "$status"
