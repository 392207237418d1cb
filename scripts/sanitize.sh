#!/usr/bin/env bash
# libkvgguf built with AddressSanitizer and UndefinedBehaviorSanitizer, and the tests that drive
# it (tests/sanitized.txt) run against that build: codecs, store and attention kernels directly,
# then the fused attention op and its mass counters inside llama.cpp's decode (SmolLM2 and
# Gemma-3). Then a ThreadSanitizer build under the store's tests of its retier on threads.
#
#   bash scripts/sanitize.sh            # after the README's test install (.venv, cmake from [test])
#
# Python itself is not instrumented, so the ASan runtime is preloaded and leak checking is off
# (the interpreter keeps memory until exit by design); any error report aborts the run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build/sanitize
start=$(date +%s)
cmake=$( [ -x .venv/bin/cmake ] && echo .venv/bin/cmake || echo cmake )
mkdir -p build
"$cmake" -S . -B "$build" -DKVGGUF_BUILD_LLAMA=OFF -DKVGGUF_SANITIZE=address,undefined \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build.log" 2>&1 || { cat "$build.log"; exit 1; }
"$cmake" --build "$build" --target kvgguf -j 2 >> "$build.log" 2>&1 || { cat "$build.log"; exit 1; }
lib=$(find "$build" -maxdepth 1 -name 'libkvgguf.so' | head -n 1)
mapfile -t sanitized < <(grep -v '^#' tests/sanitized.txt)  # (.ci/run's pytest leaves these to this run)
asan=$(${CC:-cc} -print-file-name=libasan.so)
ubsan=$(${CC:-cc} -print-file-name=libubsan.so)
nm -D "$lib" | grep __asan_report > /dev/null || { echo "sanitize: $lib is not instrumented"; exit 1; }
echo "sanitize: $lib (preloading $asan)"
KVGGUF_LIB="$lib" LD_PRELOAD="$asan $ubsan" \
    ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:halt_on_error=1 \
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    .venv/bin/pytest -q -p no:cacheprovider "${sanitized[@]}" "$@"

# ThreadSanitizer: the store's retier on threads (kvg_store_set_threads), where libkvgguf starts
# threads of its own. (--capture=sys: a report goes to fd 2, which pytest would otherwise hold
# until the test ends, and the report ends the process first.)
tbuild=build/sanitize-thread
"$cmake" -S . -B "$tbuild" -DKVGGUF_BUILD_LLAMA=OFF -DKVGGUF_SANITIZE=thread \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$tbuild.log" 2>&1 || { cat "$tbuild.log"; exit 1; }
"$cmake" --build "$tbuild" --target kvgguf -j 2 >> "$tbuild.log" 2>&1 || { cat "$tbuild.log"; exit 1; }
tlib=$(find "$tbuild" -maxdepth 1 -name 'libkvgguf.so' | head -n 1)
tsan=$(${CC:-cc} -print-file-name=libtsan.so)
nm -D "$tlib" | grep __tsan_func_entry > /dev/null || { echo "sanitize: $tlib is not instrumented"; exit 1; }
echo "sanitize: $tlib (preloading $tsan)"
KVGGUF_LIB="$tlib" LD_PRELOAD="$tsan" TSAN_OPTIONS=halt_on_error=1:report_signal_unsafe=0 \
    .venv/bin/pytest -q -p no:cacheprovider --capture=sys tests/unit/test_store.py tests/unit/test_transactions.py -k threads
echo "sanitize: clean in $(( $(date +%s) - start )) s"
