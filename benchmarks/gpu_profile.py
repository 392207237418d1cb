"""Where one live_cache configuration's time goes on a GPU, kernel by kernel, where nsys is missing.

    python3 benchmarks/gpu_profile.py --model llama-3.2-3b --context 8192 --cache tiered [--decode 64]

Runs benchmarks/live_cache.py's run_one (every layer on the GPU, random tokens, phases timed)
under torch's profiler, which records every kernel of the process through CUPTI, llama.cpp's and
libkvgguf's too, and prints the kernels' summed GPU time (most first), then the run's JSON.
scripts/cuda_check.sh (GPU_PROFILE) uses nsys where it is installed, and this where torch is.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.2-3b")
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--cache", default="tiered")
    p.add_argument("--decode", type=int, default=64)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--threads", type=int, default=16)
    p.add_argument("--rows", type=int, default=40, help="kernels to list")
    a = p.parse_args(argv)
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as e:
        print(f"gpu_profile: torch is not installed ({e})")
        return 77

    from live_cache import run_one

    torch.cuda.init()  # CUPTI attaches to the device before llama.cpp's first kernel
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run = run_one(a.model, a.context, a.cache, a.decode, a.threads, a.batch, gpu=True, text="random", phases=True)

    def gpu_us(e) -> float:  # the attribute's name changed in torch 2.4
        return float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)

    events = [e for e in prof.key_averages() if gpu_us(e) > 0 and "cuda" in str(e.device_type).lower()]
    total = sum(gpu_us(e) for e in events) or 1
    print(f"kernels on the GPU ({a.model} at {a.context}, {a.cache}): {total / 1e6:.3f} s of GPU time in all")
    print("| kernel | calls | GPU ms | share |")
    print("|---|---|---|---|")
    for e in sorted(events, key=lambda e: -gpu_us(e))[: a.rows]:
        print(f"| {e.key[:90]} | {e.count} | {gpu_us(e) / 1e3:.1f} | {gpu_us(e) / total:.1%} |")
    print(json.dumps(run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
