#!/usr/bin/env bash
# Coverage-guided fuzzing of what kvgguf reads from outside: every codec's decoder (kvg_decode),
# the store's kvg_store_append_encoded and the reads over what it links (libFuzzer targets in
# native/fuzz, linked with libkvgguf's sources built with the same ASan+UBSan+coverage flags), and
# the .kvz session parser (an atheris target). Each target starts from inputs made here of real
# encoded blocks and sessions and runs a fixed number of inputs; a crash, a sanitizer report, a
# broken promise of kvgguf.h or an exception other than SessionError fails the run, and the
# input that did it is left in build/fuzz/crashes.
#
#   bash scripts/fuzz.sh                                    # 4000 inputs per target (CI)
#   bash scripts/fuzz.sh --runs 1000000 --fresh --json out.jsonl
#   bash scripts/fuzz.sh --targets "decode store"           # the native targets only
#   bash scripts/fuzz.sh --work DIR                         # starting inputs, corpus, logs and crashes in DIR
#
# Needs clang with libFuzzer (scripts/system_packages.sh installs clang-14 and libclang-rt-14-dev)
# and, for the session target, atheris in the Python
# that runs the tests (the [test] extra; $PYTHON overrides which Python). The targets are built
# in build/fuzz; the corpus grows in build/fuzz/corpus between runs; --fresh starts from the starting inputs.
# One fuzzing process at a time: no -jobs/-workers, which would fork more.
set -euo pipefail
cd "$(dirname "$0")/.."

runs=${KVG_FUZZ_RUNS:-4000}
targets="decode store session"
fresh=0
json=""
work=build/fuzz
seed=1
max_len=16384
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs=$2; shift 2 ;;
        --targets) targets=$2; shift 2 ;;
        --fresh) fresh=1; shift ;;
        --json) json=$2; shift 2 ;;
        --seed) seed=$2; shift 2 ;;
        --work) work=$2; shift 2 ;;
        *) echo "fuzz: unknown argument $1 (see the top of $0)"; exit 2 ;;
    esac
done

out=build/fuzz
mkdir -p "$out/obj" "$out/logs" "$work/start" "$work/corpus" "$work/crashes" "$work/logs"
py=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

native=0
for t in $targets; do case "$t" in session) ;; *) native=1 ;; esac; done

