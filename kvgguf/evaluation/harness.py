"""`kvgguf eval`: the evaluation protocol of docs/design.md, kvgguf's codecs beside llama.cpp's own cache types.

Text: WikiText-2's test split, shipped with kvgguf (or --text), tokenized by the model, cut into chunks of C tokens. Each chunk is
decoded from an empty cache in batches of B tokens, flash attention on. The reference is stock
llama.cpp with an f16 cache, decoded with the same batches. Scored: the second half of every
chunk (KL and top-1 on positions [C/2, C), perplexity on [C/2, C-1), whose next token is in the
chunk). Logits are streamed batch by batch; only the reference's scored half is kept, as float32.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Optional, Sequence

import numpy as np

from ..bindings import codecs
from ..llama import Llama
from ..policy.resolve import CACHE_TYPES, calibrated_config, cell_types
from .provenance import provenance
from ..model.shape import KVShape
from ..policy import held, kv_codec

DEFAULT_CONFIGS = "f16,q8_0,q5_1,q4_0,iq4_nl,kivi4,kivi2,rotq4,rotq3,rotq2,tiered"
QUICK_CONFIGS = "f16,q8_0,q4_0,rotq4,tiered"
KVGGUF_PREFIX = "kvgguf:"
SLICE = 64  # rows scored at a time: bounds float64 temporaries for 262K-token vocabularies


@dataclass(frozen=True)
class CacheConfig:
    name: str  # as the user wrote it (plus the sliding-window setting, where it was split)
    source: str  # "llama.cpp" or "kvgguf": whose cache it is
    spec: str  # llama.cpp type name, or kv_codec spec
    swa_full: Optional[bool] = None  # llama.cpp types: None is llama-cpp-python's default (on)


def row_name(name: str, spec: str, llm, calibrated: Optional[bool] = None) -> str:
    """A result row's name (the benchmarks' too): "tiered (calibrated)" where the kv_codec
    "tiered" followed the model's calibration (``calibrated``, or else the Llama's own
    ``kv_calibration``), "pq2 (calibrated codebooks)" where pq2/vq8 started from the model's
    calibrated codebooks, else name."""
    if calibrated is None:
        calibrated = bool(getattr(llm, "kv_calibration", None))
    if spec == "tiered" and calibrated:
        return name + " (calibrated)"
    kv = getattr(llm, "kv_cache", None)
    return name + (" (calibrated codebooks)" if kv is not None and kv.books else "")


def parse_configs(text: str) -> list[CacheConfig]:
    """Names in llama.cpp's CACHE_TYPES run llama.cpp's own cache; 'tiered', kvgguf codec names,
    'k:NAME,v:NAME' and 'kvgguf:NAME' (e.g. kvgguf:f16) run kvgguf's live cache."""
    out = []
    names = [t.strip() for t in text.split(",") if t.strip()]
    for i in range(len(names) - 1, 0, -1):  # 'k:NAME,v:NAME' is one cache (K and V apart)
        if names[i].startswith("v:") and names[i - 1].startswith("k:"):
            names[i - 1 : i + 1] = [f"{names[i - 1]},{names[i]}"]
    for name in names:
        spec = name[len(KVGGUF_PREFIX) :] if name.startswith(KVGGUF_PREFIX) else name
        if not name.startswith(KVGGUF_PREFIX) and spec in CACHE_TYPES:
            out.append(CacheConfig(name, "llama.cpp", spec))
        elif kv_codec.is_kv_codec(spec):
            out.append(CacheConfig(name, "kvgguf", spec))
        else:
            raise ValueError(
                f"cache '{name}' is unknown; choose llama.cpp types ({', '.join(CACHE_TYPES)}), "
                f"'tiered', 'tiered:fixed', 'tiered:keep=SIGNAL[:FRACTION]', 'auto[:BITS]', 'auto:held=BITS', or kvgguf codecs ({', '.join(codecs.names())}; prefix with 'kvgguf:' for f16)"
            )
    if not out:
        raise ValueError("no cache configuration given")
    return out


def split_sliding_window(configs: Sequence[CacheConfig], n_swa: int) -> list[CacheConfig]:
    """On a model with sliding-window layers, each llama.cpp cache type runs twice: as
    llama-cpp-python builds it by default (swa_full on: those layers hold the whole context)
    and with swa_full off (they hold their window, as kvgguf's cache holds them), labelled, so
    that no memory comparison rests on that setting alone."""
    if not n_swa:
        return list(configs)
    out = []
    for cfg in configs:
        if cfg.source == "llama.cpp":
            out.append(replace(cfg, name=f"{cfg.name} (swa full)", swa_full=True))
            out.append(replace(cfg, name=f"{cfg.name} (swa window)", swa_full=False))
        else:
            out.append(cfg)
    return out


