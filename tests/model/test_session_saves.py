"""Saving what a user holds: a per-layer cache (calibrated, auto or written by hand) through
sessions, prompt caches and the chat's save; save targets that are not regular files, errors
that name the path given, the umask; and a full disk, which skips the cache write and not the
completion."""

import io
import os
import stat
import subprocess
import warnings

import numpy as np
import pytest

from kvgguf import CompressedDiskCache, CompressedRAMCache, Llama, TieredConfig
from kvgguf.cli.chat import ChatSession
from kvgguf.evaluation.harness import kl_top1
from kvgguf.evaluation.text import wikitext2_test
from helpers import wikitext_tokens

KW = dict(n_threads=2, n_threads_batch=2, verbose=False, flash_attn=True)
# The three ways a user reaches a per-layer config (a dict keyed by layer numbers and "default").
PER_LAYER = {
    "tiered-calibrated": "tiered",
    "auto": "auto:3.0",
    "hand-written": TieredConfig(warm={0: "rotq3", "default": "rotq4"}),
}


@pytest.fixture(scope="module")
def tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 6000)


def make(path, kv_codec, n_ctx=1024):
    return Llama(str(path), kv_codec=kv_codec, n_ctx=n_ctx, **KW)


def scores(llm, toks):
    return np.concatenate([lg.copy() for _, lg in llm.eval_logits(toks)])


# A per-layer cache saves, loads and continues


@pytest.mark.parametrize("name", PER_LAYER)
def test_a_per_layer_cache_saves_and_continues_as_if_never_saved(smollm2_path, tokens, tmp_path, calibrated, name):
    prompt, more = tokens[:400], tokens[400:440]
    src = make(smollm2_path, PER_LAYER[name])
    assert isinstance(src.kv_config.warm, dict), "the case under test is a per-layer config"
    src.eval(prompt)
    assert src.kv_memory().cold_bytes > 0
    src.save_session(tmp_path / "exact.kvz", exact=True)
    info = src.save_session(tmp_path / "coded.kvz")  # the hot rows coded with the per-layer warm codecs
    assert info.codec.startswith("per layer")
    state = src.save_state()
    want = scores(src, more)

    for restore in ("exact.kvz", "state"):
        dst = make(smollm2_path, PER_LAYER[name])
        if restore == "state":
            dst.load_state(state)
        else:
            dst.load_session(tmp_path / restore)
        assert dst.n_tokens == 400
        np.testing.assert_array_equal(scores(dst, more), want)  # bit for bit: nothing lost
    dst = make(smollm2_path, PER_LAYER[name])
    dst.load_session(tmp_path / "coded.kvz")
    assert kl_top1(want, scores(dst, more))[0] < 0.1


@pytest.mark.parametrize("name", PER_LAYER)
def test_compressed_prompt_caches_serve_a_per_layer_cache(smollm2_path, tokens, tmp_path, calibrated, name):
    llm = make(smollm2_path, PER_LAYER[name])
    text = llm.detokenize(tokens[:350]).decode("utf-8", "ignore")
    caches = [CompressedRAMCache(64 << 20), CompressedDiskCache(tmp_path / "prompts", 64 << 20)]
    for cache in caches:
        llm.reset()
        llm.set_cache(cache)
        first = llm.create_completion(text, max_tokens=2, temperature=0.0)
        assert cache.cache_size > 0
        before = llm.tokens_evaluated
        again = llm.create_completion(text, max_tokens=2, temperature=0.0)
        # the tokens after the last multiple of n_batch go again, in one batch, as a fresh
        # context evaluates them (docs/live-cache.md, "A prompt that shares a prefix")
        assert llm.tokens_evaluated - before < llm.n_batch + 10, "the cached prompt was evaluated again"
        assert again["choices"][0]["text"] == first["choices"][0]["text"]


def test_the_chats_save_keeps_a_calibrated_conversation(smollm2_path, tmp_path, calibrated):
    llm = make(smollm2_path, "tiered")
    assert isinstance(llm.kv_config.warm, dict)
    out = io.StringIO()
    chat = ChatSession(llm, system=wikitext2_test()[:1500], max_tokens=8, sampling={"temperature": 0.0}, out=out)
    chat.reply("Name a colour.")
    assert llm.kv_memory().cold_bytes > 0
    assert chat.command(f"/save {tmp_path / 'chat.kvz'}") is True
    assert "saved" in out.getvalue() and (tmp_path / "chat.kvz").exists()
    # a save that fails (here: into a folder) is reported, and the chat goes on
    assert chat.command(f"/save {tmp_path}") is True
    assert "/save failed, the conversation goes on" in out.getvalue()
    n = llm.n_tokens
    chat.reset()
    assert chat.command(f"/load {tmp_path / 'chat.kvz'}") is True
    assert llm.n_tokens == n and chat.messages[-1]["role"] == "assistant"


