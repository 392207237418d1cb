"""libkvgguf's CUDA kernels on a GPU (marked cuda: skipped, saying why, on a machine without one).

native/cuda/tests/cuda_check.cu holds them against the scalar C reference: codes byte-equal,
decoded values bit-equal, refusals, and the fused attention (both split kernels) within the CPU
path's bounds. scripts/cuda_compile_check.sh compiles it (CI runs it without a GPU, where the
check stops at "no CUDA device"); here it must pass on the device.
"""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.cuda
@pytest.mark.slow
def test_the_cuda_kernels_agree_with_the_c_reference_on_the_gpu():
    built = subprocess.run(
        ["bash", "scripts/cuda_compile_check.sh", "--build-only"], cwd=ROOT, capture_output=True, text=True
    )
    assert built.returncode == 0, built.stdout + built.stderr
    check = subprocess.run(
        [str(ROOT / "build/cuda_compile_check/cuda_check"), "--quick", "--no-timing"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = check.stdout + check.stderr
    assert check.returncode == 0 and out.rstrip().endswith("PASS"), out
    assert "attend (the row-parallel kernel" in out and "attend (the generic kernel)" in out, out
    assert "attend_cells:" in out and "store hooks:" in out, out
