#!/usr/bin/env bash
# libkvgguf's NEON kernels checked against the scalar oracle without an ARM machine: the
# library and native/tests/simd_check.c are cross-compiled for AArch64 (statically, so
# qemu-user needs no sysroot) and run under qemu-aarch64. simd_check is told to expect "neon",
# so a build whose NEON kernels are missing fails instead of comparing scalar with scalar.
# The same program is first built for this machine, to check its AVX2 kernels (or say that
# there are none).
#
#   bash scripts/neon_check.sh            # skips the NEON run, saying so, without its packages
#
# The NEON run needs gcc-aarch64-linux-gnu, libc6-dev-arm64-cross and qemu-user
# (scripts/system_packages.sh installs them). Under qemu it takes 2-3 minutes of one core; the
# native run about 10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
out=build/neon_check
mkdir -p "$out"
# As CMakeLists.txt builds the library: no FMA contraction, or SIMD and scalar would part ways.
cflags=(-std=c11 -O3 -ffp-contract=off -Wall -Wextra -Inative/include -Inative/src)
sources=(native/src/*/*.c native/src/arch/*/*.c native/tests/simd_check.c)

cross=1
if ! command -v aarch64-linux-gnu-gcc > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
    cross=0
fi

# Native: the AVX2 files alone get -mavx2 -mfma -mf16c, as CMakeLists.txt gives them.
if [ "$(uname -m)" = x86_64 ]; then
    start=$(date +%s)
    objs=()
    for src in "${sources[@]}"; do
        extra=()
        case "$src" in */arch/x86/*) extra=(-mavx2 -mfma -mf16c) ;; esac
        obj="$out/x86_64-$(basename "$src" .c).o"
        ${CC:-cc} "${cflags[@]}" "${extra[@]}" -c "$src" -o "$obj"
        objs+=("$obj")
    done
    ${CC:-cc} "${objs[@]}" -o "$out/simd_check-x86_64" -lm -pthread
    "$out/simd_check-x86_64"
    echo "neon_check: native run in $(( $(date +%s) - start )) s"
fi

if [ "$cross" = 0 ]; then
    echo "neon_check: NEON run skipped, no aarch64-linux-gnu-gcc or qemu-aarch64" \
        "(bash scripts/system_packages.sh, or apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)"
    exit 0
fi
start=$(date +%s)
aarch64-linux-gnu-gcc "${cflags[@]}" "${sources[@]}" -o "$out/simd_check-aarch64" -static -lm -pthread
echo "neon_check: cross-compiled in $(( $(date +%s) - start )) s"
start=$(date +%s)
qemu-aarch64 "$out/simd_check-aarch64" neon
echo "neon_check: NEON under qemu-aarch64 in $(( $(date +%s) - start )) s"
