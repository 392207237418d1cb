"""A chat far past n_ctx: --times x n_ctx tokens of conversation with context_shift=True, through
create_chat_completion (every turn sends the whole conversation, as a chat application does)
and through `kvgguf chat` in a terminal (a pseudo-terminal here, one message a line).

Each turn is a stretch of WikiText-2 for the user and a reply of up to --reply tokens. It
reports whether any turn raised, the resident memory (RSS) after each turn, the context shifts,
and the tokens evaluated against the conversation's length (a turn that reuses the shifted
context evaluates its own tokens, not the conversation again).

    .venv/bin/python benchmarks/endurance.py --out benchmarks/results/endurance/endurance_smollm2_1k

writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from common import add_out_option, add_threads_option, command, markdown_table, progress, rss_bytes, write_result

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MIB = 2**20
TURN_CHARS = 400  # about 100 tokens of WikiText-2 a turn


def turns(n: int) -> list[str]:
    from kvgguf.evaluation.text import wikitext2_test

    text = " ".join(wikitext2_test().split())
    return [text[i * TURN_CHARS : (i + 1) * TURN_CHARS] for i in range(n)]


def through_api(model: str, kv_codec: str, n_ctx: int, times: int, reply: int, threads: int) -> dict:
    import kvgguf

    llm = kvgguf.Llama(
        str(kvgguf.models.path(model)),
        kv_codec=kv_codec,
        n_ctx=n_ctx,
        context_shift=True,
        n_threads=threads,
        n_threads_batch=threads,
        seed=0,
        verbose=False,
    )
    messages, rss, conversation, error, t0 = [], [], 0, None, time.perf_counter()
    for i, text in enumerate(turns(100 * times)):
        messages.append({"role": "user", "content": text})
        try:
            out = llm.create_chat_completion(messages, max_tokens=reply, temperature=0.0)
        except Exception as e:  # the finding: reported, not raised
            error = f"turn {i}: {type(e).__name__}: {e}"
            break
        messages.append(out["choices"][0]["message"])
        conversation = out["usage"]["total_tokens"]
        rss.append(rss_bytes())
        if conversation >= times * n_ctx:
            break
    result = {
        "turns": len(rss),
        "conversation_tokens": conversation,
        "tokens_evaluated": llm.tokens_evaluated,
        "context_shifts": llm.context_shifts,
        "error": error,
        "rss_mib": [round(r / MIB, 1) for r in rss],
        "seconds": time.perf_counter() - t0,
        "kv": str(llm.kv_memory()),
    }
    llm.close()
    return result


def read_until_prompt(fd: int, proc: subprocess.Popen, timeout: float) -> str:
    """What the chat printed up to its next "> " prompt (or its exit)."""
    got, end = b"", time.time() + timeout
    while time.time() < end and proc.poll() is None:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                got += os.read(fd, 65536)
            except OSError:
                break
            if got.endswith(b"> "):
                break
    return got.decode("utf-8", "replace")


def through_cli(model: str, kv_codec: str, n_ctx: int, times: int, reply: int, threads: int) -> dict:
    """`kvgguf chat` on a pseudo-terminal: a line a turn, the next once it prompts again."""
    cmd = [str(Path(sys.executable).with_name("kvgguf")), "chat", model, "--kv-codec", kv_codec, "-c", str(n_ctx)]
    cmd += ["-n", str(reply), "--temp", "0", "--seed", "0", "-t", str(threads)]
    main, child = pty.openpty()  # stderr too: input() prompts there when it is not a terminal
    proc = subprocess.Popen(cmd, stdin=child, stdout=child, stderr=child, cwd=ROOT)
    os.close(child)
    rss, said, t0 = [], 0, time.perf_counter()
    printed = [read_until_prompt(main, proc, 600)]
    for text in turns(100 * times):
        os.write(main, (text + "\n").encode())
        said += len(text)
        printed.append(read_until_prompt(main, proc, 600))
        if proc.poll() is not None:
            break
        rss.append(rss_bytes(proc.pid))
        if said >= times * n_ctx * 4:  # about 4 characters a token, the replies not counted
            break
    os.write(main, b"/stats\n")
    stats = read_until_prompt(main, proc, 60)
    os.write(main, b"/quit\n")
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()
    os.close(main)
    err = "".join(printed)
    return {
        "turns": len(rss),
        "user_characters": said,
        "exit_code": proc.returncode,
        "error": None if proc.returncode == 0 and "Traceback" not in err else err[-2000:],
        "rss_mib": [round(r / MIB, 1) for r in rss],
        "stats": stats.strip()[:2000],
        "seconds": time.perf_counter() - t0,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="model name (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=1024, help="n_ctx (default: %(default)s)")
    p.add_argument("--times", type=int, default=10, help="conversation length in n_ctx (default: %(default)s)")
    p.add_argument("--reply", type=int, default=64, help="tokens a reply may take (default: %(default)s)")
    p.add_argument("--kv-codec", default="tiered", help="kv_codec (default: %(default)s)")
    p.add_argument("--ways", default="api,cli", help="api, cli or both (default: %(default)s)")
    add_threads_option(p)
    add_out_option(p)
    a = p.parse_args(argv)
    result = {
        "model": a.model,
        "n_ctx": a.ctx,
        "times": a.times,
        "kv_codec": a.kv_codec,
        "command": command(__file__, argv),
    }
    rows = []
    if "api" in a.ways:
        progress(f"endurance: create_chat_completion, {a.times} x {a.ctx} tokens")
        result["api"] = r = through_api(a.model, a.kv_codec, a.ctx, a.times, a.reply, a.threads)
        rows.append(
            [
                "create_chat_completion",
                r["turns"],
                r["conversation_tokens"],
                r["tokens_evaluated"],
                r["context_shifts"],
                *rss_marks(r["rss_mib"]),
                "no" if r["error"] is None else r["error"],
            ]
        )
    if "cli" in a.ways:
        progress(f"endurance: kvgguf chat, {a.times} x {a.ctx} tokens")
        result["cli"] = r = through_cli(a.model, a.kv_codec, a.ctx, a.times, a.reply, a.threads)
        rows.append(
            [
                "kvgguf chat",
                r["turns"],
                "",
                "",
                "",
                *rss_marks(r["rss_mib"]),
                "no" if r["error"] is None else "yes (see the JSON)",
            ]
        )
    table = markdown_table(
        [
            "through",
            "turns",
            "conversation tokens",
            "tokens evaluated",
            "shifts",
            "RSS MiB after turn 1",
            "at half",
            "at the end",
            "raised",
        ],
        rows,
    )
    md = (
        f"# A chat of {a.times} x n_ctx: {a.model}, n_ctx {a.ctx}, `{a.kv_codec}`, context_shift=True\n\n"
        f"`{result['command']}`\n\n{table}\n"
    )
    write_result(a.out, result, md, a.threads)
    print(md)
    return 0 if all(result.get(w, {}).get("error") is None for w in ("api", "cli")) else 1


def rss_marks(rss: list) -> list:
    if not rss:
        return ["", "", ""]
    return [rss[0], rss[len(rss) // 2], rss[-1]]


if __name__ == "__main__":
    sys.exit(main())
