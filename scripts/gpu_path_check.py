"""The fused path on a GPU, end to end: kvgguf's cache with every layer on a CUDA device against
llama.cpp's own CUDA cache and against kvgguf's CPU path, on a random-weight model written here.

    python3 scripts/gpu_path_check.py --tokenizer PATH [--out DIR]

PATH: SmolLM2's GGUF, or the GPU kit's smollm2-tokenizer.pkl (../shared/gpu-kit), whose tokenizer
the model copies. scripts/cuda_check.sh --full runs it against the CUDA package it built;
tests/test_gpu_path.py runs check() where a GPU and a CUDA build are at hand. Prints one line per
comparison and exits 1 when one fails, 77 when there is no GPU path to check.

Random weights prove the mechanism (the same rows, scored and summed right, on the GPU), not
quality. The bounds: an exact cold store (f16) on the GPU within a few times the distance between
llama.cpp's own CUDA and CPU caches (the arithmetic floor of two exact computations); coded rows
(rotq) on the GPU within the same of kvgguf's CPU path over the same codes.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from tiny_models import TinySpec, write  # noqa: E402

SPEC = TinySpec("llama", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=512, n_ctx_train=4096)
N_TOKENS, N_CTX, N_BATCH = 900, 2048, 64


def _configs():
    from kvgguf import TieredConfig

    exact = TieredConfig(
        hot=64, sinks=0, warm="f16", warm_tokens=0, archive=None, block=32, window="f16", hot_cells="f16"
    )
    coded = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=256, archive="rotq2", block=32, hot_cells="f16")
    coded_q8 = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=256, archive="rotq3", block=32, hot_cells="q8_0")
    return exact, coded, coded_q8


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(p || q) over positions, in nats (float64 softmax)."""
    p = p_logits.astype(np.float64)
    q = q_logits.astype(np.float64)
    lp = p - p.max(-1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
    lq = q - q.max(-1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(-1, keepdims=True))
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), -1)))


def _run(path: Path, tokens: list[int], kv_codec, n_gpu_layers: int, encode_on_gpu: bool = True):
    """(logits [n, vocab], seconds, the kvgguf LiveCache or None, the Llama) of one context over
    tokens; encode_on_gpu=False: evicted cells read out and coded on the CPU, as before patch 16."""
    import llama_cpp

    from kvgguf import Llama

    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=True, n_gpu_layers=n_gpu_layers, verbose=False)
    if kv_codec is None:
        llm = llama_cpp.Llama(str(path), flash_attn=True, **kw)
    else:
        llm = Llama(str(path), kv_codec=kv_codec, **kw)
        llm._kv.encode_on_gpu = encode_on_gpu
    t = time.perf_counter()
    llm.eval(tokens)
    seconds = time.perf_counter() - t
    logits = np.array(llm.scores[: len(tokens)], dtype=np.float32)
    return logits, seconds, getattr(llm, "_kv", None), llm


def _same_codes(path: Path, tokens: list[int], config, kv, say) -> list[str]:
    """Cells coded on the GPU where they lie (kv, patch 16) against the same GPU context's cells read
    out and coded on the CPU: the store's bytes must be equal, block for block."""
    _, _, host_kv, host_llm = _run(path, tokens, config, -1, encode_on_gpu=False)
    lists = [(il, kind) for il in range(SPEC.n_layer) for kind in (0, 1)]
    gpu_blocks = [b for il, kind in lists for b in kv.store.blocks(il, kind)]
    cpu_blocks = [b for il, kind in lists for b in host_kv.store.blocks(il, kind)]
    same = len(gpu_blocks) == len(cpu_blocks) and all(
        (a.codec, a.n_rows, bytes(a.data)) == (b.codec, b.n_rows, bytes(b.data)) for a, b in zip(gpu_blocks, cpu_blocks)
    )
    n_diff = sum(bytes(a.data) != bytes(b.data) for a, b in zip(gpu_blocks, cpu_blocks))
    say(
        f"  codes of the cells coded on the GPU ({kv.rows_coded_on_gpu} rows x lists) against those read out and "
        f"coded on the CPU: {len(gpu_blocks)} / {len(cpu_blocks)} blocks, {n_diff} differ"
    )
    del host_llm
    if kv.rows_coded_on_gpu == 0:
        return ["no evicted cells were coded on the GPU"]
    return (
        []
        if same
        else [
            f"codes coded on the GPU differ from the CPU's: {n_diff} blocks, counts {len(gpu_blocks)}/{len(cpu_blocks)}"
        ]
    )


