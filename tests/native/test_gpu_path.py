"""The fused path on a GPU: libkvgguf's device copy of the store (native/cuda/kvg_cuda_store.c)
behind llama.cpp's CUDA hooks (patch 15).

The kernels and the hooks are checked against the CPU's store by native/cuda/tests/cuda_check.cu
(test_cuda_kernels.py); here, what a user sees: the Python binding on any machine, and on a
machine with a GPU and a CUDA build, a context whose layers live on the GPU against the same
context on the CPU (marked cuda: skipped, saying why, elsewhere).
"""

from pathlib import Path

import pytest
from cffi import FFI

from kvgguf.bindings import cuda_store
from kvgguf.bindings.binding import KvgLoadError

ROOT = Path(__file__).resolve().parents[2]


def test_the_cuda_header_marks_what_cffi_reads():
    """The regions of kvg_cuda.h that the binding gives cffi parse, and hold every call it makes."""
    ffi = FFI()
    ffi.cdef(cuda_store.cdef_source((ROOT / "native/cuda/kvg_cuda.h").read_text()))
    for name in (
        "kvg_cuda_device_count",
        "kvg_cuda_mem_info",
        "kvg_cuda_ctx_init",
        "kvg_cuda_ctx_free",
        "kvg_cuda_store_init",
        "kvg_cuda_store_free",
        "kvg_cuda_store_set_layer",
        "kvg_cuda_store_sync",
        "kvg_cuda_store_encode",
        "kvg_cuda_store_encode_many",
        "kvg_cuda_store_bytes",
        "kvg_cuda_store_calls",
        "kvg_cuda_store_hook_attend",
        "kvg_cuda_store_hook_finish",
        "kvg_cuda_store_hook_supports",
        "kvg_cuda_store_hook_generation",
    ):
        assert "function " + name in ffi._parser._declarations, name
    # the hook's argument as llama.cpp's struct llama_kvgguf_cuda_attn lays it out, field for field
    fields = [f for f, _ in ffi.typeof("kvg_cuda_layer_args").fields]
    assert fields[:3] == ["il", "n_cold", "q_dev"] and fields[-3:] == ["m_dev", "l_dev", "acc_dev"]
    with pytest.raises(KvgLoadError, match="without its"):
        cuda_store.cdef_source("// cffi-cuda-begin\nint f(void);\n")
    # an eviction's items as DeviceStore.encode_many hands them to kvg_cuda_store_encode_many
    items = cuda_store.store_items(
        ffi, [(3, 1, 2, "rotq2", 0x1000, 1, 512, 64), (0, 0, 1, "rotq4", 0x2000, 1024, 1, 8)]
    )
    assert [(a.il, a.kind, a.tier, a.row_stride, a.col_stride, a.n_rows) for a in items] == [
        (3, 1, 2, 1, 512, 64),
        (0, 0, 1, 1024, 1, 8),
    ]
    assert int(ffi.cast("uintptr_t", items[1].src_dev)) == 0x2000 and items[0].src_type == 1  # KVG_CUDA_F16
    from kvgguf import codecs

    assert items[0].codec == codecs.get("rotq2").type


LLAMA_API = ROOT / "native/llama/include/llama-kvgguf.h"


def _fields(text: str, start: str) -> list[tuple[str, str]]:
    """(type, name) of each field of the struct whose definition starts with `start`."""
    body = text[text.index(start) :]
    body = body[body.index("{") + 1 : body.index("}")]
    out = []
    for line in body.splitlines():
        line = line.split("//")[0].strip().rstrip(";")
        if not line:
            continue
        first, *more = line.split(",")
        tokens = first.replace("*", " * ").split()
        ctype = " ".join(tokens[:-1])
        for name in [tokens[-1], *more]:
            name = name.strip().split("[")[0]
            out.append((ctype, name[: -len("_dev")] if name.endswith("_dev") else name))
    return out


@pytest.mark.parametrize(
    "theirs, ours, n",
    [
        ("struct llama_kvgguf_cuda_attn {", "typedef struct kvg_cuda_layer_args {", 24),
        ("struct llama_kvgguf_cuda_finish {", "typedef struct kvg_cuda_finish_args {", 8),
    ],
)
def test_the_patch_and_the_library_agree_on_the_hooks_arguments(theirs, ours, n):
    """llama.cpp's structs (kvgguf's C API inside it, native/llama/include/llama-kvgguf.h) and
    libkvgguf's (kvg_cuda.h), which the hooks pass between them, have the same fields in the same
    order with the same types."""
    patch = _fields(LLAMA_API.read_text(), theirs)
    header = _fields((ROOT / "native/cuda/kvg_cuda.h").read_text(), ours)
    assert header == patch
    assert len(patch) == n


