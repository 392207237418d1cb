#!/usr/bin/env bash
# The native library's own checks after the tests, side by side: scripts/sanitize.sh (the tests
# that drive libkvgguf, against an ASan+UBSan build), scripts/neon_check.sh (the NEON kernels
# under qemu, one core for about two minutes) and scripts/cuda_compile_check.sh (libkvgguf's CUDA
# sources compiled with nvcc and their kernel bodies checked on the host against the C reference,
# 20-35 s; said and skipped where no nvcc is found). Each mostly keeps one core busy, so on two
# cores they take about as long as the longest one. The sanitizer run prints as it goes; the
# others' output follows it. Fails if any fails.
#
#   bash scripts/native_checks.sh            # after the README's test install
set -uo pipefail
cd "$(dirname "$0")/.."
mkdir -p build
log=build/neon_check.log
bash scripts/neon_check.sh > "$log" 2>&1 &
neon=$!
cuda_log=build/cuda_compile_check.log
if command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || [ -n "${NVCC:-}" ]; then
    bash scripts/cuda_compile_check.sh > "$cuda_log" 2>&1 &
    cuda=$!
else
    echo "cuda_compile_check: skipped, no nvcc on this machine (pip install nvidia-cuda-nvcc, or set NVCC)" > "$cuda_log"
    cuda=
fi
bash scripts/sanitize.sh
sanitize=$?
wait "$neon"
neon_status=$?
cuda_status=0
if [ -n "$cuda" ]; then
    wait "$cuda"
    cuda_status=$?
fi
cat "$log" "$cuda_log"
if [ "$sanitize" -ne 0 ] || [ "$neon_status" -ne 0 ] || [ "$cuda_status" -ne 0 ]; then
    echo "native_checks: sanitize.sh exited $sanitize, neon_check.sh $neon_status, cuda_compile_check.sh $cuda_status"
    exit 1
fi
echo "native_checks: all passed"
