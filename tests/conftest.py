import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvgguf  # noqa: F401  (first: binds llama_cpp to kvgguf's patched llama.cpp)

# Tests are in folders by kind (unit: no model; model; server; native; project: docs and layout);
# the helpers shared by all sit here, beside this file. A few tests reuse another's helpers
# (test_cli's run_cli, test_attend's builders), imported by module name from any folder.
KINDS = ("unit", "model", "server", "native", "project")
sys.path[:0] = [str(Path(__file__).parent / kind) for kind in KINDS]


@pytest.fixture(scope="session", autouse=True)
def own_cache_dir(tmp_path_factory):
    """kvgguf's cache folder for this test run (KVGGUF_CACHE_DIR; child processes inherit it), so
    a calibration the user measured does not change what kv_codec="tiered" holds in the tests.
    Its models folder is the user's (Gemma-3's GGUF is assembled there once)."""
    from kvgguf.model.registry import cache_dir

    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    folder = tmp_path_factory.mktemp("kvgguf-cache")
    (folder / "models").symlink_to(models, target_is_directory=True)
    saved = os.environ.get("KVGGUF_CACHE_DIR")
    os.environ["KVGGUF_CACHE_DIR"] = str(folder)
    yield folder
    if saved is None:
        os.environ.pop("KVGGUF_CACHE_DIR", None)
    else:
        os.environ["KVGGUF_CACHE_DIR"] = saved


@pytest.fixture(scope="session")
def smollm2_path():
    return kvgguf.models.path("smollm2-135m")


CALIBRATION_TOKENS = 200  # the least the measurement takes on SmolLM2 (hot 96, two blocks of 32) plus room


@pytest.fixture(scope="session")
def smollm2_calibration(smollm2_path, tmp_path_factory):
    """SmolLM2 measured on 200 tokens of its own text through the command line, as a user runs it."""
    from kvgguf.cli.main import main
    from kvgguf.policy import calibration_plan

    out = tmp_path_factory.mktemp("calibration") / "smollm2.json"
    assert (
        main(["calibrate", str(smollm2_path), "--tokens", str(CALIBRATION_TOKENS), "-t", "2", "--out", str(out)]) == 0
    )
    return calibration_plan.Calibration.load(out)


@pytest.fixture(scope="session")
def calibrated_cache_dir(smollm2_path, smollm2_calibration, own_cache_dir, tmp_path_factory):
    """A kvgguf cache folder as a user's is after one `kvgguf calibrate` of SmolLM2: from then on
    kv_codec="tiered" follows the calibration, with per-layer codecs. Point KVGGUF_CACHE_DIR here
    (the `calibrated` fixture; child processes through their environment)."""
    from kvgguf.model.registry import cache_dir, calibration_path

    folder = tmp_path_factory.mktemp("kvgguf-calibrated")
    (folder / "models").symlink_to(own_cache_dir / "models", target_is_directory=True)
    smollm2_calibration.save(folder / calibration_path(str(smollm2_path)).relative_to(cache_dir()))
    return folder


@pytest.fixture
def calibrated(calibrated_cache_dir, monkeypatch):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(calibrated_cache_dir))
    return calibrated_cache_dir


@pytest.fixture(scope="session")
def gemma3_path():
    return kvgguf.models.path("gemma3-270m")


def run_python(code: str, env_update=None, env_remove=()):
    """Runs `code` in a fresh interpreter (module state such as a loaded libllama is per process)."""
    env = dict(os.environ)
    for k in env_remove:
        env.pop(k, None)
    env.update(env_update or {})
    # Run outside the source tree, or `import kvgguf` would find the uninstalled sources.
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=Path(__file__).parent
    )


# Markers (pyproject.toml names them): `model` for every test that loads a real model (SmolLM2,
# Gemma-3 or a tiny one written from SmolLM2's tokenizer), set here from the fixtures a test
# uses; `slow` (over ~20 s each) set on the tests themselves. `pytest -m "not model"` is the
# inner loop's fast tier; the README's command runs everything.
MODEL_FIXTURES = {"smollm2_path", "gemma3_path", "calibrated", "calibrated_cache_dir", "smollm2_calibration"}
# A test that needs SmolLM2's calibration is slow: the fixture measures it (over 2 minutes)
SLOW_FIXTURES = {"calibrated", "calibrated_cache_dir", "smollm2_calibration"}


def _no_gpu_reason():
    """Why tests marked cuda cannot run here, or None: an NVIDIA GPU (nvidia-smi lists one) and nvcc."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no NVIDIA GPU here (nvidia-smi not found)"
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return f"no NVIDIA GPU here (nvidia-smi -L failed: {e})"
    if listed.returncode != 0 or "GPU" not in listed.stdout:
        return "no NVIDIA GPU here (nvidia-smi -L lists none)"
    if not (shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc") or os.environ.get("NVCC")):
        return "no nvcc here (set NVCC, or pip install nvidia-cuda-nvcc nvidia-cuda-runtime nvidia-cuda-cccl)"
    return None


def pytest_collection_modifyitems(config, items):
    if os.environ.get("KVGGUF_SANITIZED_LATER") == "1":  # .ci/run: scripts/sanitize.sh runs these, each test once
        from helpers import sanitized_files

        later = set(sanitized_files())
        left = [item for item in items if Path(item.fspath) in later]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if Path(item.fspath) not in later]
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    reason = _no_gpu_reason() if cuda_items else None
    for item in cuda_items:
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if MODEL_FIXTURES & fixtures:
            item.add_marker(pytest.mark.model)
        if SLOW_FIXTURES & fixtures:
            item.add_marker(pytest.mark.slow)
