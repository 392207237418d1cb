"""The ``kvgguf`` command: demo, chat, inspect and eval (one module per command).

Imports the facade and every layer below it; nothing imports the CLI.
"""

from .main import main

__all__ = ["main"]
