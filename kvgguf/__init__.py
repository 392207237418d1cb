"""kvgguf: KV-cache compression for llama.cpp and GGUF models.

Importing kvgguf makes llama-cpp-python use kvgguf's patched llama.cpp, so import it
before llama_cpp.

Layers, top to bottom (each imports only those below it; docs/design.md is their one
description, docs/data-path.md follows a token through them):

- ``kvgguf.cli``: the ``kvgguf`` command; ``kvgguf.evaluation``: the quality harness and calibration.
- ``kvgguf.llama``: the facade, ``Llama`` (a drop-in ``llama_cpp.Llama``); ``kvgguf.installer``:
  ``install()``/``uninstall()``, the same cache for every ``llama_cpp.Llama`` a library builds.
- ``kvgguf.session``: .kvz session files and compressed prompt caches.
- ``kvgguf.runtime``: carries plans out against llama.cpp; memory reports; the call lock.
- ``kvgguf.llamacpp``: the patched llama.cpp (ctypes).
- ``kvgguf.policy``: which token lives in which tier, with which codec (pure Python).
- ``kvgguf.model``: model files, GGUF metadata, KV shape.
- ``kvgguf.bindings``: libkvgguf (cffi); ``kvgguf.enums``, ``kvgguf.errors``, ``kvgguf.files``.
"""

import sys as _sys

from .llamacpp.library import bind as _bind

_bind()

from .bindings import codecs  # noqa: E402
from .model import registry as models  # noqa: E402
from .llama import Llama  # noqa: E402
from .runtime.memory import KVMemory  # noqa: E402
from .policy.tiered import TieredConfig  # noqa: E402
from .errors import CalibrationError, SessionCorruptError, SessionError, SessionMismatchError, SessionVersionError  # noqa: E402
from .session.prompt_cache import CompressedDiskCache, CompressedRAMCache  # noqa: E402
from .session.session import SessionInfo  # noqa: E402
from .llamacpp.library import library_path as llama_library_path  # noqa: E402
from .llamacpp.library import patch_version as llama_patch_version  # noqa: E402
from .installer import install, uninstall  # noqa: E402
from .installer import install_from_environment as _install_from_environment  # noqa: E402

# The documented short names are modules too, so `import kvgguf.codecs` and
# `from kvgguf.models import path` work as they read (as `os.path` names posixpath).
_sys.modules[__name__ + ".codecs"] = codecs
_sys.modules[__name__ + ".models"] = models

_install_from_environment()  # KVGGUF_KV_CODEC=tiered: every llama_cpp.Llama gets the compressed cache

__version__ = "0.1.0"

__all__ = [
    "Llama",
    "TieredConfig",
    "KVMemory",
    "codecs",
    "models",
    "CompressedRAMCache",
    "CompressedDiskCache",
    "SessionInfo",
    "SessionError",
    "SessionCorruptError",
    "SessionMismatchError",
    "SessionVersionError",
    "CalibrationError",
    "llama_library_path",
    "llama_patch_version",
    "install",
    "uninstall",
    "__version__",
]
