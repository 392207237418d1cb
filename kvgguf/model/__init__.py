"""Which model, and the shape of its KV cache.

Owns: where model files come from (``registry``: PyPI packages or a user's GGUF path),
the one reader of GGUF metadata (``gguf_file``, a walk of the file's header) and the KV shape
every byte count is computed from (``shape``). Imports nothing else from kvgguf.
"""
