"""Binds llama-cpp-python to kvgguf's patched llama.cpp.

llama-cpp-python loads its shared library once, at import, from LLAMA_CPP_LIB_PATH. kvgguf
ships llama.cpp with its read-side hooks compiled in, so it must be that library, and we
prove it by calling a symbol that only our patch exports.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

from ..files import installed_file

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # its vendored llama.cpp (0c1e570) is what patches/ target
# LLAMA_KVGGUF_PATCH_VERSION in patches/, by what each version added: 1 the version itself, 2 the cold-row hooks,
# 3 compute bytes, 4 fused attention over cold rows, 5 its softmax normalizers for the attention mass, 6 the logical
# context, 7 each layer's attention path, 8 soft-capping and sinks on the fused path, 9 the fused path's threads each
# take a share of the cold rows and of the hot cells, 10 the hot cells through libkvgguf's kernels, 11 the same code
# regrouped into one patch per concern (the graph code in its own file, src/llama-kvgguf-graph.cpp), 12 the
# sliding-window cells' own cache types (set_window_types, layer_types), 13 q8_0 hot cells read by libkvgguf's
# kernels (attend_f16 takes the cells' types), 14 the sliding-window cells' count (set_window_cells)
# and ggml-cuda's dispatch of custom ops a library registers for the GPU (0006-kvgguf-cuda-custom-op), 15 the fused
# path's ops on a GPU through the context's CUDA hooks (set_cuda) and where a layer's cells live (layer_buffer), 16
# where an eviction's cells lie, for coding them in place on a GPU (view_cells), 17 CUDA graphs that hold the fused
# path's ops, captured again when the store's device copy changes (llama_kvgguf_cuda.generation), 18 an eviction in
# one call (llama_kvgguf_evict: every layer's rows to the store's C entry point, then removed), 19 the state of a
# range of positions (llama_kvgguf_state_range: the rows an eviction keeps for prefix reuse), 20 cold rows a context
# shift moved (llama_kvgguf_hooks.shifts: scored with rotated queries, their decoded keys rotated). Up to 10 each
# version added one patch file, so "patch 000N" in comments and docs names version N.
PATCH_VERSION = 20

_ENV_OVERRIDE = "KVGGUF_LLAMA_LIB_DIR"


def library_dir() -> Path:
    """Folder holding the patched libllama; KVGGUF_LLAMA_LIB_DIR overrides it."""
    override = os.environ.get(_ENV_OVERRIDE)
    if override:
        return Path(override)
    return installed_file("lib")


def _loaded_library(llama_cpp_module) -> Path:
    return Path(llama_cpp_module._lib._name).resolve()


def bind():
    """Imports llama_cpp on the patched library and returns the llama_cpp.llama_cpp module."""
    lib_dir = library_dir()
    if not any(lib_dir.glob("libllama.*")) and not (lib_dir / "llama.dll").exists():
        raise ImportError(
            f"kvgguf's patched llama.cpp is not in {lib_dir}; reinstall kvgguf "
            f"(see README) or point {_ENV_OVERRIDE} at a folder holding libllama"
        )
    already = sys.modules.get("llama_cpp.llama_cpp")
    if already is not None:
        loaded = _loaded_library(already)
        if loaded.parent != lib_dir.resolve():
            raise ImportError(
                f"llama_cpp was imported before kvgguf and loaded {loaded}, not kvgguf's patched "
                f"llama.cpp in {lib_dir}. Import kvgguf before llama_cpp (or set "
                f"LLAMA_CPP_LIB_PATH={lib_dir} before starting Python)."
            )
    else:
        os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    try:
        import llama_cpp
    except RuntimeError as e:  # llama-cpp-python's own, when its library does not load
        raise ImportError(why_not_loaded(str(e), lib_dir)) from e
    import llama_cpp.llama_cpp as llama_cpp_lib

    if llama_cpp.__version__ != LLAMA_CPP_PYTHON_VERSION:
        raise ImportError(
            f"kvgguf needs llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (its patches target the "
            f"llama.cpp that version vendors), found {llama_cpp.__version__}; "
            f"pip install 'llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}'"
        )
    found = patch_version(llama_cpp_lib)
    if found != PATCH_VERSION:
        raise ImportError(
            f"{_loaded_library(llama_cpp_lib)} carries kvgguf patch version {found}, this kvgguf "
            f"needs {PATCH_VERSION}; reinstall kvgguf so its llama.cpp is rebuilt"
        )
    return llama_cpp_lib


def why_not_loaded(error: str, lib_dir: Path) -> str:
    """The message for a libllama in lib_dir that did not load with `error`: what to do where a
    CUDA build misses the CUDA libraries its backend links (on a machine without a GPU too)."""
    if any(lib_dir.glob("libggml-cuda.*")) and ("libcublas" in error or "libcudart" in error):
        return (
            f'{error}. This kvgguf was built with CUDA (CMAKE_ARGS="-DGGML_CUDA=ON"), and llama.cpp\'s CUDA '
            "backend loads the CUDA runtime and cuBLAS even where no GPU is used: install the CUDA toolkit "
            "(or the nvidia-cuda-runtime and nvidia-cublas wheels, their lib folders on LD_LIBRARY_PATH), "
            "or reinstall kvgguf without -DGGML_CUDA=ON"
        )
    return error


def patch_version(llama_cpp_lib=None) -> int:
    """The kvgguf patch version compiled into the loaded libllama (-1 if it is not patched)."""
    if llama_cpp_lib is None:
        import llama_cpp.llama_cpp as llama_cpp_lib
    fn = getattr(llama_cpp_lib._lib, "llama_kvgguf_patch_version", None)
    if fn is None:
        return -1
    fn.argtypes = []
    fn.restype = ctypes.c_int32
    return int(fn())


def library_path() -> Path:
    """Path of the libllama that llama_cpp actually loaded."""
    import llama_cpp.llama_cpp as llama_cpp_lib

    return _loaded_library(llama_cpp_lib)
