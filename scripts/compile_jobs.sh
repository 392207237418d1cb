# compile_jobs.sh: sourced by the scripts that compile libkvgguf file by file, side by side
# (cuda_compile_check.sh, cuda_emulate_check.sh), from the repository's root.
#
#   compile OBJ CMD...               CMD in the background, its output in OBJ.log (printed if it
#                                    fails); OBJ joins the array objs
#   compile_c_sources OUT CC FLAGS... the library's C sources (native/src, native/cuda/*.c) into OUT,
#                                    the AVX2 files with their instruction sets on x86-64
#   wait_compiles                    waits for every compile; fails if any failed
pids=()
objs=()
compile() {
    local obj=$1
    shift
    objs+=("$obj")
    ("$@" > "$obj.log" 2>&1 || { cat "$obj.log"; exit 1; }) &
    pids+=($!)
}
compile_c_sources() {
    local out=$1 cc=$2 src extra
    shift 2
    for src in native/src/*/*.c native/src/arch/*/*.c native/cuda/*.c; do
        extra=()
        case "$src" in */arch/x86/*) [ "$(uname -m)" = x86_64 ] && extra=(-mavx2 -mfma -mf16c) ;; esac
        compile "$out/$(basename "$src" .c).o" "$cc" "$@" "${extra[@]}" -c "$src" -o "$out/$(basename "$src" .c).o"
    done
}
wait_compiles() {
    local pid failed=0
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    return "$failed"
}
