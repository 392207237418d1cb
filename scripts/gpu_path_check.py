"""The fused path on a GPU, end to end: kvgguf's cache with every layer on a CUDA device against
llama.cpp's own CUDA cache and against kvgguf's CPU path, on a random-weight model written here.

    python3 scripts/gpu_path_check.py --tokenizer PATH [--out DIR]

PATH: SmolLM2's GGUF, or the GPU kit's smollm2-tokenizer.pkl (scripts/gpu_kit.sh), whose tokenizer
the model copies. scripts/cuda_check.sh --full runs it against the CUDA package it built;
tests/native/test_gpu_path.py runs check() where a GPU and a CUDA build are at hand. Prints one line per
comparison and exits 1 when one fails, 77 when there is no GPU path to check.

It also compares the store's bytes of cells coded on the GPU where they lie with those of the same
cells read out and coded on the CPU, and the splits of a decode graph (GGML_SCHED_DEBUG) with
stock's: the ops run where the cells are, so no layer's attention crosses to the CPU.

Random weights prove the mechanism (the same rows, scored and summed right, on the GPU), not
quality. The bounds: an exact cold store (f16) on the GPU within a few times the distance between
llama.cpp's own CUDA and CPU caches (the arithmetic floor of two exact computations); coded rows
(rotq; kivi at head dim 80, the preset's codecs where rotations cannot go; K and V of different
families) on the GPU within the same of kvgguf's CPU path over the same codes.
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

# Q4_0 weights, as the speed table's shape models (which ran on the H200); with f16 weights this
# check died within 2 s there, before its first line (_probe_f16_weights asks why)
SPEC = TinySpec(
    "llama", n_layer=4, n_embd=256, n_head=8, n_head_kv=2, head_dim=64, n_ff=512, n_ctx_train=4096, weights="q4_0"
)
# kivi's models: a head dim rotations cannot take (Phi-2's 80), where the "tiered" preset holds kivi
KIVI_SPEC = TinySpec(
    "llama", n_layer=4, n_embd=320, n_head=4, n_head_kv=2, head_dim=80, n_ff=512, n_ctx_train=4096, weights="q4_0"
)
N_TOKENS, N_CTX, N_BATCH = 900, 2048, 64
DECODE_STEPS = 160  # five evictions of the coded config's blocks of 32


def _configs():
    from kvgguf import TieredConfig

    exact = TieredConfig(
        hot=64, sinks=0, warm="f16", warm_tokens=0, archive=None, block=32, window="f16", hot_cells="f16"
    )
    coded = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=256, archive="rotq2", block=32, hot_cells="f16")
    coded_q8 = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=256, archive="rotq3", block=32, hot_cells="q8_0")
    return exact, coded, coded_q8


def _kivi_configs():
    """The preset's codecs on KIVI_SPEC's head dim 80, and K and V of different families (a
    calibrated plan's kind of mix) on SPEC: rotq keys with kivi values, then the reverse."""
    from kvgguf import TieredConfig

    kivi = TieredConfig(
        hot=64, sinks=4, warm="kivi4", warm_tokens=256, archive=("kivi4", "kivi2"), block=32, hot_cells="f16"
    )
    mixed = TieredConfig(
        hot=64, sinks=4, warm=("rotq4", "kivi4"), warm_tokens=256, archive=("kivi4", "rotq2"), block=32, hot_cells="f16"
    )
    return kivi, mixed


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

    # where a crash happened, in the log (llama.cpp's own messages go nowhere with verbose=False)
    print(
        f"[{time.strftime('%X')}] a context: {'stock' if kv_codec is None else 'kvgguf'}, n_gpu_layers={n_gpu_layers}, "
        f"encode_on_gpu={encode_on_gpu}",
        file=sys.stderr,
        flush=True,
    )
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
    n_diff = sum(
        (x.codec, x.n_rows, bytes(x.data)) != (y.codec, y.n_rows, bytes(y.data)) for x, y in zip(gpu_blocks, cpu_blocks)
    )
    say(
        f"  codes of the cells coded on the GPU ({kv.rows_coded_on_gpu} rows x lists) against those read out and "
        f"coded on the CPU: {len(gpu_blocks)} / {len(cpu_blocks)} blocks, {n_diff} differ"
    )
    del host_llm
    if kv.rows_coded_on_gpu == 0:
        return ["no evicted cells were coded on the GPU"]
    if n_diff or len(gpu_blocks) != len(cpu_blocks):
        return [
            f"codes coded on the GPU differ from the CPU's: {n_diff} blocks, counts {len(gpu_blocks)}/{len(cpu_blocks)}"
        ]
    return []


def _last_graph_splits(path: Path, coded: bool) -> list[str]:
    """The backends of the splits of the last graph ggml's scheduler assigned (GGML_SCHED_DEBUG=1)
    for a context over every layer on the GPU, after a prefill past the hot window and one decoded
    token: stock's f16 cache (coded=False) or the coded kvgguf cache. Run in a child process (the
    variable is read when a context is made; llama.cpp logs through llama_cpp's logger)."""
    import os
    import re
    import subprocess

    env = dict(os.environ, GGML_SCHED_DEBUG="1")
    cmd = [sys.executable, __file__, "--child-splits", str(path)] + (["--coded"] if coded else [])
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"the split count's child failed ({out.returncode}): {out.stderr[-2000:]}")
    heads = re.findall(r"## SPLIT #(\d+): (\S+) #", out.stderr)
    starts = [i for i, (n, _) in enumerate(heads) if n == "0"]
    return [backend for _, backend in heads[starts[-1] :]] if starts else []