def test_the_hooks_table_is_the_patch_s_struct():
    """kvgguf hands llama.cpp its CUDA hooks as struct llama_kvgguf_cuda (llama-kvgguf.h): the ctypes
    struct has its fields in its order, the generation hook (patch 17) last."""
    from kvgguf.llamacpp import hooks

    patch = _fields(LLAMA_API.read_text(), "struct llama_kvgguf_cuda {")
    assert [name for _, name in patch] == [name for name, _ in hooks.llama_kvgguf_cuda._fields_]
    assert patch[-1] == ("llama_kvgguf_cuda_generation_fn", "generation")


def test_without_a_gpu_build_the_device_store_says_why(smollm2_path):
    why = cuda_store.unavailable()
    if why is None:
        pytest.skip("this machine has a CUDA build and a GPU")
    assert "CUDA" in why or "device" in why
    with pytest.raises(KvgLoadError if "built without" in why else Exception):
        cuda_store.DeviceStore(object(), 0)


@pytest.mark.cuda
def test_the_fused_path_on_the_gpu_gives_what_the_cpu_and_llama_cpp_give(smollm2_path, tmp_path):
    """scripts/gpu_path_check.py: every layer on the GPU, cold rows in VRAM and attended there, an
    exact store against llama.cpp's own CUDA cache and coded rows against kvgguf's CPU path."""
    why = cuda_store.unavailable()
    if why:
        pytest.skip(why)
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_path_check

    failures = gpu_path_check.check(smollm2_path, tmp_path)
    assert not failures, failures


def test_kv_memory_says_where_the_bytes_are():
    """A GPU context's KV memory: llama.cpp's cells and the store's copy in VRAM, the store on the
    host; on a CPU, all of it on the host and nothing in VRAM."""
    from kvgguf.runtime.memory import KVMemory, TierMemory

    tiers = (TierMemory("hot", "f16", 1000), TierMemory("warm", "rotq4", 300), TierMemory("archive", "rotq2", 100))
    gpu = KVMemory(tiers, 20, 64, 10, device_bytes=500, cells_on_device=True)
    assert (gpu.vram_bytes, gpu.host_bytes, gpu.total_bytes) == (1500, 420, 1420)
    assert "in VRAM" in str(gpu) and "on the host" in str(gpu)
    cpu = KVMemory(tiers, 20, 64, 10)
    assert (cpu.vram_bytes, cpu.host_bytes) == (0, 1420)
    assert "VRAM" not in str(cpu)


def test_a_cpu_context_holds_nothing_in_vram(smollm2_path):
    from kvgguf import Llama, TieredConfig

    llm = Llama(str(smollm2_path), kv_codec=TieredConfig(hot=64, block=32), n_ctx=512, n_batch=32, verbose=False)
    llm.eval(llm.tokenize(b"The cache on the CPU: " * 20))
    mem = llm.kv_memory()
    assert llm._kv.gpu is None and llm._kv.device_store is None
    assert mem.vram_bytes == 0 and mem.host_bytes == mem.total_bytes > 0


def test_a_plan_for_a_gpu_takes_only_what_the_gpu_attends_over():
    """kv_codec="tiered" / "auto" on a GPU: the calibrated plan leaves out every codec family but
    f16, kivi and rotq (the GPU attends over K and V of them in any mix), the preset's own
    exclusions and key floor kept; without a GPU build or with no layer offloaded, kvgguf plans
    for the CPU."""
    from kvgguf.bindings import codecs
    from kvgguf.llama import _on_gpu
    from kvgguf.policy import kv_codec, resolve

    request = kv_codec.parse("tiered")[1]
    gpu = resolve.gpu_request(request)
    families = {codecs.family(n) for n in codecs.names()}
    assert families - set(gpu.exclude) == {"f16", "kivi", "rotq"}
    assert {codecs.family(n) for n in cuda_store.GPU_CODECS} == set(resolve.GPU_FAMILIES)
    assert set(cuda_store.GPU_CODECS) == {n for n in codecs.names() if codecs.family(n) in resolve.GPU_FAMILIES}
    assert set(request.exclude) <= set(gpu.exclude) and gpu.key_bits == request.key_bits
    assert resolve.gpu_request(None) is None
    assert not _on_gpu({"n_gpu_layers": 0}) and not _on_gpu({"n_gpu_layers": -1, "offload_kqv": False})
    assert _on_gpu({"n_gpu_layers": -1}) == (cuda_store.unavailable() is None)


def test_a_gpu_layer_refuses_before_the_first_token_what_it_cannot_attend_over():
    """cuda_store.gpu_refuses, which LiveCache asks for every GPU layer's K and V codecs of every
    tier before the first token: kivi at any head dim (Phi-2's 80, Phi-3's 96), rotq, f16, in any
    mix; not a codec outside GPU_CODECS, a head dim past the kernels', or rows that are not whole
    bytes of codes."""
    assert cuda_store.gpu_refuses("kivi4", 32, 80) is None
    assert cuda_store.gpu_refuses("kivi3", 8, 96) is None
    assert cuda_store.gpu_refuses("kivi8", 1, 256) is None
    assert cuda_store.gpu_refuses("rotq2", 8, 128) is None and cuda_store.gpu_refuses("f16", 2, 72) is None
    assert "not tcq3" in cuda_store.gpu_refuses("tcq3", 8, 128)
    assert "kivi2" in cuda_store.gpu_refuses("wfq4", 8, 128)  # the message names what runs
    assert "up to 512" in cuda_store.gpu_refuses("kivi4", 1, 576)
    assert "whole bytes" in cuda_store.gpu_refuses("kivi3", 1, 5)


