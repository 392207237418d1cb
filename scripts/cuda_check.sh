#!/usr/bin/env bash
# The one script a GPU machine runs (issue "kvgguf on the GPU"): builds libkvgguf's CUDA kernels and
# native/cuda/tests/cuda_check.cu, runs the check (codes byte-equal to the C reference, decoded
# values bit-equal, refusals, fused attention within the CPU path's bounds, timings), and writes a
# report. Works without network. Only --full's last step needs Python (the GPU kit's wheels).
#
#   bash scripts/cuda_check.sh            the kernels and the check (about 1-2 minutes on 16 cores)
#   bash scripts/cuda_check.sh --full     then also the package's CUDA build: llama.cpp's CUDA backend
#                                         (-DGGML_CUDA=ON, which turns KVGGUF_CUDA on) from the local
#                                         llama-cpp-python sdist, installed into a scratch prefix and its
#                                         files listed, and the patched ggml-cuda's custom-op dispatch
#                                         checked against it (about 3-4 more minutes on 16 cores); then
#                                         the fused path end to end on it (scripts/gpu_path_check.py),
#                                         where the GPU kit lies beside KVGGUF_LLAMA_SDIST
#
# Environment:
#   OUT                   a folder for the report (cuda_check_report.txt) and the logs; default build/cuda_check
#   KVGGUF_CUDA_ARCH      CUDA architecture of the kernels (default 90, the H100; "native" works with CMake)
#   KVGGUF_LLAMA_SDIST    the llama-cpp-python sdist for --full (offline; the GPU kit's trimmed one), else
#                         ~/.cache/kvgguf/sdist/llama_cpp_python-0.3.36.tar.gz as cmake/llama_source.cmake finds it
#   CUDA_CHECK_TIMEOUT    seconds the check binary may run (default 300)
#   GPU_PATH_TIMEOUT      seconds scripts/gpu_path_check.py may run (default 300)
#   KVGGUF_CUDA_PREFIX    (--full) a CUDA package already built and installed (cmake --install --component
#                         kvgguf --prefix DIR, e.g. on a machine without a GPU): used instead of building
#                         one here, which saves the 3-4 minutes of llama.cpp's CUDA backend
#   KVGGUF_CUDA_CHECK_BIN the check program already built (scripts/cuda_compile_check.sh --build-only), instead
#                         of building it here
#   GPU_SPEED             (--full) the GPU speed table after the checks: shape:contexts[:caches] items, e.g.
#                         "llama-3.2-1b:8192 llama-3.2-3b:8192,32768" (benchmarks/live_cache.py --gpu, caches
#                         f16,q8_0,q4_0,tiered unless given); each shape model is written here first, from the
#                         kit's tokenizer, while the checks run
#   GPU_SPEED_TIMEOUT     seconds each configuration of the speed table may run (default 150)
#   SPEED_BY              seconds from the start by which the speed table must be done (default: no limit):
#                         a configuration still running then is stopped, its shape's table left as its log has it
#   GPU_PROFILE           (--full) shape:context:cache, e.g. "llama-3.2-3b:8192:tiered": that configuration
#                         once more after the speed table, under nsys where it is installed (kernels and CUDA
#                         API calls summed), else under torch's profiler (benchmarks/gpu_profile.py)
#   SANITIZE=1            also compute-sanitizer's memcheck and racecheck on the check (--quick --no-timing),
#                         each for at most SANITIZE_TIMEOUT seconds (default 90), while the package builds
#
# With --full the package builds in the background from the start, beside the kernels' checks: their
# timings are then taken on a busy host (the kernels' own times are the GPU's; launch overheads may grow).
#
# Exit status: 0 when every stage passed, 1 otherwise (77 when the machine has no CUDA device).
set -uo pipefail
cd "$(dirname "$0")/.."
full=0
[ "${1:-}" = --full ] && full=1
out=${OUT:-build/cuda_check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
report=$out/cuda_check_report.txt
arch=${KVGGUF_CUDA_ARCH:-90}
jobs=$(nproc 2> /dev/null || echo 4)
t_start=$(date +%s)
: > "$report"
say() { echo "$*" | tee -a "$report"; }
elapsed() { echo "$(( $(date +%s) - t_start )) s"; }

say "# kvgguf cuda_check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
say "commit: $(git rev-parse --short HEAD 2> /dev/null || echo unknown)$(git diff --quiet 2> /dev/null || echo ' (+ uncommitted changes)')"
say "host: $(uname -sm), $jobs cores"
if command -v nvidia-smi > /dev/null; then
    say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -4 | tr '\n' ';')"
