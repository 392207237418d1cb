#!/usr/bin/env bash
# Prints the first clang that links a libFuzzer binary with ASan and UBSan ($CLANG first, then
# clang, clang-19 ... clang-14); exits 1, printing nothing, where none does. scripts/fuzz.sh
# builds its targets with it; scripts/system_packages.sh and tests/native/test_fuzz.py ask it
# whether one is here.
#
#   bash scripts/clang_fuzzer.sh
set -uo pipefail
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void) d; (void) n; return 0; }\n' > "$probe/p.c"
for c in ${CLANG:-} clang clang-19 clang-18 clang-17 clang-16 clang-15 clang-14; do
    if command -v "$c" > /dev/null 2>&1 \
        && "$c" -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" > /dev/null 2>&1; then
        echo "$c"
        exit 0
    fi
done
exit 1
