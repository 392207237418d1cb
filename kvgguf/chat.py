"""`kvgguf chat`: an interactive chat in the terminal, in the manner of llama.cpp's CLI."""

from __future__ import annotations

import sys
import time

HELP = """commands:
  /stats        KV memory per tier, bits per value, tokens in context, last token rate
  /save FILE    save the conversation and its KV cache, compressed (.kvz)
  /load FILE    load a saved conversation (the same model)
  /reset        forget the conversation and empty the context
  /help         this text
  /quit         leave (Ctrl-D too); Ctrl-C stops a reply"""

# Fallbacks when the GGUF carries no chat template, by architecture (llama.cpp's CLI also
# falls back to ChatML).
FALLBACK_CHAT_FORMAT = {"gemma3": "gemma", "gemma2": "gemma"}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class ChatSession:
    def __init__(self, llm, *, system=None, max_tokens=512, sampling=None, out=sys.stdout):
        self.llm = llm
        self.system = system
        self.max_tokens = max_tokens
        self.sampling = sampling or {}
        self.out = out
        self.messages = []
        self.last_rate = None
        self.reset()

    def reset(self) -> None:
        self.messages = [{"role": "system", "content": self.system}] if self.system else []
        self.llm.reset()

    def reply(self, user_text: str) -> str:
        """Streams the model's answer to `out`; Ctrl-C stops it and keeps what was said."""
        self.messages.append({"role": "user", "content": user_text})
        parts = []
        n = 0
        t0 = time.perf_counter()
        try:
            stream = self.llm.create_chat_completion(
                messages=self.messages, max_tokens=self.max_tokens, stream=True, **self.sampling
            )
            for chunk in stream:
                piece = chunk["choices"][0]["delta"].get("content")
                if piece:
                    parts.append(piece)
                    n += 1
                    self.out.write(piece)
                    self.out.flush()
        except KeyboardInterrupt:
            self.out.write(" [stopped]")
        dt = time.perf_counter() - t0
        self.last_rate = n / dt if dt > 0 else None
        self.out.write("\n")
        self.out.flush()
        text = "".join(parts)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def save(self, path: str) -> None:
        try:
            info = self.llm.save_session(path, app={"chat_messages": self.messages})
        except (OSError, ValueError) as e:
            print(f"/save failed: {e}", file=self.out)
            return
        print(f"saved {info.n_tokens} tokens to {path} ({info.file_bytes / 2**20:.2f} MiB, {info.codec})",
              file=self.out)

    def load(self, path: str) -> None:
        from .session import SessionError

        try:
            info = self.llm.load_session(path)
        except (OSError, SessionError) as e:
            print(f"/load failed, the conversation is unchanged: {e}", file=self.out)
            return
        messages = (info.app or {}).get("chat_messages")
        self.messages = list(messages) if isinstance(messages, list) else []
        print(f"loaded {info.n_tokens} tokens, {len(self.messages)} messages from {path}", file=self.out)

    def stats(self) -> str:
        mem = self.llm.kv_memory()
        rate = f"{self.last_rate:.1f} tokens/s" if self.last_rate else "n/a"
        return f"{mem}\ntokens in context: {self.llm.n_tokens} / {self.llm.n_ctx()}, last reply: {rate}"

    def command(self, line: str) -> bool:
        """Runs a slash command; returns False when the chat should end."""
        name, _, arg = line.strip().partition(" ")
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            print(HELP, file=self.out)
        elif name == "/stats":
            print(self.stats(), file=self.out)
        elif name == "/reset":
            self.reset()
            print(f"context reset ({self.llm.n_tokens} tokens)", file=self.out)
        elif name in ("/save", "/load"):
            if not arg.strip():
                print(f"{name} needs a file name", file=self.out)
            else:
                self.save(arg.strip()) if name == "/save" else self.load(arg.strip())
        else:
            print(f"unknown command {name!r}; /help lists them", file=self.out)
        self.out.flush()
        return True


def run_interactive(session: ChatSession) -> int:
    log("kvgguf chat: type a message, /help for commands, Ctrl-C stops a reply, Ctrl-D or /quit exits")
    while True:
        try:
            line = input("> ")
        except EOFError:
            print(file=session.out)
            return 0
        except KeyboardInterrupt:
            print(file=session.out)
            continue
        if not line.strip():
            continue
        if line.startswith("/"):
            if not session.command(line):
                return 0
            continue
        session.reply(line)
