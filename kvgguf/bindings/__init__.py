"""Bindings to libkvgguf, the C codec and store library (``native/`` in the source tree).

Owns: loading the library with cffi (``binding``), the stateless codecs on numpy arrays
(``codecs``) and the store of compressed K/V rows per layer, kind (K or V) and tier (``store``).
Imports only ``kvgguf.enums`` (K/V and tiers): it knows neither llama.cpp nor policy.
"""
