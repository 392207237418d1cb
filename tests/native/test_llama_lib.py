"""kvgguf binds llama-cpp-python to its own patched llama.cpp, and proves it."""

import shutil
from importlib import resources
from pathlib import Path

from conftest import run_python


def test_loaded_library_is_the_patched_one():
    import kvgguf

    from kvgguf.llamacpp.library import PATCH_VERSION

    assert kvgguf.llama_patch_version() == PATCH_VERSION
    lib = kvgguf.llama_library_path()
    assert lib.parent == Path(str(resources.files("kvgguf").joinpath("lib"))).resolve()


def test_llama_imported_first_with_another_library_is_refused(tmp_path):
    import kvgguf

    # A copy of the same library in another folder stands in for "some other libllama".
    other = tmp_path / "other"
    shutil.copytree(kvgguf.llama_library_path().parent, other)
    proc = run_python("import llama_cpp\nimport kvgguf", env_update={"LLAMA_CPP_LIB_PATH": str(other)})
    assert proc.returncode != 0
    assert "imported before kvgguf" in proc.stderr
    assert "Import kvgguf before llama_cpp" in proc.stderr


def test_llama_imported_first_with_our_library_is_accepted():
    import kvgguf

    lib_dir = str(kvgguf.llama_library_path().parent)
    proc = run_python(
        "import llama_cpp\nimport kvgguf\nprint(kvgguf.llama_patch_version())",
        env_update={"LLAMA_CPP_LIB_PATH": lib_dir},
    )
    assert proc.returncode == 0, proc.stderr
    from kvgguf.llamacpp.library import PATCH_VERSION

    assert proc.stdout.strip() == str(PATCH_VERSION)


def test_unpatched_library_folder_is_refused(tmp_path):
    proc = run_python("import kvgguf", env_update={"KVGGUF_LLAMA_LIB_DIR": str(tmp_path)})
    assert proc.returncode != 0
    assert "patched llama.cpp is not in" in proc.stderr


def test_a_library_that_does_not_load_is_an_import_error_that_says_why(tmp_path):
    """A libllama that fails to load is an ImportError with the loader's reason; for a CUDA build
    whose CUDA libraries are missing (a machine without the toolkit) it says what to install."""
    from kvgguf.llamacpp.library import why_not_loaded

    (tmp_path / "libllama.so").write_bytes(b"not a shared library")
    proc = run_python("import kvgguf", env_update={"KVGGUF_LLAMA_LIB_DIR": str(tmp_path)})
    assert proc.returncode != 0
    assert "ImportError" in proc.stderr and "libllama.so" in proc.stderr
    missing = "Failed to load shared library 'libllama.so': libcublas.so.13: cannot open shared object file"
    assert why_not_loaded(missing, tmp_path) == missing  # a CPU build's folder: the reason alone
    (tmp_path / "libggml-cuda.so").write_bytes(b"")
    hint = why_not_loaded(missing, tmp_path)
    assert hint.startswith(missing) and "nvidia-cublas" in hint and "without -DGGML_CUDA=ON" in hint


def test_default_model_generates_through_patched_library(smollm2_path):
    import kvgguf  # noqa: F401  (binds the library)
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(str(smollm2_path), n_ctx=256, n_threads=2, verbose=False, logits_all=True)
    out = llm.create_completion("The capital of France is", max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1
    assert out["choices"][0]["text"].strip()
    scores = llm.scores[: llm.n_tokens]
    assert np.isfinite(scores).all()
    # Greedy decoding: every generated token is the argmax of the logits before it.
    n_prompt = out["usage"]["prompt_tokens"]
    generated = llm.input_ids[n_prompt : llm.n_tokens]
    assert list(generated) == list(np.argmax(scores[n_prompt - 1 : llm.n_tokens - 1], axis=1))