build_native() {
    cc_fuzz=$(bash scripts/clang_fuzzer.sh) || {
        echo "fuzz: no clang with libFuzzer (bash scripts/system_packages.sh installs clang-14 and libclang-rt-14-dev)"
        exit 1
    }

    # ---- build: the library's sources and the targets, all instrumented ------------------------

    flags="-g -O2 -std=c11 -fno-omit-frame-pointer -ffp-contract=off -fno-sanitize-recover=all -Inative/include -Inative/src"
    lib_flags="$flags -fsanitize=fuzzer-no-link,address,undefined"
    newest_header=$(ls -t native/include/*.h native/src/*.h native/src/*/*.h native/src/arch/*/*.h native/fuzz/*.h | head -n 1)
    objs=()
    for src in native/src/*/*.c native/src/arch/*/*.c; do
        obj="$out/obj/$(basename "${src%.c}").o"
        objs+=("$obj")
        [ "$obj" -nt "$src" ] && [ "$obj" -nt "$newest_header" ] && continue
        extra=""
        case "$src" in */arch/x86/*) extra="-mavx2 -mfma -mf16c" ;; esac
        if ! "$cc_fuzz" $lib_flags $extra -c "$src" -o "$obj" 2> "$out/logs/build.log"; then
            # clang 14 rejects __builtin_cpu_supports("f16c"); cpu.c only asks the CPU what it has
            # and reads no input, so it may go uninstrumented, built by the C compiler.
            if [ "$(basename "$src")" = cpu.c ]; then
                ${CC:-cc} -O2 -std=c11 -Inative/include -Inative/src -c "$src" -o "$obj"
            else
                cat "$out/logs/build.log"; exit 1
            fi
        fi
    done
    for t in decode store; do
        "$cc_fuzz" $flags -fsanitize=fuzzer,address,undefined "native/fuzz/fuzz_$t.c" "${objs[@]}" -lm -lpthread \
            -o "$out/fuzz_$t"
    done
    "$cc_fuzz" $flags -fsanitize=address,undefined native/fuzz/fuzz_corpus.c "${objs[@]}" -lm -lpthread -o "$out/fuzz_corpus"
}

if [ "$native" = 1 ]; then
    build_native
fi

# ---- starting inputs, made fresh from the codecs as they are-------------------------------------

rm -rf "$work/start/decode" "$work/start/store" "$work/start/session"
if [ "$native" = 1 ]; then
    mkdir -p "$work/start/decode" "$work/start/store"
    ASAN_OPTIONS=detect_leaks=1 "$out/fuzz_corpus" "$work/start/decode" "$work/start/store"
fi
if [[ " $targets " == *" session "* ]]; then
    "$py" -c "import atheris" 2> /dev/null \
        || { echo "fuzz: atheris is not installed in $py (pip install '.[test]', or atheris alone)"; exit 1; }
    "$py" native/fuzz/fuzz_session.py --start "$work/start/session" 2> "$work/logs/session-start.log" \
        || { cat "$work/logs/session-start.log"; exit 1; }
fi

# ---- run ----------------------------------------------------------------------------------

failed=0
for t in $targets; do
    corpus="$work/corpus/$t"
    [ "$fresh" = 1 ] && rm -rf "$corpus"
    mkdir -p "$corpus"
    rm -f "$work/crashes/$t-"*
    if [ "$t" = session ]; then
        cmd=("$py" native/fuzz/fuzz_session.py)
    else
        cmd=("$out/fuzz_$t")
    fi
    log="$work/logs/$t.log"
    start=$(date +%s.%N)
    rc=0
    "${cmd[@]}" -runs="$runs" -seed="$seed" -max_len="$max_len" -rss_limit_mb=2048 -timeout=30 \
        -print_final_stats=1 -artifact_prefix="$work/crashes/$t-" "$corpus" "$work/start/$t" > "$log" 2>&1 || rc=$?
    secs=$(awk "BEGIN { print $(date +%s.%N) - $start }")
    inputs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    crashes=$(find "$work/crashes" -name "$t-*" | wc -l)
    [ "$rc" != 0 ] && [ "$crashes" = 0 ] && crashes=1  # died without leaving an input: still a failure
    files=$(find "$corpus" -type f | wc -l)
    bytes=$(du -sb "$corpus" | cut -f1)
    cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -n 1 | sed 's/cov: \([0-9]*\) ft: \([0-9]*\)/\1 \2/' || true)
    if [ -z "$cov" ] && [ "$rc" = 0 ]; then
        # libFuzzer saw no coverage at all: the target was not instrumented. For the session target
        # that is an editable install (pip install -e .), whose import hook atheris cannot see through.
        echo "fuzz: $t ran without coverage (not instrumented); the session target needs a regular install (pip install .)"
        failed=1
    fi
    printf 'fuzz: %-8s %9s inputs, %s crashes, %7.1f s, corpus %s files (%s bytes), cov/ft %s\n' \
        "$t" "${inputs:-0}" "$crashes" "$secs" "$files" "$bytes" "${cov:-? ?}"
    if [ -n "$json" ]; then
        printf '{"target": "%s", "inputs": %s, "crashes": %s, "seconds": %.1f, "corpus_files": %s, "corpus_bytes": %s, "cov": %s, "features": %s, "exit_status": %s}\n' \
            "$t" "${inputs:-0}" "$crashes" "$secs" "$files" "$bytes" "$(echo "${cov:-0 0}" | cut -d' ' -f1)" \
            "$(echo "${cov:-0 0}" | cut -d' ' -f2)" "$rc" >> "$json"
    fi
    if [ "$crashes" != 0 ]; then
        failed=1
        echo "fuzz: $t failed (exit $rc); its report (full log: $log):"
        grep -v '^#\|^INFO\|^"\|^WARNING' "$log" | tail -n 60
        find "$work/crashes" -name "$t-*" | sed 's/^/fuzz: input: /'
    fi
done
exit $failed
