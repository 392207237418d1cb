"""kvgguf: KV-cache compression for llama.cpp and GGUF models.

Importing kvgguf makes llama-cpp-python use kvgguf's patched llama.cpp, so import it
before llama_cpp.
"""

from ._llama_lib import bind as _bind

_bind()

from . import codecs, models  # noqa: E402
from .llama import Llama  # noqa: E402
from .memory import KVMemory  # noqa: E402
from .tiered import TieredConfig  # noqa: E402
from .session import SessionCorruptError, SessionError, SessionMismatchError, SessionVersionError  # noqa: E402
from .session.prompt_cache import CompressedDiskCache, CompressedRAMCache  # noqa: E402
from .session.session import SessionInfo  # noqa: E402
from ._llama_lib import library_path as llama_library_path  # noqa: E402
from ._llama_lib import patch_version as llama_patch_version  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "Llama", "TieredConfig", "KVMemory", "codecs", "models",
    "CompressedRAMCache", "CompressedDiskCache", "SessionInfo",
    "SessionError", "SessionCorruptError", "SessionMismatchError", "SessionVersionError",
    "llama_library_path", "llama_patch_version", "__version__",
]
