"""Measuring quality: DESIGN.md's evaluation protocol and the text it is measured on.

Owns: the harness (``harness``: KL, top-1 and perplexity against the f16 cache, llama.cpp's
own cache types side by side) and the shipped evaluation text (``text``). Imports the facade.
"""
