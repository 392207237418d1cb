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
        except Exception as e:  # whatever went wrong, the conversation goes on: it is all the user has
            print(f"/save failed, the conversation goes on: {e}", file=self.out)
            return
        print(
            f"saved {info.n_tokens} tokens to {path} ({info.file_bytes / 2**20:.2f} MiB, {info.codec})", file=self.out
        )

    def load(self, path: str) -> None:
        from ..errors import SessionError

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


def run(args) -> int:
    import kvgguf

    from ..model.gguf_file import read_metadata

    path = kvgguf.models.path(args.model)
    kw = dict(n_ctx=args.ctx_size, seed=args.seed, verbose=False, flash_attn=args.flash_attn)
    if args.threads:
        kw.update(n_threads=args.threads, n_threads_batch=args.threads)
    meta = read_metadata(path)
    if "tokenizer.chat_template" not in meta:
        arch = meta.get("general.architecture", "")
        kw["chat_format"] = FALLBACK_CHAT_FORMAT.get(arch, "chatml")
        log(f"kvgguf chat: {path.name} has no chat template; using the {kw['chat_format']} format")
    if args.kv_codec:
        from ..policy.tiered import TieredConfig

        config = TieredConfig.parse(args.kv_codec)
        changes = {k: v for k, v in (("hot", args.hot), ("sinks", args.sinks)) if v is not None}
        if changes:
            from dataclasses import replace

            config = replace(config, **changes)
        kw["kv_codec"] = config if changes else args.kv_codec
    elif args.hot is not None or args.sinks is not None:
        raise ValueError("--hot and --sinks need --kv-codec")
    if args.cache_type_k:
        kw["type_k"] = args.cache_type_k
    if args.cache_type_v:
        kw["type_v"] = args.cache_type_v
    kw.update(context_shift=not args.no_context_shift, n_keep=args.keep)
    try:
        llm = kvgguf.Llama(str(path), **kw)
    except ValueError as e:
        if not kw["context_shift"] or not str(e).startswith("context_shift=True:"):
            raise
        log(f"kvgguf chat: {e}; the chat stops at the context size")
        llm = kvgguf.Llama(str(path), **{**kw, "context_shift": False})
    sampling = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p)
    session = ChatSession(llm, system=args.system, max_tokens=args.n_predict, sampling=sampling)
    log(f"kvgguf chat: {path.name}, {llm.kv_memory()}")
    if args.prompt is not None or not sys.stdin.isatty():
        text = args.prompt if args.prompt is not None else sys.stdin.read()
        session.reply(text.strip())
        return 0
    return run_interactive(session)
