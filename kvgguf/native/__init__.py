"""Bindings to libkvgguf, the C codec and store library (``native/`` in the source tree).

Owns: loading the library with cffi (``binding``), the stateless codecs on numpy arrays
(``codecs``) and the store of compressed K/V rows per layer, kind and tier (``store``).
Imports nothing else from kvgguf: it knows neither llama.cpp nor policy.
"""
