"""`kvgguf demo`, the README's first command: both caches hold the same document, the compressed
one in fewer bytes, and the comparison is printed."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

KVGGUF = shutil.which("kvgguf", path=str(Path(sys.executable).parent)) or "kvgguf"


def test_demo_prints_both_caches_with_the_compressed_one_smaller(smollm2_path):
    proc = subprocess.run(
        [KVGGUF, "demo", str(smollm2_path), "--tokens", "1200", "-t", "2"], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    held = re.search(r"^KV held\s+([\d.]+) MiB\s+([\d.]+) MiB$", out, re.M)
    assert held, out
    stock, tiered = float(held.group(1)), float(held.group(2))
    assert 0 < tiered < stock
    assert re.search(r"^answer\s+'.*'\s+'.*'$", out, re.M), out
    kl = re.search(r"KL\(stock \|\| tiered\) = ([\d.]+) nats", out)
    assert kl and float(kl.group(1)) < 1.0, out