def sliding_window(model_path: str) -> int:
    return KVShape.from_gguf(model_path).n_swa


def batch_starts(ctx: int, batch: int) -> range:
    return range(0, ctx, batch)


def check_compresses(hot: int, ctx: int, batch: int, name: str) -> None:
    """Refuses a kvgguf cache that would hold every token of a chunk exact: rows leave the hot
    window only before a batch that starts more than ``hot`` tokens in."""
    last = batch_starts(ctx, batch)[-1]
    if last <= hot:
        raise ValueError(
            f"cache '{name}' compresses nothing at ctx {ctx}: its hot window keeps {hot} tokens exact "
            f"and the last batch of {batch} starts at token {last}; use a larger --ctx "
            f"(> {hot + batch}), a smaller --batch, or a smaller --hot"
        )


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=1, keepdims=True))
    return x


def score(ref_logits: np.ndarray, test_logits: np.ndarray, next_tokens: np.ndarray):
    """Per position: KL(p_ref || p_test), top-1 agreement, and the negative log-likelihood of
    the next token under both (next_tokens < 0: unknown, NaN there)."""
    kl, agree, nll_ref, nll_test = [], [], [], []
    for a in range(0, len(ref_logits), SLICE):
        lr, lt = log_softmax(ref_logits[a : a + SLICE]), log_softmax(test_logits[a : a + SLICE])
        kl.append((np.exp(lr) * (lr - lt)).sum(axis=1))
        agree.append(lr.argmax(axis=1) == lt.argmax(axis=1))
        nxt = next_tokens[a : a + SLICE]
        rows = np.arange(len(nxt))
        known = nxt >= 0
        nr = np.full(len(nxt), np.nan)
        ntest = np.full(len(nxt), np.nan)
        nr[known] = -lr[rows[known], nxt[known]]
        ntest[known] = -lt[rows[known], nxt[known]]
        nll_ref.append(nr)
        nll_test.append(ntest)
    return np.concatenate(kl), np.concatenate(agree), np.concatenate(nll_ref), np.concatenate(nll_test)


def kept_half(llm, tokens: Sequence[int], half: int) -> np.ndarray:
    """The logits of positions [half, len(tokens)) as float32, the tokens evaluated in llm's
    batches from where its cache stands: a reference's scored half, the rest never kept."""
    kept = np.empty((len(tokens) - half, llm.n_vocab()), dtype=np.float32)
    start = 0  # by count, not position: a shift or a budget's drop moves positions back
    for _, logits in llm.eval_logits(tokens):
        lo = max(start, half)
        if lo < start + len(logits):
            kept[lo - half : start + len(logits) - half] = logits[lo - start :]
        start += len(logits)
    return kept


def kl_top1(ref_logits: np.ndarray, test_logits: np.ndarray) -> tuple[float, float]:
    """Mean KL(p_ref || p_test) and top-1 agreement over the rows of two logit arrays."""
    kl, agree, _, _ = score(ref_logits, test_logits, np.full(len(ref_logits), -1))
    return float(kl.mean()), float(agree.mean())


@dataclass
class Result:
    name: str
    source: str  # "llama.cpp" or "kvgguf"
    bits_per_value: float = 0.0  # bytes held for K and V (all tiers) x 8 / values, at the end of a chunk
    cold_bits_per_value: Optional[float] = (
        None  # kvgguf: the store's tiers alone (bytes x 8 / their values); None: no cold rows
    )
    book_bits_per_value: float = 0.0  # of cold_bits_per_value, what pq2/vq8's codebooks take (one per layer and K/V)
    peak_kv_bytes: int = 0
    peak_compute_bytes: int = 0  # llama.cpp's compute buffers (transient scratch, cold rows expanded included)
    kl_mean: float = 0.0
    kl_p99: float = 0.0
    top1: float = 0.0
    ppl: float = 0.0
    ppl_ref: float = 0.0
    seconds: float = (
        0.0  # wall time, in the JSON only: speed is measured by benchmarks/live_cache.py on an idle machine
    )
    _kl: list = field(default_factory=list, repr=False)


def _progress(msg: str) -> None:
    print(f"\r[kvgguf eval] {msg:<70}", end="", file=sys.stderr, flush=True)


