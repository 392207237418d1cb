#!/usr/bin/env bash
# libkvgguf's CUDA sources compiled without a GPU, for CI: native/cuda/*.cu with nvcc (every nvcc
# warning an error), the library's C sources with cc as CMakeLists.txt compiles them, linked with
# native/cuda/tests/cuda_check.cu into build/cuda_compile_check/cuda_check, which then runs twice:
#   - `cuda_check --emulate`: the kernels' bodies on the host against the scalar C reference (must pass);
#   - `cuda_check`: the GPU run, which says "no CUDA device" and exits 77 on a machine without one
#     (accepted here; on a machine with a GPU it must pass).
# A compile error, an emulation mismatch or a failed GPU run fails the script.
#
#   bash scripts/cuda_compile_check.sh               compile, link, run both
#   bash scripts/cuda_compile_check.sh --build-only  compile and link only (scripts/cuda_check.sh without CMake)
#
# nvcc: $NVCC, else nvcc on PATH, else /usr/local/cuda/bin/nvcc, else the PyPI wheels'
# (pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl: site-packages/nvidia/cu13/bin/nvcc).
# KVGGUF_CUDA_ARCH (default 90, the H100): the one architecture compiled (sm_XX and its PTX).
# About 2 minutes on 2 cores (nvcc 13.0), most of it the row-parallel attention kernels (27 a head
# dim, fully unrolled): the .cu files, the C sources and the check program compile side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
[ "${1:-}" = --build-only ] && build_only=1
out=build/cuda_compile_check
mkdir -p "$out"
start=$(date +%s)

nvcc=${NVCC:-}
if [ -z "$nvcc" ]; then
    if command -v nvcc > /dev/null; then
        nvcc=$(command -v nvcc)
    elif [ -x /usr/local/cuda/bin/nvcc ]; then
        nvcc=/usr/local/cuda/bin/nvcc
    else
        nvcc=$(python3 -c 'import nvidia, os; print(os.path.join(nvidia.__path__[0], "cu13", "bin", "nvcc"))' 2> /dev/null || true)
    fi
fi
if [ -z "$nvcc" ] || [ ! -x "$nvcc" ]; then
    echo "cuda_compile_check: no nvcc (set NVCC, or pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl)"
    exit 1
fi
arch=${KVGGUF_CUDA_ARCH:-90}
echo "cuda_compile_check: $("$nvcc" --version | tail -1), sm_$arch"

# As CMakeLists.txt compiles them (KVGGUF_CUDA=ON): no FMA contraction anywhere.
cflags=(-std=c11 -O3 -ffp-contract=off -Wall -Wextra -Inative/include -Inative/src)
nvflags=(-std=c++17 -O3 -fmad=false -ftz=false "-gencode=arch=compute_$arch,code=[sm_$arch,compute_$arch]"
         -Xcompiler -ffp-contract=off,-fvisibility=hidden,-Wall,-Wextra --Werror all-warnings -Inative/include -Inative/src -Inative/cuda)

. scripts/compile_jobs.sh
for src in native/cuda/*.cu native/cuda/tests/cuda_check.cu; do
    compile "$out/$(basename "$src" .cu).cu.o" "$nvcc" "${nvflags[@]}" -c "$src" -o "$out/$(basename "$src" .cu).cu.o"
done
compile_c_sources "$out" "${CC:-cc}" "${cflags[@]}"
if ! wait_compiles; then
    echo "cuda_compile_check: compile FAILED"
    exit 1
fi
"$nvcc" "-gencode=arch=compute_$arch,code=[sm_$arch,compute_$arch]" "${objs[@]}" -o "$out/cuda_check" -lpthread -lm
echo "cuda_compile_check: compiled and linked in $(( $(date +%s) - start )) s"
[ "$build_only" -eq 1 ] && exit 0

# The device store's bookkeeping (kvg_cuda_store.c) on the host, with stand-ins for the device calls.
host_objs=()
for src in native/src/*/*.c native/src/arch/*/*.c native/cuda/kvg_cuda_store.c; do
    host_objs+=("$out/$(basename "$src" .c).o")
done
"${CC:-cc}" "${cflags[@]}" -Inative/cuda native/cuda/tests/store_sync_check.c "${host_objs[@]}" -o "$out/store_sync_check" -lpthread -lm &&
    "$out/store_sync_check" > "$out/store_sync.log" 2>&1 || { cat "$out/store_sync.log"; echo "cuda_compile_check: store_sync_check FAILED"; exit 1; }
tail -2 "$out/store_sync.log"

"$out/cuda_check" --emulate --quick > "$out/emulate.log" 2>&1 || { cat "$out/emulate.log"; echo "cuda_compile_check: emulation FAILED"; exit 1; }
tail -2 "$out/emulate.log"
set +e
"$out/cuda_check" --quick --no-timing > "$out/gpu.log" 2>&1
rc=$?
set -e
if [ "$rc" -eq 77 ]; then
    cat "$out/gpu.log"
    echo "cuda_compile_check: no GPU here, the GPU run was skipped (exit 77)"
elif [ "$rc" -ne 0 ]; then
    cat "$out/gpu.log"
    echo "cuda_compile_check: the GPU run FAILED (exit $rc)"
    exit 1
else
    tail -2 "$out/gpu.log"
fi
echo "cuda_compile_check: passed in $(( $(date +%s) - start )) s"