else
    say "gpu: nvidia-smi not found"
fi
nvcc=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
say "nvcc: $("$nvcc" --version 2>&1 | tail -1)"
say "cmake: $(cmake --version 2> /dev/null | head -1 || echo none)"

# (--full) the package's CUDA build starts first, in the background: it is most of the time, and
# the kernels' checks (and the sanitizers) run on the GPU meanwhile
pbuild=build/cuda-package
pkg_pid=
if [ "$full" -eq 1 ] && [ -z "${KVGGUF_CUDA_PREFIX:-}" ]; then
    prefix=$PWD/build/cuda-package-install
    rm -rf "$prefix"
    pgen=()
    command -v ninja > /dev/null && pgen=(-G Ninja)
    t_pkg=$(date +%s)
    (cmake -S . -B "$pbuild" "${pgen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" \
            -DCMAKE_CUDA_COMPILER="$nvcc" > "$out/package-configure.log" 2>&1 &&
        cmake --build "$pbuild" -j "$jobs" > "$out/package-build.log" 2>&1 &&
        cmake --install "$pbuild" --component kvgguf --prefix "$prefix" > "$out/package-install.log" 2>&1) &
    pkg_pid=$!
fi

# The Python side (the fused path end to end, the speed table) runs with the GPU kit's pieces that
# KVGGUF_LLAMA_SDIST lies in (wheels, llama_cpp's bindings from the sdist, SmolLM2's tokenizer for the
# random-weight models) and the package's libraries from its install prefix.
kit=$(dirname "${KVGGUF_LLAMA_SDIST:-/nonexistent/x}")
site=
shapes_pid=
make_site() {  # fills $site once; false without a kit
    [ -n "$site" ] && return 0
    [ -d "$kit/whl" ] && [ -f "$kit/smollm2-tokenizer.pkl" ] || return 1
    site=$(mktemp -d)
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$kit"/whl/*.whl > "$out/site.log" 2>&1
    tar -xzf "$KVGGUF_LLAMA_SDIST" -C "$site" && cp -r "$site"/llama_cpp_python-*/llama_cpp "$site"/
}
with_env() {  # a command with kvgguf from this checkout on the installed package's libraries; PY_TIMEOUT: seconds
    local plib=$prefix/kvgguf/lib
    PYTHONPATH=$site:$PWD:$PWD/benchmarks KVGGUF_LLAMA_LIB_DIR=$plib KVGGUF_LIB=$plib/libkvgguf.so \
        KVGGUF_HEADER=$prefix/kvgguf/include/kvgguf.h KVGGUF_CUDA_HEADER=$prefix/kvgguf/include/kvg_cuda.h \
        KVGGUF_TOKENIZER_FROM=$kit/smollm2-tokenizer.pkl timeout "${PY_TIMEOUT:-0}" "$@"
}
py() { with_env python3 "$@"; }
start_shapes() {  # writes the speed table's shape models in the background (a minute or two each)
    [ -n "${GPU_SPEED:-}" ] && [ -z "$shapes_pid" ] && make_site || return 0
    local names
    names=$(for item in $GPU_SPEED; do echo "${item%%:*}"; done | sort -u | tr '\n' ' ')
    # shellcheck disable=SC2086
    (for n in $names; do
        PYTHONPATH=$site KVGGUF_TOKENIZER_FROM=$kit/smollm2-tokenizer.pkl python3 benchmarks/shapes.py "$n" &
    done; wait) > "$out/shapes.log" 2>&1 &
    shapes_pid=$!
}
# kvgguf's cache folder, as kvgguf.models.cache_dir() finds it: the shape models live there
export KVGGUF_CACHE_DIR=${KVGGUF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgguf}
[ "$full" -eq 1 ] && start_shapes