def test_kivi_keys_in_blocks_of_part_groups_are_named_slow_on_a_gpu():
    """LiveCache warns (cuda_store.run_breaks) where kivi keys would be evicted in blocks that are
    not whole groups: the device copy then holds each block as a run of its own."""
    assert cuda_store.run_breaks({"kivi4", "f16"}, 64, 32) is None
    assert cuda_store.run_breaks({"rotq4"}, 48, 32) is None  # no kivi keys: rows lie end to end
    assert "multiple of group_size" in cuda_store.run_breaks({"kivi4", "f16"}, 48, 32)
    assert "blocks of 64" in cuda_store.run_breaks({"kivi8"}, 64, 128)


@pytest.mark.parametrize("flash_attn", [True, False])  # off: llama.cpp transposes V
def test_view_cells_reads_what_read_rows_copies(smollm2_path, flash_attn):
    """llama_kvgguf_view_cells (patch 16), through which a GPU codes an eviction's cells where they
    lie: on a CPU context it points at host memory, and reading it with its strides gives the
    rows read_rows copies, value for value; cells that are not one run, or quantized, give None."""
    import ctypes

    import llama_cpp
    import numpy as np

    from kvgguf.llamacpp import hooks

    llm = llama_cpp.Llama(str(smollm2_path), n_ctx=256, n_batch=64, flash_attn=flash_attn, n_threads=1, verbose=False)
    ctx = llm._ctx.ctx
    llm.eval(llm.tokenize(b"Rows read in place, where the cells lie. " * 6)[:60])
    for il in (0, 17):
        for kind in (0, 1):
            view = hooks.view_cells(ctx, 0, il, kind, 10, 40)
            assert view is not None and view.is_host == 1 and view.n_rows == 30 and view.device
            assert view.type == 1  # GGML_TYPE_F16
            width = 576 // 9 * 3  # n_embd_gqa: 3 KV heads of 64
            # every element the strides reach, read from the cells' memory
            reach = (29 * view.row_stride + (width - 1) * view.col_stride + 1) * 2
            flat = np.frombuffer((ctypes.c_char * reach).from_address(view.data), dtype=np.uint16)
            t, e = np.meshgrid(np.arange(30), np.arange(width), indexing="ij")
            got = flat[t * view.row_stride + e * view.col_stride]
            rows = np.empty((30, width), np.uint16)
            assert hooks.read_rows(ctx, 0, il, kind, 10, 40, rows.ctypes.data, rows.nbytes, None) == 30
            assert np.array_equal(got, rows), (il, kind)
    with pytest.raises(ValueError):
        hooks.view_cells(ctx, 0, 99, 0, 0, 10)  # no such layer
    # a hole in the positions: the cells of [0, 50) are two runs now
    assert llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(ctx), 0, 20, 30)
    assert hooks.view_cells(ctx, 0, 0, 0, 0, 50) is None
    assert hooks.view_cells(ctx, 0, 0, 0, 30, 50).n_rows == 20
    llm.close()
    q8 = llama_cpp.Llama(str(smollm2_path), n_ctx=256, type_k=8, type_v=8, flash_attn=True, n_threads=1, verbose=False)
    q8.eval(q8.tokenize(b"Quantized cells are copied. " * 3))
    assert hooks.view_cells(q8._ctx.ctx, 0, 0, 0, 0, 8) is None
    q8.close()


def test_on_a_gpu_the_preset_keeps_its_hot_cells_in_f16(smollm2_path):
    """The GPU codes evicted cells where they lie from f16 only: a preset's hot cells are f16 there
    (q8_0 on the CPU, where llama.cpp can hold them); a type the config names is kept."""
    from kvgguf.policy import resolve

    kw = dict(n_ctx=1024, n_batch=None, verbose=False, calibrate=None)
    assert resolve.resolve(str(smollm2_path), "tiered", **kw).hot_cells == "q8_0"
    assert resolve.resolve(str(smollm2_path), "tiered", gpu=True, **kw).hot_cells == "f16"
    assert resolve.resolve(str(smollm2_path), "tiered:hot=q8_0", gpu=True, **kw).hot_cells == "q8_0"
    # and batches of 256 (a graph launch each), where SmolLM2 on the CPU keeps the preset's 32
    on_cpu, on_gpu = (resolve.resolve(str(smollm2_path), "tiered", gpu=g, **kw) for g in (False, True))
    assert (on_cpu.config.hot, on_cpu.config.ubatch, on_cpu.n_batch) == (224, 32, 32)
    assert (on_gpu.config.hot, on_gpu.config.ubatch, on_gpu.n_batch) == (256, 256, 256)
