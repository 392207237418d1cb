#!/usr/bin/env bash
# gpu_kit.sh: what a lent GPU machine (no network; nvcc, CMake, ninja, numpy and Python there)
# needs to build and check kvgguf, made here, where the package registries can be reached.
#
#   bash scripts/gpu_kit.sh [DEST] [PYVER]     DEST default .gpu-kit (ignored by git); PYVER the
#                                              GPU machine's Python, default 3.12
#
# DEST then holds:
#   llama_cpp_python-0.3.36.tar.gz  the pinned sdist, cut to what a library build reads (about
#                                   6 MB of 76): KVGGUF_LLAMA_SDIST points the build at it, and
#                                   scripts/cuda_check.sh takes llama_cpp's bindings from it
#   whl/                            wheels of the Python packages that machine may lack
#   smollm2-tokenizer.pkl           SmolLM2's tokenizer keys, {key: (types, value)}, which the
#                                   random-weight shape models copy (tests/tiny_models.py), so
#                                   the 98 MB model need not travel
#   cuda_check                      native/cuda/tests/cuda_check.cu compiled here for sm_90
#                                   (scripts/cuda_compile_check.sh), where nvcc is installed
# and the device call is then, carrying DEST:
#   KVGGUF_LLAMA_SDIST=DEST/llama_cpp_python-0.3.36.tar.gz KVGGUF_CUDA_CHECK_BIN=DEST/cuda_check \
#       OUT=$OUT bash scripts/cuda_device_call.sh --full
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.gpu-kit}
pyver=${2:-3.12}
version=0.3.36
py=${KVGGUF_PY:-.venv/bin/python}
mkdir -p "$dest/whl"
dest=$(cd "$dest" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The sdist: kvgguf's build caches it; else the registry.
sdist=${KVGGUF_LLAMA_SDIST:-${KVGGUF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kvgguf}/sdist/llama_cpp_python-$version.tar.gz}
if [ ! -f "$sdist" ]; then
    python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$tmp/download"
    sdist=$tmp/download/llama_cpp_python-$version.tar.gz
fi
tar -xzf "$sdist" -C "$tmp"
top=$tmp/llama_cpp_python-$version
vendor=$top/vendor/llama.cpp
# A library build (no common, tests, tools or examples) reads none of these.
for d in .git .github docs examples tests docker; do rm -rf "${top:?}/$d"; done
for d in models docs tools tests examples benches media pocs app .github .devops gguf-py conversion scripts; do
    rm -rf "${vendor:?}/$d"
done
tar -czf "$dest/llama_cpp_python-$version.tar.gz" -C "$tmp" "llama_cpp_python-$version"
echo "gpu_kit: sdist $(du -h "$dest/llama_cpp_python-$version.tar.gz" | cut -f1)"

# kvgguf's and llama_cpp's pure dependencies beside numpy, and gguf for the shape models.
for package in cffi pycparser zstandard diskcache tqdm gguf pyyaml; do
    python3 -m pip download -q --no-deps --only-binary :all: --python-version "$pyver" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform any -d "$dest/whl" "$package"
done
echo "gpu_kit: $(ls "$dest/whl" | wc -l) wheels"

# SmolLM2's tokenizer keys, read with this checkout's install (kvgguf and gguf).
"$py" - "$dest/smollm2-tokenizer.pkl" << 'EOF'
import pickle
import sys

import gguf

from kvgguf import models

reader = gguf.GGUFReader(str(models.path("smollm2-135m")))
keys = {k: (f.types, f.contents()) for k, f in reader.fields.items() if k.startswith("tokenizer.ggml.")}
with open(sys.argv[1], "wb") as out:
    pickle.dump(keys, out)
print(f"gpu_kit: {len(keys)} tokenizer keys")
EOF

# The kernels' check, compiled where nvcc is (the GPU machine builds it again if this is absent).
if command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] || [ -n "${NVCC:-}" ]; then
    bash scripts/cuda_compile_check.sh --build-only > "$tmp/compile.log" 2>&1 || { cat "$tmp/compile.log"; exit 1; }
    cp build/cuda_compile_check/cuda_check "$dest/cuda_check"
    echo "gpu_kit: cuda_check compiled"
else
    echo "gpu_kit: no nvcc here: cuda_check is built on the GPU machine"
fi
du -sh "$dest"