# Save targets: only regular files; errors name the path given


@pytest.fixture(scope="module")
def small(smollm2_path, tokens):
    llm = make(smollm2_path, None, n_ctx=256)
    llm.eval(tokens[:20])
    return llm


@pytest.mark.parametrize("target", ["device", "fifo", "folder"])
def test_a_save_never_replaces_what_is_not_a_regular_file(small, tmp_path, target):
    # Nodes of the test's own: a regression must not replace the machine's /dev/full or /dev/null.
    path = tmp_path / target
    if target == "device":
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # what /dev/full is
        except PermissionError:
            pytest.skip("making a device node needs root")
    elif target == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    mode = path.stat().st_mode
    with pytest.raises(ValueError, match=f"{path} exists and is not a regular file"):
        small.save_session(path)
    assert path.stat().st_mode == mode  # still the device (fifo, folder) it was


def test_save_errors_name_the_path_given_not_a_temporary_file(small, tmp_path):
    with pytest.raises(ValueError, match="the file path is empty"):
        small.save_session("")
    missing = tmp_path / "no-such-folder" / "s.kvz"
    with pytest.raises(FileNotFoundError) as e:
        small.save_session(missing)
    assert e.value.filename == str(missing) and ".tmp" not in str(e.value)
    if os.geteuid() != 0:  # root writes into read-only folders
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o500)
        with pytest.raises(PermissionError) as e:
            small.save_session(ro / "s.kvz")
        assert e.value.filename == str(ro / "s.kvz") and ".tmp" not in str(e.value)
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_a_save_through_a_symlink_replaces_the_file_it_names(small, tmp_path):
    real = tmp_path / "real.kvz"
    real.write_bytes(b"old")
    (tmp_path / "link.kvz").symlink_to(real)
    small.save_session(tmp_path / "link.kvz")
    assert (tmp_path / "link.kvz").is_symlink() and real.stat().st_size > 3


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_session_files_follow_the_umask(small, tmp_path, umask):
    old = os.umask(umask)
    try:
        small.save_session(tmp_path / "s.kvz")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "s.kvz").stat().st_mode) == 0o666 & ~umask
    os.chmod(tmp_path / "s.kvz", 0o640)  # an existing file keeps its mode
    small.save_session(tmp_path / "s.kvz")
    assert stat.S_IMODE((tmp_path / "s.kvz").stat().st_mode) == 0o640


# A full disk skips the prompt cache write, not the completion


@pytest.fixture
def full_disk(tmp_path):
    """A 64 KiB tmpfs: a real ENOSPC (needs mount rights: root, as CI runs)."""
    where = tmp_path / "full"
    where.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {proc.stderr.decode().strip()}")
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_disk_answers_the_completion_and_skips_the_cache_write(smollm2_path, tokens, full_disk):
    llm = make(smollm2_path, "tiered")
    llm.set_cache(CompressedDiskCache(full_disk / "prompts", 1 << 30))
    text = llm.detokenize(tokens[:300]).decode("utf-8", "ignore")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = llm.create_completion(text, max_tokens=2, temperature=0.0)
        llm.create_completion(text + " More.", max_tokens=2, temperature=0.0)
    assert out["choices"][0]["text"] is not None
    cache_warnings = [w for w in caught if "could not store a prompt" in str(w.message)]
    assert len(cache_warnings) == 1, [str(w.message) for w in caught]
    assert "No space left on device" in str(cache_warnings[0].message)
    assert list((full_disk / "prompts").iterdir()) == []  # no stray or partial files


# Labels come from the rows held


def test_memory_labels_name_the_codec_of_the_rows_held(smollm2_path, tokens, tmp_path):
    src = make(smollm2_path, "rotq4")
    src.eval(tokens[:400])
    src.save_session(tmp_path / "s.kvz")
    dst = make(smollm2_path, "rotq3")
    assert dst.kv_memory().by_tier["warm"].codec == "rotq3"  # nothing held yet: the config's
    dst.load_session(tmp_path / "s.kvz")
    assert dst.kv_memory().by_tier["warm"].codec == "rotq4"
    dst.eval(tokens[400:500])  # new rows are coded rotq3 beside the loaded rotq4 ones
    assert dst.kv_memory().by_tier["warm"].codec == "rotq3+rotq4"
