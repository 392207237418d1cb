#!/usr/bin/env bash
# The Debian packages the extended checks and the Redis tests use, installed where missing: the
# one place in the repository that installs system packages (.ci/run calls it first). Without
# root or apt-get it installs nothing and prints the command to run; the checks that need a
# missing package then skip and say which.
#
#   bash scripts/system_packages.sh            # as root (CI, containers); else: it says what to install
#
#   clang-14 libclang-rt-14-dev                      scripts/fuzz.sh (clang with libFuzzer)
#   gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user   scripts/neon_check.sh
#   redis-server                                     tests/server/test_redis_cache.py
set -uo pipefail

missing=()
bash "$(dirname "$0")/clang_fuzzer.sh" > /dev/null || missing+=(clang-14 libclang-rt-14-dev)
command -v aarch64-linux-gnu-gcc > /dev/null || missing+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross)
command -v qemu-aarch64 > /dev/null || missing+=(qemu-user)
command -v redis-server > /dev/null || missing+=(redis-server)

if [ ${#missing[@]} -eq 0 ]; then
    echo "system_packages: all present"
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get > /dev/null; then
    echo "system_packages: missing; the checks that need them skip. To install: apt-get install ${missing[*]}"
    exit 0
fi
start=$(date +%s)
echo "system_packages: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
log=$(mktemp)
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } > "$log" 2>&1; then
    # Debian bookworm has libFuzzer in libclang-rt-14-dev; elsewhere it comes with the default clang
    fallback=("${missing[@]/libclang-rt-14-dev/}")
    fallback=("${fallback[@]/clang-14/clang}")
    apt-get install -y -qq --no-install-recommends ${fallback[@]} >> "$log" 2>&1 \
        || { tail -n 20 "$log"; echo "system_packages: apt-get failed; the checks that need them skip"; exit 0; }
fi
rm -f "$log"
echo "system_packages: installed in $(( $(date +%s) - start )) s"
