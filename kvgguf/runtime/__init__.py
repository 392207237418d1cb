"""Carries the policy's plans out against a live llama.cpp context.

Owns: the live tiered cache (``live_cache``: reads rows out of llama.cpp, encodes them into
the store, removes and compacts cells, truncates, attaches the store to the patched
attention) and the memory report (``memory``). Imports bindings, llamacpp, model and policy.
"""
