"""kvgguf.install(): a plain llama_cpp.Llama(...) built by any code gets the compressed cache;
uninstall() restores stock; KVGGUF_KV_CODEC does the same at import; unsupported settings fall
back to stock loudly."""

from __future__ import annotations

import importlib

import llama_cpp
import pytest

import kvgguf
from conftest import run_python
from kvgguf import Llama
from kvgguf import installer as install_module
from kvgguf.evaluation.text import wikitext2_test


@pytest.fixture
def installed():
    kvgguf.install(kv_codec="rotq4")
    try:
        yield
    finally:
        kvgguf.uninstall()


def test_plain_llama_evicts_into_the_store_after_install(smollm2_path, installed):
    from llama_cpp import Llama  # as a framework would

    llm = Llama(model_path=str(smollm2_path), n_ctx=1024, n_batch=512, verbose=False, n_threads=2)
    try:
        assert isinstance(llm, kvgguf.Llama) and isinstance(llm, llama_cpp.Llama)
        assert llm.kv_config.warm == "rotq4"
        assert llm.n_batch == llm.kv_config.ubatch  # 512 is split into the config's ubatch
        toks = llm.tokenize(wikitext2_test()[:4000].encode())[:600]
        llm.eval(toks)
        mem = llm.kv_memory()
        assert llm.kv_cache.n_cold > 0 and mem.cold_values > 0 and mem.cold_bytes > 0
        out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


def test_uninstall_restores_stock(smollm2_path):
    kvgguf.install()
    kvgguf.uninstall()
    assert install_module.installed() is None
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, verbose=False)
    try:
        assert type(llm) is llama_cpp.Llama
    finally:
        llm.close()


def test_callers_arguments_win_and_subclasses_stay_as_they_are(smollm2_path, installed):
    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, kv_codec=None, verbose=False)
    try:
        assert llm.kv_config is None  # an explicit kv_codec=None: llama.cpp's own cache
    finally:
        llm.close()

    class Framework(llama_cpp.Llama):
        pass

    llm = Framework(str(smollm2_path), n_ctx=256, verbose=False)
    try:
        assert type(llm) is Framework
    finally:
        llm.close()
    llm = kvgguf.Llama(str(smollm2_path), n_ctx=256, verbose=False)  # kvgguf's own class: as given
    try:
        assert llm.kv_config is None
    finally:
        llm.close()


@pytest.mark.parametrize(
    "kwargs, why",
    [
        (dict(vocab_only=True), "vocab_only"),
        (dict(type_k="q8_0", type_v="q8_0", flash_attn=True), "type_k"),
        (dict(n_ctx=0), "n_ctx=0"),
    ],
)
def test_unsupported_settings_fall_back_to_stock_loudly(smollm2_path, installed, capfd, kwargs, why):
    with pytest.warns(RuntimeWarning, match=why):
        llm = llama_cpp.Llama(str(smollm2_path), verbose=False, **{"n_ctx": 256, **kwargs})
    try:
        assert llm.kv_config is None
    finally:
        llm.close()
    assert "not kvgguf's" in capfd.readouterr().err


def test_unknown_codec_is_refused_by_install():
    with pytest.raises(ValueError, match="unknown"):
        kvgguf.install(kv_codec="rotq9")
    assert install_module.installed() is None


def run_fresh(code: str, env_value: str):
    return run_python(code, env_update={install_module.ENV_VAR: env_value})


def test_environment_variable_installs_at_import(smollm2_path):
    code = (
        "import kvgguf, llama_cpp\n"
        f"llm = llama_cpp.Llama({str(smollm2_path)!r}, n_ctx=512, verbose=False)\n"
        "print(type(llm).__name__, llm.kv_config == kvgguf.TieredConfig())\n"
        "llm.close()\n"
    )
    proc = run_fresh(code, "tiered")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["InstalledLlama", "True"]  # the preset


def test_environment_variable_with_an_unknown_codec_says_so():
    proc = run_fresh("import kvgguf\n", "rotq9")
    assert proc.returncode != 0
    assert "KVGGUF_KV_CODEC='rotq9'" in proc.stderr and "unknown" in proc.stderr


# Import order


def test_llama_cpp_imported_before_kvgguf_loads_kvguffs_library():
    proc = run_python(
        "import llama_cpp\nimport kvgguf\nprint(kvgguf.llama_patch_version())", env_remove=("LLAMA_CPP_LIB_PATH",)
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    import kvgguf

    assert int(proc.stdout.strip()) == kvgguf.llama_patch_version() > 0


# llama-cpp-python's default batch


def test_the_default_batch_is_split_the_same_through_the_facade_and_install(smollm2_path, capfd):
    path = str(smollm2_path)
    direct = Llama(path, kv_codec="tiered", n_ctx=1024, n_batch=512, n_threads=1, verbose=True)
    kvgguf.install(kv_codec="tiered")
    try:
        installed = llama_cpp.Llama(path, n_ctx=1024, n_batch=512, n_threads=1, verbose=True)
    finally:
        kvgguf.uninstall()
    try:
        said = capfd.readouterr().err
        assert "n_batch=512 is longer than the hot window" in said
        assert said.count("n_batch=512 is longer than the hot window") == 2, "install() says it too"
        for llm in (direct, installed):
            assert llm.n_batch == llm.kv_config.ubatch < 512
            assert llama_cpp.llama_n_ctx(llm._ctx.ctx) == llama_cpp.llama_n_ctx(direct._ctx.ctx)
        toks = installed.tokenize(b"hello " * 300)
        installed.eval(toks)  # 300 tokens in batches of the config's ubatch
        assert installed.n_tokens == len(toks) and installed.kv_cache.n_cold > 0
    finally:
        direct.close()
        installed.close()


# The documented names import as modules


@pytest.mark.parametrize("name, attribute", [("kvgguf.codecs", "names"), ("kvgguf.models", "path")])
def test_the_documented_names_import_as_modules(name, attribute):
    module = importlib.import_module(name)
    assert callable(getattr(module, attribute))
    assert module is getattr(kvgguf, name.split(".")[1])


def test_import_kvgguf_codecs_works_in_a_fresh_interpreter():
    r = run_python("import kvgguf.codecs\nfrom kvgguf.models import names\nprint(kvgguf.codecs.names()[0], names()[0])")
    assert r.returncode == 0, r.stderr
