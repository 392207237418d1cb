"""`kvgguf inspect` predicts what live contexts hold: its table (the command's own JSON output)
is checked against kv_memory() of real contexts of both models, for llama.cpp's own cache types
(both sliding-window settings) and kvgguf's tiered cache."""

from __future__ import annotations

import dataclasses
import functools
import json
import warnings

import pytest

import kvgguf
from kvgguf import Llama, TieredConfig
from kvgguf.cli import inspect
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.model.gguf_file import GGUFError, read_metadata
from kvgguf.model.shape import KVShape
from kvgguf.policy import held
from kvgguf.policy.resolve import tiered_preset_for

import tiny_models
from kvgguf.cli.main import main
from test_cli import run_cli

KW = dict(n_threads=2, n_threads_batch=2, verbose=False, flash_attn=True)
ONE_THREAD = dict(n_threads=1, n_threads_batch=1, verbose=False)
MODELS = ["smollm2-135m", "gemma3-270m"]
CONTEXTS = (1000, 2048)  # 1000: llama.cpp pads it to 1024 cells


@functools.lru_cache(maxsize=None)
def card(name: str) -> dict:
    """`kvgguf inspect NAME --ctx 1000 2048 --json`, parsed."""
    out = run_cli("inspect", name, "--ctx", *map(str, CONTEXTS), "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def predicted(name: str, cache: str, n_ctx: int, source: str = "kvgguf") -> int:
    """inspect's bytes for a cache row of llama.cpp's or kvgguf's (both have an "f16")."""
    rows = {(r["from"], r["cache"]): r for r in card(name)["kv_table"]}
    return rows[source, cache]["bytes"][str(n_ctx)]


def tokens(llm, n: int) -> list[int]:
    ids = llm.tokenize(wikitext2_test()[: 12 * n].encode())[:n]
    assert len(ids) == n
    return ids


@pytest.mark.model
@pytest.mark.parametrize("name", MODELS)
def test_shape_is_the_gguf_metadata(name):
    path = kvgguf.models.path(name)
    meta = read_metadata(path)
    arch = meta["general.architecture"]
    shape = KVShape.from_gguf(path)
    assert (shape.arch, shape.n_layer, shape.n_head, shape.n_head_kv) == (
        arch,
        meta[f"{arch}.block_count"],
        meta[f"{arch}.attention.head_count"],
        meta[f"{arch}.attention.head_count_kv"],
    )
    # Gemma-3 states its head dim (256, not 640 / 4); SmolLM2 does not (576 / 9 = 64).
    assert shape.head_dim_k == shape.head_dim_v == {"smollm2-135m": 64, "gemma3-270m": 256}[name]
    assert shape.n_swa == meta.get(f"{arch}.attention.sliding_window", 0)
    c = card(name)
    assert (c["head_dim_k"], c["full_attention_layers"]) == (shape.head_dim_k, shape.full_layers)


@pytest.mark.model
def test_full_attention_layers_match_llama_cpp():
    """The sliding-window rule read from metadata agrees with the layers llama.cpp reports."""
    path = kvgguf.models.path("gemma3-270m")
    llm = Llama(str(path), kv_codec="tiered", n_ctx=1024, **KW)
    assert KVShape.from_gguf(path).full_layers == llm.kv_cache.layers == [5, 11, 17]
    llm.close()


@pytest.mark.model
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n_ctx", CONTEXTS)
def test_llama_cpp_cache_bytes_are_what_inspect_prints(name, cache, n_ctx):
    shape = KVShape.from_gguf(kvgguf.models.path(name))
    for swa_full in (True, False) if shape.n_swa else (None,):
        kw = {} if swa_full is None else {"swa_full": swa_full}
        llm = Llama(str(kvgguf.models.path(name)), n_ctx=n_ctx, type_k=cache, type_v=cache, **kw, **KW)
        want = predicted(name, inspect.llama_label(shape, cache, swa_full is not False), n_ctx, "llama.cpp")
        assert llm.kv_memory().total_bytes == want, (name, cache, n_ctx, swa_full)
        llm.close()


@pytest.mark.model
@pytest.mark.parametrize("n_ubatch", [128, 256])
def test_sliding_window_cells_follow_the_ubatch(n_ubatch):
    """With swa_full off, Gemma-3's sliding-window layers hold window + ubatch cells, padded."""
    path = kvgguf.models.path("gemma3-270m")
    shape = KVShape.from_gguf(path)
    llm = Llama(str(path), n_ctx=2048, n_ubatch=n_ubatch, swa_full=False, **KW)
    want = inspect.llama_cache_bytes(shape, 2048, "f16", swa_full=False, n_ubatch=n_ubatch)
    assert want < inspect.llama_cache_bytes(shape, 2048, "f16", swa_full=False)
    assert llm.kv_memory().total_bytes == want
    llm.close()


def assert_tiered(mem, want, llm):
    """The hot buffer and the store's blocks exactly (the policy's plans replayed over the same
    batches); the total up to the store's index, which inspect leaves out: the block table, grown
    by doubling from 16 entries per layer and kind, a few tens of KB beside MBs of K/V."""
    assert want["n_cold"] == llm.kv_cache.n_cold > 0
    assert mem.by_tier["hot"].bytes == want["hot"]
    window = mem.by_tier.get("window")
    assert (window.bytes if window else 0) == want["window"]
    if window:
        assert window.codec == llm.kv_cells["window"]
    assert mem.cold_bytes == want["store"]
    reuse = mem.by_tier["reuse"].bytes if "reuse" in mem.by_tier else 0
    if window:  # the sliding windows' rows a cut keeps: at most those of every evicted position
        config = dataclasses.replace(llm.kv_config, hot_cells=llm.kv_cells["hot"], window=llm.kv_cells["window"])
        full = held.reuse_bytes(KVShape.of(llm), llm.n_tokens, llm.n_batch, config, windows=False)
        assert full <= reuse <= want["reuse"]
    else:
        assert reuse == want["reuse"]
    assert mem.total_bytes - want["hot"] - want["window"] - want["store"] - reuse == mem.index_bytes
    assert 0 < mem.index_bytes < 0.01 * mem.total_bytes


@pytest.mark.model  # loads the model by name
@pytest.mark.parametrize(
    "name, swa_full, window",
    [
        ("smollm2-135m", True, "f16"),
        ("gemma3-270m", True, "f16"),
        ("gemma3-270m", False, "f16"),
        ("gemma3-270m", True, "q8_0"),
    ],
)
def test_tiered_cache_bytes_are_predicted(name, swa_full, window):
    path = kvgguf.models.path(name)
    shape = KVShape.from_gguf(path)
    # an archive tier at this length; on Gemma-3 the hot window covers the sliding window
    config = TieredConfig(hot=shape.n_swa + 64 if shape.n_swa else 256, warm_tokens=256, window=window)
    llm = Llama(str(path), kv_codec=config, n_ctx=4096, swa_full=swa_full, **KW)
    llm.eval(tokens(llm, 1800))
    mem = llm.kv_memory()
    assert mem.by_tier["archive"].bytes > 0
    # swa_full changes nothing: kvgguf asks for as many window cells as hot cells, unpadded
    assert_tiered(mem, inspect.kvgguf_bytes(shape, 4096, config, n_tokens=1800), llm)
    llm.close()


@pytest.mark.model  # loads the model by name
@pytest.mark.parametrize("name", MODELS)
def test_tiered_preset_row_is_what_a_full_context_holds(name):
    """inspect's 'tiered' row at 2048: kvgguf.Llama(kv_codec="tiered", n_ctx=2048) with 2048 tokens in."""
    path = kvgguf.models.path(name)
    llm = Llama(str(path), kv_codec="tiered", n_ctx=2048, **KW)
    llm.eval(tokens(llm, 2048))
    mem = llm.kv_memory()
    shape = KVShape.from_gguf(path)
    want = inspect.kvgguf_bytes(shape, 2048, tiered_preset_for(shape, TieredConfig()))
    assert want["hot"] + want["window"] + want["store"] + want["reuse"] == predicted(name, "tiered", 2048)
    assert_tiered(mem, want, llm)
    llm.close()


def test_sliding_window_layout_as_llama_cpp_reads_it():
    base = {
        "general.architecture": "gemma3",
        "gemma3.block_count": 8,
        "gemma3.attention.head_count": 4,
        "gemma3.embedding_length": 640,
        "gemma3.attention.sliding_window": 512,
    }
    assert KVShape.from_metadata(base).full_layers == [5]  # llama.cpp's default for gemma3: every 6th
    assert KVShape.from_metadata({**base, "gemma3.attention.sliding_window_pattern": 4}).full_layers == [3, 7]
    flags = [True, False] * 4  # llama.cpp's array form: true where the layer slides
    shape = KVShape.from_metadata({**base, "gemma3.attention.sliding_window_pattern": flags})
    assert (shape.full_layers, shape.swa_pattern, shape.head_dim_k) == ([1, 3, 5, 7], 0, 160)
    with pytest.raises(GGUFError, match="lists 3 layers of 8"):
        KVShape.from_metadata({**base, "gemma3.attention.sliding_window_pattern": [True] * 3})

    def as_arch(arch, meta):
        return {
            k.replace("gemma3", arch): v.replace("gemma3", arch) if isinstance(v, str) else v for k, v in meta.items()
        }

    gemma2 = as_arch("gemma2", {k: v for k, v in base.items() if "sliding" not in k})
    assert (KVShape.from_metadata(gemma2).n_swa, KVShape.from_metadata(gemma2).full_layers) == (4096, [1, 3, 5, 7])
    assert KVShape.from_metadata(as_arch("llama", base)).n_swa == 0  # llama.cpp gives llama no window
    # smallthinker's loader reads a window (with a layout of its own): without the layout, refused
    with pytest.raises(GGUFError, match="does not know which layers"):
        KVShape.from_metadata(as_arch("smallthinker", base))
    assert KVShape.from_metadata(as_arch("qwen3", base)).n_swa == 0  # its loader never reads one


# Inspect at any context


def test_inspect_answers_at_any_context_and_defaults_to_the_default_model(capsys):
    assert main(["inspect", "--ctx", "10000000000", "--json"]) == 0  # no model: the default one
    rows = {r["cache"]: r for r in json.loads(capsys.readouterr().out)["kv_table"]}
    tiered = rows["tiered"]["bits_held"]["10000000000"]
    assert 3.0 < tiered < rows["f16"]["bits_held"]["10000000000"]


# A recurrent model's memory line


def test_a_recurrent_models_memory_reads_n_a_not_nan(tmp_path, smollm2_path):
    path = str(tiny_models.write_refused(tmp_path / "mamba.gguf", "mamba", smollm2_path))
    llm = Llama(path, n_ctx=256, n_threads=1, n_threads_batch=1, verbose=False)
    try:
        llm.eval(llm.tokenize(b"hello world"))
        line = str(llm.kv_memory())
        assert "nan" not in line and "n/a bits/value over" in line, line
    finally:
        llm.close()


# A hot window that covers the context


def test_a_hot_window_covering_the_context_says_nothing_is_compressed(smollm2_path):
    with pytest.warns(UserWarning, match="covers the whole context .*nothing is compressed"):
        llm = Llama(str(smollm2_path), kv_codec=TieredConfig(hot=100000), n_ctx=1024, **ONE_THREAD)
    llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a window that leaves room to compress says nothing
        Llama(str(smollm2_path), kv_codec=TieredConfig(hot=256), n_ctx=1024, **ONE_THREAD).close()