def make_llama(
    model_path: str,
    cfg: Optional[CacheConfig],
    ctx: int,
    batch: int,
    threads: int,
    hot: Optional[int],
    kv_attention: str = "fused",
    ubatch: Optional[int] = None,
    codebooks: str = "sequence",
    n_gpu_layers: int = 0,
) -> tuple[Llama, bool]:
    """The Llama a row runs, and whether its config came from the model's calibration.
    kv_attention for kvgguf's caches: batches of up to FUSED_MAX_TOKENS take the fused path,
    whose f32 sums differ from llama.cpp's f16 ones by KL ~0.004 on SmolLM2 even with f16 rows;
    "expand" measures the codec alone (llama.cpp's kernels over the decoded rows). codebooks:
    TieredConfig.codebooks (with hot given). n_gpu_layers: every row's and the reference's
    (kvgguf's caches then attend on the GPU where their cells are)."""
    kw = dict(
        n_ctx=ctx,
        n_batch=batch,
        n_ubatch=batch,
        flash_attn=True,
        verbose=False,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=n_gpu_layers,
    )
    if cfg is None or cfg.source == "llama.cpp":
        t = "f16" if cfg is None else cfg.spec
        if cfg is not None and cfg.swa_full is not None:
            kw["swa_full"] = cfg.swa_full
        return Llama(model_path, type_k=t, type_v=t, **kw), False
    # kvgguf splits the batches of B into its config's ubatch (what a user's application gets).
    spec, request = kv_codec.parse(cfg.spec)
    kw["n_batch"] = kw["n_ubatch"] = min(batch, ubatch or spec.ubatch)
    if hot is None:  # the preset string: the facade fits it to the model (e.g. Gemma's window)
        if codebooks != "sequence":
            raise ValueError("codebooks other than 'sequence' need an explicit hot window")
        llm = Llama(model_path, kv_codec=cfg.spec, kv_attention=kv_attention, **kw)
        return llm, llm.kv_calibration is not None
    spec = replace(spec, hot=hot, block=min(spec.block, hot // 2), codebooks=codebooks)
    followed = None
    if request is not None:
        from .calibration import calibrate  # "auto" on a model without a calibration measures it

        held_of = None
        if request.held:  # "auto:held=BITS": the cells the Llama will hold count too
            shape = KVShape.from_gguf(model_path)
            cells = cell_types(spec.fit_window(shape.n_swa, strict=False), shape)

            def held_of(c):
                return held.bits_held(
                    shape, kw["n_ctx"], replace(c, hot_cells=cells.hot_cells, window=cells.window), kw["n_batch"]
                )

        spec, followed = calibrated_config(
            model_path,
            request,
            base=spec,
            context=kw.get("n_ctx"),
            calibrate=lambda path, progress: calibrate(path),
            held_of=held_of,
        )
    return Llama(model_path, kv_codec=spec, kv_attention=kv_attention, **kw), followed is not None


def run_eval(
    model_path: str,
    configs: Sequence[CacheConfig],
    tokens: Sequence[int],
    *,
    ctx: int,
    chunks: int,
    batch: int = 256,
    threads: int = 2,
    hot: Optional[int] = None,
    kv_attention: str = "fused",
    ubatch: Optional[int] = None,
    codebooks: str = "sequence",
    n_gpu_layers: int = 0,
) -> tuple[dict, list[Result]]:
    if ctx < 4 or batch <= 0:
        raise ValueError(f"ctx must be >= 4 and batch > 0, got ctx={ctx}, batch={batch}")
    if chunks * ctx > len(tokens):
        raise ValueError(f"{chunks} chunks of {ctx} tokens need {chunks * ctx} tokens; the text has {len(tokens)}")
    configs = split_sliding_window(configs, sliding_window(model_path))
    for cfg in configs:  # before the reference runs: a configuration that compresses nothing is refused
        if cfg.source == "kvgguf":
            llm, _ = make_llama(
                model_path, cfg, ctx, batch, threads, hot, kv_attention, ubatch, codebooks, n_gpu_layers
            )
            kv_hot, kv_batch = llm.kv_config.hot, llm.n_batch
            llm.close()
            check_compresses(kv_hot, ctx, kv_batch, cfg.name)
    half = ctx // 2
    parts = [np.asarray(tokens[c * ctx : (c + 1) * ctx], dtype=np.int64) for c in range(chunks)]
    nexts = [np.concatenate([p[half + 1 :], [-1]]) for p in parts]  # next token of each scored position

    ref_llm, _ = make_llama(model_path, None, ctx, batch, threads, None, n_gpu_layers=n_gpu_layers)
    refs = []
    for c, part in enumerate(parts):
        _progress(f"reference f16, chunk {c + 1}/{chunks}")
        ref_llm.reset()
        refs.append(kept_half(ref_llm, part.tolist(), half))
    ref_llm.close()

    results = []
    for cfg in configs:
        llm, calibrated = make_llama(
            model_path, cfg, ctx, batch, threads, hot, kv_attention, ubatch, codebooks, n_gpu_layers
        )
        res = Result(row_name(cfg.name, cfg.spec, llm, calibrated), cfg.source)
        nll_r, nll_t, agree = [], [], []
        t0 = time.perf_counter()
        for c, part in enumerate(parts):
            _progress(f"{cfg.name}, chunk {c + 1}/{chunks}")
            llm.reset()
            for start, logits in llm.eval_logits(part.tolist()):
                lo = max(start, half)
                if lo >= start + len(logits):
                    continue
                a, b = lo - half, start + len(logits) - half
                kl, ag, nr, nt = score(refs[c][a:b], logits[lo - start :], nexts[c][a:b])
                res._kl.append(kl)
                agree.append(ag)
                nll_r.append(nr)
                nll_t.append(nt)
            mem = llm.kv_memory()
            res.peak_kv_bytes = max(res.peak_kv_bytes, mem.total_bytes)
            res.peak_compute_bytes = max(res.peak_compute_bytes, mem.compute_bytes)
            res.bits_per_value = max(res.bits_per_value, mem.bits_per_value)
            if cfg.source == "llama.cpp":
                res.cold_bits_per_value = res.bits_per_value  # every row is held in that type
            elif mem.cold_values:
                res.cold_bits_per_value = mem.cold_bits_per_value
                books = mem.by_tier.get("books")
                res.book_bits_per_value = books.bytes * 8 / mem.cold_values if books else 0.0
        res.seconds = time.perf_counter() - t0
        llm.close()
        kl = np.concatenate(res._kl)
        nr, nt = np.concatenate(nll_r), np.concatenate(nll_t)
        res.kl_mean, res.kl_p99 = float(kl.mean()), float(np.percentile(kl, 99))
        res.top1 = float(np.concatenate(agree).mean())
        res.ppl, res.ppl_ref = float(np.exp(np.nanmean(nt))), float(np.exp(np.nanmean(nr)))
        results.append(res)
    print(file=sys.stderr)
    meta = {
        "model": str(model_path),
        "ctx": ctx,
        "chunks": chunks,
        "batch": batch,
        "threads": threads,
        "hot": hot,
        "ubatch": ubatch,
        "scored_positions": chunks * (ctx - half),
        **({"n_gpu_layers": n_gpu_layers} if n_gpu_layers else {}),
    }
    return meta, results


def markdown(meta: dict, results: Sequence[Result]) -> str:
    lines = [
        f"{Path(meta['model']).name}, ctx {meta['ctx']} x {meta['chunks']} chunks, batches of {meta['batch']}, "
        f"{meta['scored_positions']} scored positions, flash attention on; reference ppl {results[0].ppl_ref:.2f}",
        "",
        "| cache | from | bits/value held | of which cold rows | KV held (peak) | compute scratch (peak) "
        "| KL mean | KL p99 | top-1 | ppl |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cold = "n/a" if r.cold_bits_per_value is None else f"{r.cold_bits_per_value:.2f}"
        lines.append(
            f"| {r.name} | {r.source} | {r.bits_per_value:.2f} | {cold} | {r.peak_kv_bytes / 2**20:.1f} MiB | "
            f"{r.peak_compute_bytes / 2**20:.1f} MiB | {r.kl_mean:.5f} | {r.kl_p99:.4f} | "
            f"{r.top1:.3f} | {r.ppl:.2f} |"
        )
    return "\n".join(lines) + "\n"


def plot(results: Sequence[Result], path: Path, title: str) -> bool:
    """Writes the KL-vs-bits plot; False (and a note on stderr) without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("[kvgguf eval] no plot: matplotlib is not installed (pip install 'kvgguf[plot]')", file=sys.stderr)
        return False

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for source, marker in (("llama.cpp", "s"), ("kvgguf", "o")):
        pts = [r for r in results if r.source == source]
        ax.scatter([r.bits_per_value for r in pts], [max(r.kl_mean, 1e-7) for r in pts], marker=marker, label=source)
        for r in pts:
            ax.annotate(
                r.name, (r.bits_per_value, max(r.kl_mean, 1e-7)), fontsize=8, xytext=(4, 3), textcoords="offset points"
            )
    ax.set_yscale("log")
    ax.set_xlabel("bits per value held (all tiers)")
    ax.set_ylabel("KL(f16 || cache), mean")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_outputs(meta: dict, results: Sequence[Result], out_dir: Path, stem: str, command: str) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "command": command,
        **meta,
        "results": [{k: v for k, v in asdict(r).items() if not k.startswith("_")} for r in results],
        "provenance": provenance(meta.get("threads")),  # commit, llama.cpp build, machine
    }
    (out_dir / f"{stem}.json").write_text(json.dumps(data, indent=2))
    (out_dir / f"{stem}.md").write_text(f"`{command}`\n\n" + markdown(meta, results))
    png = out_dir / f"{stem}.png"
    png.unlink(missing_ok=True)  # never leave an older run's plot beside these results
    plot(results, png, f"{Path(meta['model']).name}, ctx {meta['ctx']} x {meta['chunks']}")
    return out_dir / f"{stem}.md"
