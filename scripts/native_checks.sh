#!/usr/bin/env bash
# The native library's own checks after the tests, side by side: scripts/sanitize.sh (the tests
# that drive libkvgguf, against an ASan+UBSan build), scripts/neon_check.sh (the NEON kernels
# under qemu, one core for about two minutes), scripts/cuda_compile_check.sh (libkvgguf's CUDA
# sources compiled with nvcc and their kernel bodies checked on the host against the C reference,
# about 2 minutes; said and skipped where no nvcc is found) and scripts/cuda_emulate_check.sh (the
# same sources run on the CPU through native/cuda/emulator, every kernel against the C reference:
# no nvcc needed). Each mostly keeps one core busy. The sanitizer run prints as it goes; the
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
emulate_log=build/cuda_emulate_check.log
bash scripts/cuda_emulate_check.sh > "$emulate_log" 2>&1 &
emulate=$!
bash scripts/sanitize.sh
sanitize=$?
wait "$neon"
neon_status=$?
cuda_status=0
if [ -n "$cuda" ]; then
    wait "$cuda"
    cuda_status=$?
fi
wait "$emulate"
emulate_status=$?
cat "$log" "$cuda_log" "$emulate_log"
if [ "$sanitize" -ne 0 ] || [ "$neon_status" -ne 0 ] || [ "$cuda_status" -ne 0 ] || [ "$emulate_status" -ne 0 ]; then
    echo "native_checks: sanitize.sh exited $sanitize, neon_check.sh $neon_status, cuda_compile_check.sh $cuda_status," \
        "cuda_emulate_check.sh $emulate_status"
    exit 1
fi
echo "native_checks: all passed"