# ---- 1. build the kernels and the check ---------------------------------------------------------
status=0
bin=
build=build/cuda-check
if [ -n "${KVGGUF_CUDA_CHECK_BIN:-}" ] && [ -x "$KVGGUF_CUDA_CHECK_BIN" ]; then
    bin=$KVGGUF_CUDA_CHECK_BIN
    say "build: the check program prebuilt ($bin)"
elif command -v cmake > /dev/null; then
    gen=()
    command -v ninja > /dev/null && gen=(-G Ninja)
    t=$(date +%s)
    if cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DKVGGUF_BUILD_LLAMA=OFF -DKVGGUF_CUDA=ON \
            -DKVGGUF_CUDA_ARCHITECTURES="$arch" -DCMAKE_CUDA_COMPILER="$nvcc" > "$out/configure.log" 2>&1 &&
       cmake --build "$build" -j "$jobs" --target kvgguf kvgguf_cuda_check > "$out/build.log" 2>&1; then
        bin=$build/kvgguf_cuda_check
        say "build: CMake (-DKVGGUF_CUDA=ON, architectures $arch) in $(( $(date +%s) - t )) s"
    else
        say "build: CMake FAILED (configure.log, build.log below); trying plain nvcc"
        tail -30 "$out/configure.log" "$out/build.log" | tee -a "$report"
        status=1
    fi
fi
if [ -z "$bin" ]; then
    t=$(date +%s)
    arch_n=$arch
    [ "$arch_n" = native ] && arch_n=90
    if NVCC=$nvcc KVGGUF_CUDA_ARCH=$arch_n bash scripts/cuda_compile_check.sh --build-only > "$out/build-nvcc.log" 2>&1; then
        bin=build/cuda_compile_check/cuda_check
        say "build: plain nvcc (scripts/cuda_compile_check.sh --build-only, sm_$arch_n) in $(( $(date +%s) - t )) s"
    else
        say "build: nvcc FAILED"
        tail -40 "$out/build-nvcc.log" | tee -a "$report"
        say "RESULT: FAIL (no check binary) after $(elapsed)"
        exit 1
    fi
fi

# ---- 2. the check ---------------------------------------------------------------------------
run_check() {  # LOG ARGS...
    local log=$1
    shift
    timeout "${CUDA_CHECK_TIMEOUT:-300}" "$bin" "$@" > "$log" 2>&1
}
run_check "$out/emulate.log" --emulate
rc=$?
say ""
say "## cuda_check --emulate (the kernels' bodies on the host): exit $rc"
grep -E "^MISMATCH|^cuda_check|^PASS|^FAIL" "$out/emulate.log" | head -45 | tee -a "$report" > /dev/null
[ "$rc" -ne 0 ] && status=1

t=$(date +%s)
run_check "$out/gpu.log"
rc=$?
say ""
say "## cuda_check (GPU): exit $rc in $(( $(date +%s) - t )) s"
cat "$out/gpu.log" >> "$report"
tail -3 "$out/gpu.log"
if [ "$rc" -eq 77 ]; then
    say "RESULT: no CUDA device after $(elapsed)"
    [ -n "$pkg_pid" ] && kill "$pkg_pid" 2> /dev/null
    exit 77
elif [ "$rc" -eq 124 ]; then
    say "cuda_check: TIMED OUT after ${CUDA_CHECK_TIMEOUT:-300} s"
    status=1