def check(tokenizer_from: Path, out_dir: Path, say=print) -> list[str]:
    """Every comparison; returns the failures (empty: all passed)."""
    from kvgguf.bindings import cuda_store

    why = cuda_store.unavailable()
    if why:
        raise RuntimeError(f"no GPU path to check: {why}")
    path = write(out_dir / "gpu-path-llama.gguf", SPEC, Path(tokenizer_from), seed=7)
    rng = np.random.default_rng(3)
    tokens = [int(t) for t in rng.integers(10, 4000, N_TOKENS)]
    failures = []

    stock_gpu, t_stock, _, _ = _run(path, tokens, None, -1)
    stock_cpu, _, _, _ = _run(path, tokens, None, 0)
    floor = _kl(stock_gpu, stock_cpu)
    say(f"llama.cpp f16, CUDA against CPU (the floor): KL {floor:.3g}, {N_TOKENS} tokens in {t_stock:.2f} s on the GPU")

    exact, coded, coded_q8 = _configs()
    # 1e-4 of slack where the floor is near 0: a row missed, misplaced or mis-masked costs far more
    # on this model (logits with a spread of about 8)
    bound = 4 * floor + 1e-4
    logits, seconds, kv, llm = _run(path, tokens, exact, -1)
    kl = _kl(stock_gpu, logits)
    on_gpu = kv is not None and kv.gpu is not None and kv.device_store is not None
    blocks = kv.device_store.bytes()[0] if on_gpu else 0
    held = kv.store.held().bytes if kv is not None else 0
    say(
        f"kvgguf f16 cold rows on the GPU against llama.cpp's CUDA f16: KL {kl:.3g} (bound {bound:.3g}); "
        f"{kv.n_cold if kv else 0} cold rows, {blocks} bytes of segments in VRAM (host store {held}); {seconds:.2f} s"
    )
    calls = kv.device_store.calls() if on_gpu else (0, 0)
    say(f"  the GPU ran the attention op {calls[0]} times and the output op {calls[1]} times")
    if not on_gpu or calls[0] == 0 or calls[0] != calls[1]:
        failures.append(f"the f16 context's layers did not take the GPU path (calls {calls})")
    if not kl <= bound:
        failures.append(f"f16 cold rows on the GPU: KL {kl:.3g} > {bound:.3g}")
    # the device's segments hold every byte of the store's, with room to grow (a quarter, or 256 rows)
    if on_gpu and not held <= blocks <= 2 * held + (1 << 20):
        failures.append(f"the device holds {blocks} bytes of segments for {held} bytes of blocks")
    if kv is not None and kv.read_failures() != (0, 0, 0):
        failures.append(f"failed reads on the GPU path: {kv.read_failures()}")
    del llm

    for name, config in (("rotq4/rotq2, f16 cells", coded), ("rotq4/rotq3, q8_0 cells", coded_q8)):
        cpu, _, _, cpu_llm = _run(path, tokens, config, 0)
        gpu, seconds, kv, gpu_llm = _run(path, tokens, config, -1)
        kl = _kl(cpu, gpu)
        agree = float(np.mean(cpu.argmax(-1) == gpu.argmax(-1)))
        say(
            f"kvgguf {name}: GPU path against CPU path KL {kl:.3g} (bound {bound:.3g}), top-1 agreement "
            f"{agree:.4f}, {kv.n_cold if kv else 0} cold rows; {seconds:.2f} s"
        )
        calls = kv.device_store.calls() if kv is not None and kv.device_store is not None else (0, 0)
        if calls[0] == 0 or calls[0] != calls[1]:
            failures.append(f"{name}: the layers did not take the GPU path (calls {calls})")
        if not kl <= bound:
            failures.append(f"{name}: KL {kl:.3g} > {bound:.3g}")
        if kv is not None and kv.read_failures() != (0, 0, 0):
            failures.append(f"{name}: failed reads on the GPU path: {kv.read_failures()}")
        if config is coded and kv is not None:
            failures += _same_codes(path, tokens, config, kv, say)
        del cpu_llm, gpu_llm
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", required=True, type=Path)
    p.add_argument("--out", type=Path, default=None, help="folder for the model (default: a temporary one)")
    a = p.parse_args(argv)
    from kvgguf.bindings import cuda_store

    why = cuda_store.unavailable()
    if why:
        print(f"gpu_path_check: {why}")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        failures = check(a.tokenizer, out)
    for f in failures:
        print(f"FAILED: {f}")
    print("gpu_path_check:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
