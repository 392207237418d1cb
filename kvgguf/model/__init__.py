"""Which model, and the shape of its KV cache.

Owns: where model files come from (``registry``: PyPI packages or a user's GGUF path),
the one reader of GGUF metadata (``gguf_file``, on the ``gguf`` package) and the KV shape
every byte count is computed from (``shape``). Imports nothing else from kvgguf.
"""
