import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvgguf  # noqa: F401  (first: binds llama_cpp to kvgguf's patched llama.cpp)


@pytest.fixture(scope="session")
def smollm2_path():
    import kvgguf

    return kvgguf.models.path("smollm2-135m")


@pytest.fixture(scope="session")
def gemma3_path():
    import kvgguf

    return kvgguf.models.path("gemma3-270m")


def run_python(code: str, env_update=None, env_remove=()):
    """Runs `code` in a fresh interpreter (module state such as a loaded libllama is per process)."""
    env = dict(os.environ)
    for k in env_remove:
        env.pop(k, None)
    env.update(env_update or {})
    # Run outside the source tree, or `import kvgguf` would find the uninstalled sources.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300, cwd=Path(__file__).parent)
