"""Measuring quality: docs/design.md's evaluation protocol and the text it is measured on.

Owns: the harness (``harness``: KL, top-1 and perplexity against the f16 cache, llama.cpp's
own cache types side by side), long-range recall (``retrieval``), calibration per model
(``calibration``: what each layer's K and V codec costs, measured through the live cache, for
``kv_codec="auto"``) and the shipped evaluation text (``text``). Imports the facade.
"""
