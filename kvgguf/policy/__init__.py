"""What the cache should hold: which token lives in which tier, with which codec.

Pure Python decisions (``tiered``: the configuration and its presets; ``codec_spec``: which
codec each layer's K and V use; ``plan``: which rows to evict and which blocks to age;
``allocation``: one codec per (layer, K/V) under a bit budget, from measured error curves),
testable without llama.cpp. Imports ``kvgguf.bindings.codecs``
only to check codec names; the runtime carries the plans out.
"""
