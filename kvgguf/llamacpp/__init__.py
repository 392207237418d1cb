"""kvgguf's patched llama.cpp, seen from Python (ctypes, through llama-cpp-python).

Owns: binding llama_cpp to the patched libllama and checking its patch version
(``library``), the functions our patches add (``hooks``: cold-row hooks, reading rows,
compacting cells, bytes held) and the byte layout of llama.cpp's sequence state
(``state_format``). Imports only ``kvgguf.errors``; it knows nothing of codecs or policy.
"""