elif [ "$rc" -ne 0 ]; then
    status=1
fi

# ---- 2b. (SANITIZE=1) compute-sanitizer's memcheck and racecheck on the check (--quick
# --no-timing), each for at most SANITIZE_TIMEOUT seconds, while the package builds
if [ "${SANITIZE:-0}" = 1 ]; then
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    if [ -x "$cs" ]; then
        for tool in memcheck racecheck; do
            t=$(date +%s)
            timeout "${SANITIZE_TIMEOUT:-90}" "$cs" --tool "$tool" "$bin" --quick --no-timing > "$out/$tool.log" 2>&1
            src=$?
            say ""
            say "## compute-sanitizer --tool $tool: exit $src in $(( $(date +%s) - t )) s (124: stopped at ${SANITIZE_TIMEOUT:-90} s)"
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Program hit" "$out/$tool.log" | sort | uniq -c | head -5 | tee -a "$report" > /dev/null
        done
    else
        say "## sanitizers: no compute-sanitizer"
    fi
fi

# ---- 3. (--full) the package's CUDA build ---------------------------------------------------
if [ "$full" -eq 1 ]; then
    say ""
    built=0
    if [ -n "${KVGGUF_CUDA_PREFIX:-}" ] && [ -f "$KVGGUF_CUDA_PREFIX/kvgguf/lib/libkvgguf.so" ]; then
        prefix=$(cd "$KVGGUF_CUDA_PREFIX" && pwd)
        say "## package: prebuilt, installed in $prefix (KVGGUF_CUDA_PREFIX; built elsewhere, not here)"
        built=1
    elif [ -n "$pkg_pid" ]; then
        if wait "$pkg_pid"; then
            say "## package build (-DGGML_CUDA=ON, CMAKE_CUDA_ARCHITECTURES=$arch): built and installed in $(( $(date +%s) - t_pkg )) s (beside the checks above)"
            grep -E "kvgguf: (installs|CUDA kernels)" "$out/package-configure.log" | tee -a "$report" > /dev/null
            built=1
        else
            say "## package build: FAILED after $(( $(date +%s) - t_pkg )) s"
            tail -30 "$out/package-configure.log" "$out/package-build.log" 2> /dev/null | tee -a "$report"
            status=1
        fi
    else
        say "## package build: KVGGUF_CUDA_PREFIX=${KVGGUF_CUDA_PREFIX:-} holds no kvgguf/lib/libkvgguf.so"
        status=1
    fi
    if [ "$built" -eq 1 ]; then
        (cd "$prefix" && find . -type f | sort | sed 's/^/  /') | tee -a "$report" > /dev/null
        lib=$prefix/kvgguf/lib/libkvgguf.so
        n_api=$(nm -D --defined-only "$lib" 2> /dev/null | grep -c ' kvg_cuda_' || true)
        say "libkvgguf.so exports $n_api kvg_cuda_* functions"
        for need in libggml-cuda.so kvg_cuda.h; do
            if ! find "$prefix" -name "$need*" | grep -q .; then
                say "package: $need MISSING from the install"
                status=1
            fi
        done
        [ "$n_api" -gt 0 ] || status=1
        # the patched ggml-cuda's custom-op dispatch (patches/0006), against the libraries installed
        inc=$(find "$pbuild/llama-src" -maxdepth 6 -type d -path '*vendor/llama.cpp/ggml/include' 2> /dev/null | head -1)
        if [ -z "$inc" ] && [ -f "$KVGGUF_LLAMA_SDIST" ]; then  # a prebuilt package: the headers from the sdist
            tar -xzf "$KVGGUF_LLAMA_SDIST" -C "$out" --wildcards '*/vendor/llama.cpp/ggml/include/*'
            inc=$(find "$out" -maxdepth 7 -type d -path '*vendor/llama.cpp/ggml/include' | head -1)
        fi
        check_bin=$out/ggml_custom_op_check
        carch=native
        [[ $arch =~ ^[0-9]+$ ]] && carch=sm_$arch
        if "$nvcc" -std=c++17 -arch="$carch" -I"$inc" native/cuda/tests/ggml_custom_op_check.cu \
                -L"$prefix/kvgguf/lib" -lggml -lggml-base -Xlinker -rpath="$prefix/kvgguf/lib" -o "$check_bin" \
                > "$out/custom-op-build.log" 2>&1; then
            timeout 120 "$check_bin" > "$out/custom-op.log" 2>&1
            crc=$?
            say "## ggml-cuda custom-op dispatch (native/cuda/tests/ggml_custom_op_check.cu): exit $crc"
            tee -a "$report" < "$out/custom-op.log" > /dev/null
            [ "$crc" -eq 0 ] || status=1
        else
            say "## ggml-cuda custom-op dispatch: the check did not build"
            tail -20 "$out/custom-op-build.log" | tee -a "$report"
            status=1
        fi
        # the fused path end to end (scripts/gpu_path_check.py) on the package just installed
        if make_site; then
            t=$(date +%s)
            PY_TIMEOUT=${GPU_PATH_TIMEOUT:-300} py -X faulthandler -u scripts/gpu_path_check.py --tokenizer "$kit/smollm2-tokenizer.pkl" >> "$out/gpu-path.log" 2>&1
            grc=$?
            say "## the fused path on the GPU (scripts/gpu_path_check.py): exit $grc in $(( $(date +%s) - t )) s"
            tail -30 "$out/gpu-path.log" | tee -a "$report" > /dev/null
            if [ "$grc" -ge 128 ] && [ "$grc" -ne 137 ] && command -v gdb > /dev/null; then
                # a native crash: again under gdb, for the native stack (faulthandler gives Python's)
                PY_TIMEOUT=120 with_env gdb -q -batch -ex run -ex "thread apply all bt 25" --args \
                    python3 scripts/gpu_path_check.py --tokenizer "$kit/smollm2-tokenizer.pkl" > "$out/gpu-path-gdb.log" 2>&1
                say "  under gdb: $out/gpu-path-gdb.log"
                grep -E "^#[0-9]+ " "$out/gpu-path-gdb.log" | head -25 | tee -a "$report" > /dev/null
            fi
            [ "$grc" -eq 0 ] || status=1
        else
            say "## the fused path on the GPU: skipped (no GPU kit with whl/ and smollm2-tokenizer.pkl beside KVGGUF_LLAMA_SDIST)"
        fi
        # ---- 4. (--full, GPU_SPEED) the speed table: stock f16/q8_0/q4_0 against kvgguf, every
        # layer on the GPU, each configuration in its own process (benchmarks/live_cache.py --gpu)
        if [ -n "${GPU_SPEED:-}" ] && [ -n "$site" ]; then
            [ -n "$shapes_pid" ] && wait "$shapes_pid"
            tail -5 "$out/shapes.log" >> "$report"
            for item in $GPU_SPEED; do
                IFS=: read -r shape contexts caches <<< "$item"
                t=$(date +%s)
                left=$(( ${SPEED_BY:-1000000} - (t - t_start) ))
                if [ "$left" -lt 20 ]; then
                    say ""
                    say "## speed, $shape at $contexts: not run (SPEED_BY=${SPEED_BY:-} s reached)"
                    status=1
                    continue
                fi
                PY_TIMEOUT=$left py benchmarks/live_cache.py --gpu --text random --model "$shape" --contexts "$contexts" \
                    --caches "${caches:-f16,q8_0,q4_0,tiered}" --decode 64 --batch 512 --threads "$jobs" --phases \
                    --keep-going --run-timeout "${GPU_SPEED_TIMEOUT:-150}" --out "$out/speed-$shape" \
                    > "$out/speed-$shape.log" 2>&1
                src=$?
                say ""
                say "## speed, $shape at $contexts (benchmarks/live_cache.py --gpu): exit $src in $(( $(date +%s) - t )) s"
                if [ -f "$out/speed-$shape.md" ]; then
                    tee -a "$report" < "$out/speed-$shape.md" > /dev/null
                    # each row's phases and kvgguf's op calls on the GPU (--phases), after the row
                    grep -B1 -E "^  (phases|kvgguf's ops)" "$out/speed-$shape.log" | grep -v "^--" >> "$report"
                else
                    tail -25 "$out/speed-$shape.log" | tee -a "$report" > /dev/null
                fi
                [ "$src" -eq 0 ] || status=1
            done
        fi
        # ---- 5. (--full, GPU_PROFILE) where one configuration's time goes, kernel by kernel
        left=$(( ${SPEED_BY:-1000000} + 60 - ($(date +%s) - t_start) ))  # a minute past SPEED_BY at most
        if [ -n "${GPU_PROFILE:-}" ] && [ -n "$site" ] && [ "$left" -lt 30 ]; then
            say ""
            say "## profile of $GPU_PROFILE: not run (SPEED_BY=${SPEED_BY:-} s reached)"
        elif [ -n "${GPU_PROFILE:-}" ] && [ -n "$site" ]; then
            IFS=: read -r pshape pctx pcache <<< "$GPU_PROFILE"
            t=$(date +%s)
            ptime=$(( left < ${GPU_SPEED_TIMEOUT:-150} ? left : ${GPU_SPEED_TIMEOUT:-150} ))
            nsys_bin=$(command -v nsys || ls /usr/local/cuda*/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2> /dev/null | head -1)
            one=(benchmarks/live_cache.py --one --gpu --text random --model "$pshape" --contexts "$pctx"
                 --caches "${pcache:-tiered}" --decode 64 --batch 512 --threads "$jobs" --phases)
            if [ -n "$nsys_bin" ]; then
                PY_TIMEOUT=$ptime with_env "$nsys_bin" profile --trace=cuda,osrt --sample=none \
                    --cpuctxsw=none --force-overwrite=true -o "$out/profile" python3 "${one[@]}" > "$out/profile.log" 2>&1
                prc=$?
                say ""
                say "## profile of $GPU_PROFILE (nsys, $nsys_bin): exit $prc in $(( $(date +%s) - t )) s"
                for r in cuda_gpu_kern_sum cuda_api_sum gpukernsum cudaapisum; do
                    "$nsys_bin" stats --report "$r" --format csv --output "$out/profile" "$out/profile.nsys-rep" \
                        >> "$out/profile.log" 2>&1 || continue
                done
                for f in "$out"/profile_*.csv; do
                    [ -f "$f" ] || continue
                    say "### $(basename "$f")"
                    head -30 "$f" | cut -c1-220 | tee -a "$report" > /dev/null
                done
            else
                PY_TIMEOUT=$ptime py benchmarks/gpu_profile.py --model "$pshape" --context "$pctx" \
                    --cache "${pcache:-tiered}" --threads "$jobs" > "$out/profile.log" 2>&1
                prc=$?
                say ""
                say "## profile of $GPU_PROFILE (no nsys; torch's profiler, benchmarks/gpu_profile.py): exit $prc in $(( $(date +%s) - t )) s"
                head -45 "$out/profile.log" | cut -c1-220 | tee -a "$report" > /dev/null
            fi
            tail -3 "$out/profile.log" | cut -c1-1500 >> "$report"
        fi
    fi
    [ -n "$site" ] && rm -rf "$site"
fi

say ""
if [ "$status" -eq 0 ]; then
    say "RESULT: PASS after $(elapsed)"
else
    say "RESULT: FAIL after $(elapsed)"
fi
echo "report: $report"
exit "$status"
