#!/usr/bin/env bash
# libkvgguf's CUDA sources run on the CPU, with no GPU and no nvcc: native/cuda/*.cu and the check
# program native/cuda/tests/cuda_check.cu compiled by the host's C++ compiler against the CUDA
# emulator (native/cuda/emulator: the runtime, barriers, shuffles and WMMA on fibers), under
# -O2 (or AddressSanitizer and UndefinedBehaviorSanitizer: --asan), linked with the C library; then
# `cuda_check --quick --no-timing` runs as it runs on a GPU: the encoders byte for byte, every
# attention kernel (row-parallel, generic, tensor-core, cells, combine, finish) and the device
# store's hooks against the C reference, at the bounds a GPU run is held to.
#
# What it cannot show: speed, the device's own float rounding (its expf, its FMAs), and races
# that only another interleaving of lanes would expose (KVG_EMU_ORDER=reverse runs each warp's
# lanes last to first; this script runs the cases both ways).
#
#   bash scripts/cuda_emulate_check.sh          -O2, into build/cuda_emulate_check/ (about 30 s
#                                               to build and 2.5 minutes to run on 2 cores, the two
#                                               orders side by side)
#   bash scripts/cuda_emulate_check.sh --asan   under AddressSanitizer and UndefinedBehaviorSanitizer, into
#                                               build/cuda_emulate_check_asan/ (a kernel's read past its
#                                               memory, a shift too far; about 4x slower)
#
# Fails on a compile error, a mismatch, a sanitizer report or a kernel the emulator stops (a
# deadlock at a barrier, a warp operation after lanes returned, a launch the GPU would refuse).
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/cuda_emulate_check
san=()
opt=-O2
if [ "${1:-}" = --asan ]; then
    out=build/cuda_emulate_check_asan
    san=(-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
    opt=-O1
fi
mkdir -p "$out"
start=$(date +%s)
cxx=${CXX:-g++}
cc=${CC:-cc}
# As the library's build: no FMA contraction (the encoders must write the C reference's bytes).
common=("$opt" -g -ffp-contract=off "${san[@]}" -Wall -Wextra -Inative/include -Inative/src -Inative/cuda)
# The emulator's headers stand in for CUDA's; pragmas for nvcc and unsigned threadIdx comparisons
# are what the sources mean on a GPU.
cxxflags=(-std=c++17 -x c++ -Inative/cuda/emulator "${common[@]}" -Wno-unknown-pragmas -Wno-sign-compare)

. scripts/compile_jobs.sh
for src in native/cuda/*.cu native/cuda/tests/cuda_check.cu native/cuda/emulator/kvg_cuda_emulator.cpp; do
    compile "$out/$(basename "$src").o" "$cxx" "${cxxflags[@]}" -c "$src" -o "$out/$(basename "$src").o"
done
compile_c_sources "$out" "$cc" -std=c11 "${common[@]}"
if ! wait_compiles; then
    echo "cuda_emulate_check: compile FAILED"
    exit 1
fi
"$cxx" "${san[@]}" "${objs[@]}" -o "$out/cuda_check" -lpthread -lm
echo "cuda_emulate_check: built with $("$cxx" --version | head -1) in $(( $(date +%s) - start )) s"

export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
pids=()
for order in forward reverse; do  # side by side: one core each
    (
        t0=$(date +%s)
        KVG_EMU_ORDER=$order "$out/cuda_check" --quick --no-timing > "$out/$order.log" 2>&1 || {
            rc=$?
            cat "$out/$order.log"
            echo "cuda_emulate_check: the run with lanes in $order order FAILED (exit $rc)"
            exit 1
        }
        echo "cuda_emulate_check: lanes in $order order: $(tail -2 "$out/$order.log" | head -1) ($(( $(date +%s) - t0 )) s)"
    ) &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
[ "$status" -eq 0 ] && echo "cuda_emulate_check: passed in $(( $(date +%s) - start )) s"
exit "$status"