def _child_splits(path: str, coded: bool) -> int:
    import llama_cpp

    from kvgguf import Llama

    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_gpu_layers=-1, verbose=True)
    llm = Llama(path, kv_codec=_configs()[1], **kw) if coded else llama_cpp.Llama(path, flash_attn=True, **kw)
    tokens = [int(t) for t in np.random.default_rng(5).integers(10, 4000, 300)]
    llm.eval(tokens)  # past the hot window: cold rows in the coded context's graph
    llm.eval([11])
    return 0


def _child_decode(path: str, out: str) -> int:
    """A coded context on the GPU: a prefill past the hot window, then DECODE_STEPS tokens one at a
    time across evictions; saves each step's logits, the ops' hook calls and the decode's seconds.
    KVGGUF_CUDA_GRAPHS (read when the device copy is made) decides whether CUDA graphs hold the ops."""
    from kvgguf import Llama

    kw = dict(n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, n_gpu_layers=-1, verbose=False)
    llm = Llama(path, kv_codec=_configs()[1], **kw)
    rng = np.random.default_rng(11)
    llm.eval([int(t) for t in rng.integers(10, 4000, 300)])
    steps = [int(t) for t in rng.integers(10, 4000, DECODE_STEPS)]
    n_vocab = llm.n_vocab()
    logits = np.empty((DECODE_STEPS, n_vocab), dtype=np.float32)
    t = time.perf_counter()
    for i, tok in enumerate(steps):
        llm.eval([tok])
        logits[i] = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))  # the last token's
    seconds = time.perf_counter() - t
    kv = llm._kv
    calls = kv.device_store.calls() if kv.device_store is not None else (0, 0)
    gen = kv.device_store.generation() if kv.device_store is not None else 0
    np.savez(out, logits=logits, calls=np.array(calls), seconds=seconds, generation=gen, n_cold=kv.n_cold)
    return 0


def _graphs_agree(path: Path, out_dir: Path, say) -> list[str]:
    """Decoding with CUDA graphs holding kvgguf's ops (replayed without calling its hooks until the
    store's copy changes) gives the logits that launching every op gives: bit for bit, the same
    kernels on the same arguments. The hooks' calls show the replays."""
    import os
    import subprocess

    got = {}
    for graphs in ("1", "0"):
        out = out_dir / f"decode-graphs{graphs}.npz"
        env = dict(os.environ, KVGGUF_CUDA_GRAPHS=graphs)
        cmd = [sys.executable, "-X", "faulthandler", __file__, "--child-decode", str(path), str(out)]
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        if run.returncode != 0:
            return [f"the decode child (KVGGUF_CUDA_GRAPHS={graphs}) failed ({run.returncode}): {run.stderr[-2000:]}"]
        got[graphs] = np.load(out)
    on, off = got["1"], got["0"]
    calls_on, calls_off = (tuple(int(c) for c in d["calls"]) for d in (on, off))
    diff = float(np.max(np.abs(on["logits"] - off["logits"])))
    say(
        f"  decode of {DECODE_STEPS} tokens across evictions, CUDA graphs holding the ops against not: logits differ by "
        f"at most {diff:.3g}; hook calls {calls_on} against {calls_off}; "
        f"{float(on['seconds']):.3f} s against {float(off['seconds']):.3f} s; generation {int(on['generation'])} / "
        f"{int(off['generation'])}"
    )
    failures = []
    if not diff <= 1e-5:
        failures.append(f"decoding with CUDA graphs changed the logits by {diff:.3g}")
    if int(off["generation"]) != 0 or int(on["generation"]) == 0:
        failures.append("KVGGUF_CUDA_GRAPHS did not decide the generation hook's answer")
    if not calls_on[0] < calls_off[0]:
        failures.append(f"CUDA graphs replayed no op: {calls_on} hook calls against {calls_off}")
    return failures


