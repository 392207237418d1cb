"""The command line: chat (through a pseudo-terminal and non-interactive), inspect, errors."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest


KVGGUF = shutil.which("kvgguf", path=str(Path(sys.executable).parent)) or "kvgguf"
HERE = Path(__file__).parent


def run_cli(*args, input_text=None):
    return subprocess.run([KVGGUF, *args], capture_output=True, text=True, input=input_text, timeout=300, cwd=HERE)


def spawn_chat(*args):
    """The chat in a terminal as a user's shell starts it: with Ctrl-C's signal at its default (a
    test run started in the background, e.g. `cmd &` from a script, inherits SIGINT ignored, and
    Python then never raises KeyboardInterrupt)."""
    child = pexpect.spawn(
        KVGGUF,
        ["chat", *args],
        cwd=str(HERE),
        encoding="utf-8",
        timeout=120,
        env=dict(os.environ, COLUMNS="200"),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    child.expect("> ")
    return child


@pytest.mark.model
def test_chat_in_a_terminal_streams_stats_resets_interrupts_and_quits():
    child = spawn_chat("--kv-codec", "tiered", "-c", "2048", "--temp", "0", "-n", "48", "-t", "2")
    child.sendline("What is the capital of France?")
    child.expect("> ")
    answer = child.before
    assert "Paris" in answer or len(answer.strip()) > 20
    child.sendline("/stats")
    child.expect(r"kv cache: size = [\d.]+ MiB \(hot q8_0")  # the preset's hot cells (issue 45)
    child.expect(r"tokens in context: (\d+) / 2048")
    assert int(child.match.group(1)) > 0
    child.expect("> ")
    child.sendline("/reset")
    child.expect(r"context reset \(0 tokens\)")
    child.expect("> ")
    # A long reply, stopped with Ctrl-C: the program stays and takes the next command.
    child.sendline("Write a very long story about a dragon, with many chapters.")
    child.expect_exact("many chapters.")  # the terminal's echo of the line, not yet the reply
    child.expect(r"\S", timeout=60)  # the reply has started streaming
    child.sendintr()
    child.expect(r"\[stopped\]")
    child.expect("> ")
    child.sendline("/help")
    child.expect("/stats")
    child.expect("> ")
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.model
def test_chat_saves_and_loads_a_conversation(tmp_path):
    child = spawn_chat("--kv-codec", "tiered", "-c", "1024", "--temp", "0", "-n", "16", "-t", "2")
    child.sendline("Name a color.")
    child.expect("> ")
    child.sendline(f"/save {tmp_path / 'chat.kvz'}")
    child.expect(r"saved (\d+) tokens to .*chat\.kvz \([\d.]+ MiB")
    saved = int(child.match.group(1))
    assert saved > 0 and (tmp_path / "chat.kvz").exists()
    child.expect("> ")
    child.sendline("/reset")
    child.expect(r"context reset \(0 tokens\)")
    child.expect("> ")
    child.sendline(f"/load {tmp_path / 'missing.kvz'}")
    child.expect("/load failed, the conversation is unchanged")
    child.expect("> ")
    child.sendline(f"/load {tmp_path / 'chat.kvz'}")
    child.expect(r"loaded (\d+) tokens, 2 messages")
    assert int(child.match.group(1)) == saved
    child.expect("> ")
    child.sendline("/stats")
    child.expect(r"tokens in context: (\d+) / 1024")
    assert int(child.match.group(1)) == saved
    child.expect("> ")
    child.sendline("And another one?")  # the conversation goes on from the loaded context
    child.expect("> ")
    assert len(child.before.strip()) > 0
    child.sendline("/quit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.model
def test_chat_exits_on_ctrl_d():
    child = spawn_chat("-c", "512")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


@pytest.mark.model
def test_chat_non_interactive_prompt_goes_to_stdout_logs_to_stderr():
    out = run_cli("chat", "-p", "Say hello.", "--temp", "0", "-n", "16", "-c", "512")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "kv cache" not in out.stdout and "kvgguf chat:" in out.stderr
    piped = run_cli("chat", "--temp", "0", "-n", "8", "-c", "512", input_text="Say hello.\n")
    assert piped.returncode == 0 and piped.stdout.strip()


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["chat", "--kv-codec", "rotq9"],
            "'rotq9' is not a kv codec; choose one of: tiered, tiered:fixed, tiered:keep=SIGNAL[:FRACTION], auto, auto:BITS, auto:held=BITS, f16",
        ),
        (["chat", "-ctk", "q3"], "'q3' is not a cache type; choose one of: f32, f16"),
        (["chat", "-c", "0"], "argument -c/--ctx-size: must be > 0"),
        (["chat", "--bogus"], "unrecognized arguments: --bogus"),
        (["chat", "/no/such/model.gguf"], "neither a known name"),
        (["inspect", "/no/such/model.gguf"], "neither a known name"),
    ],
)
def test_bad_flags_and_missing_models_exit_2_with_a_clear_message(args, message):
    out = run_cli(*args)
    assert out.returncode == 2
    assert message in out.stderr


@pytest.mark.model
def test_chat_shifts_past_its_context_unless_told_not_to():
    long_prompt = "Summarize this. " + "The quick brown fox jumps over the lazy dog. " * 40  # over 256 tokens
    out = run_cli("chat", "--kv-codec", "tiered", "-p", long_prompt, "--temp", "0", "-n", "8", "-c", "256", "-t", "2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    refused = run_cli("chat", "--no-context-shift", "-p", long_prompt, "--temp", "0", "-n", "8", "-c", "256")
    assert refused.returncode != 0 and "context_shift=True" in refused.stderr
