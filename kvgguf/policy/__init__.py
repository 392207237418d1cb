"""What the cache should hold: which token lives in which tier, with which codec.

Pure Python decisions (``tiered``: the configuration and its presets; ``codec_spec``: which
codec each layer's K and V use; ``plan``: which rows to evict and which blocks to age;
``allocation``: one codec per (layer, K/V) under a bit budget, from measured error curves;
``calibration_plan``: a model's calibration as data, its file and its plan for a budget),
testable without llama.cpp. Imports ``kvgguf.enums`` (K/V, tiers), ``kvgguf.model`` (the GGUF's
digests, where a calibration lives) and, from the bindings, only ``codecs``: the codec catalogue
(names, bytes per block) that configs and plans are checked against. The runtime carries the
plans out.
"""