def _child_probe(path: str) -> int:
    """Stock llama.cpp, every layer on the GPU, a batch of 64 over the model at path."""
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=512, n_batch=64, n_ubatch=64, n_gpu_layers=-1, flash_attn=True, verbose=False)
    llm.eval([int(t) for t in np.random.default_rng(1).integers(10, 4000, 200)])
    return 0


def _probe_f16_weights(tokenizer_from: Path, out_dir: Path, say) -> None:
    """Whether stock llama.cpp runs a model of f16 weights on this GPU (its batched matmuls go to
    cuBLAS; Q4_0's do not), in a child process: reported, not counted against kvgguf."""
    import dataclasses
    import subprocess

    path = write(
        out_dir / "gpu-path-f16-weights.gguf", dataclasses.replace(SPEC, weights="f16"), tokenizer_from, seed=7
    )
    cmd = [sys.executable, "-X", "faulthandler", __file__, "--child-probe", str(path)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    say(
        f"stock llama.cpp on the GPU with f16 weights (cuBLAS): exit {run.returncode}"
        + (f"; its stderr ends: {run.stderr[-1500:]}" if run.returncode else "")
    )


def check(tokenizer_from: Path, out_dir: Path, say=print) -> list[str]:
    """Every comparison; returns the failures (empty: all passed)."""
    from kvgguf.bindings import cuda_store

    why = cuda_store.unavailable()
    if why:
        raise RuntimeError(f"no GPU path to check: {why}")
    _probe_f16_weights(Path(tokenizer_from), out_dir, say)
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
        fails, kv, cpu_llm, gpu_llm = _gpu_against_cpu(name, path, tokens, config, bound, say)
        failures += fails
        if config is coded and kv is not None:
            failures += _same_codes(path, tokens, config, kv, say)
            # GGML_SCHED_DEBUG: the ops run where the cells are, so the graph splits no more than stock's
            stock_splits, coded_splits = _last_graph_splits(path, False), _last_graph_splits(path, True)
            say(f"  splits of a decode graph (GGML_SCHED_DEBUG): stock {stock_splits}, kvgguf {coded_splits}")
            if not coded_splits or len(coded_splits) > len(stock_splits):
                failures.append(f"kvgguf's graph splits more than stock's: {coded_splits} against {stock_splits}")
            failures += _graphs_agree(path, out_dir, say)
        del cpu_llm, gpu_llm

    # kivi rows, and K and V of different families, on the GPU against the same on the CPU
    kivi, mixed = _kivi_configs()
    kivi_path = write(out_dir / "gpu-path-kivi.gguf", KIVI_SPEC, Path(tokenizer_from), seed=7)
    kivi_floor = _kl(_run(kivi_path, tokens, None, -1)[0], _run(kivi_path, tokens, None, 0)[0])
    say(f"llama.cpp f16 at head dim 80, CUDA against CPU (the floor): KL {kivi_floor:.3g}")
    for name, model, config, b in (
        ("kivi4, archive K kivi4 / V kivi2, head dim 80", kivi_path, kivi, 4 * kivi_floor + 1e-4),
        ("K rotq4 / V kivi4, archive K kivi4 / V rotq2", path, mixed, bound),
    ):
        fails, _, cpu_llm, gpu_llm = _gpu_against_cpu(name, model, tokens, config, b, say)
        failures += fails
        del cpu_llm, gpu_llm
    return failures


def _gpu_against_cpu(name: str, path: Path, tokens: list[int], config, bound: float, say):
    """A config's context with every layer on the GPU against the same on the CPU: (failures, the
    GPU's LiveCache, the two Llamas, which the caller frees)."""
    failures = []
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
    return failures, kv, cpu_llm, gpu_llm
    return failures


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokenizer", type=Path, help="SmolLM2's GGUF, or the GPU kit's smollm2-tokenizer.pkl")
    p.add_argument("--out", type=Path, default=None, help="folder for the model (default: a temporary one)")
    p.add_argument("--child-splits", default=None, help=argparse.SUPPRESS)
    p.add_argument("--coded", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-decode", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-probe", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_probe:
        return _child_probe(a.child_probe)
    if a.child_splits:
        return _child_splits(a.child_splits, a.coded)
    if a.child_decode:
        return _child_decode(*a.child_decode)
    if a.tokenizer is None:
        p.error("--tokenizer is required")
    import faulthandler
    import os

    # a crash in a native library says where it happened, on a copy of stderr: llama-cpp-python
    # points fd 2 at /dev/null while it loads a model (verbose=False)
    faulthandler.enable(file=os.fdopen(os.dup(2), "w"), all_threads=True)
    from kvgguf.bindings import cuda_store

    why = cuda_store.unavailable()
    if why:
        print(f"gpu_path_check: {why}")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        out = a.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        failures = check(a.tokenizer, out, say=lambda line: print(line, flush=True))
    for f in failures:
        print(f"FAILED: {f}")
    print("gpu_path_check:", "FAIL" if failures else "PASS")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
