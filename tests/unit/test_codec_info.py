"""What the library says a codec is (kvg_codec_describe, codecs.info) against what the codec does:
the shapes it takes, whether it needs a book, its kernels; and the Python lists that follow it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings import binding
from kvgguf.policy import calibration_plan, kv_codec

from conftest import run_python

NAMES = codecs.names()
HEAD_DIMS = list(range(1, 530)) + [1023, 1024, 1025, 2047, 2048, 4095, 4096, 4097, 8192]  # wfq: 16..512


@pytest.mark.parametrize("name", NAMES)
def test_names_families_and_bits_follow_the_naming(name):
    i = codecs.info(name)
    assert i.name == name and codecs.get(name).info is i
    # the family is the name without its bit width (f16 is f16), the bits that width (vq8f: vq8's 8)
    assert i.family == codecs.family(name) == ("f16" if name == "f16" else name.rstrip("0123456789"))
    assert i.bits == codecs.get(name).bits == int(re.search(r"\d+", name).group())
    assert i.book in (None, "codebook", "plan")
    assert i.head_dim_min >= 1 and (i.head_dim_max is None or i.head_dim_max >= i.head_dim_min)


@pytest.mark.parametrize("name", NAMES)
def test_head_dim_rule_is_what_encoded_size_takes(name):
    i = codecs.info(name)
    for kind in ("k", "v"):
        taken = [d for d in HEAD_DIMS if codecs.fits(name, d, kind)]
        assert taken == [d for d in HEAD_DIMS if i.takes_head_dim(d)], kind
    if i.rotated:  # codes of rotq's rotation: a Walsh-Hadamard transform
        assert i.head_dim_pow2


@pytest.mark.parametrize("name", NAMES)
def test_book_is_what_encoding_needs(name):
    i = codecs.info(name)
    d = 64
    x = np.random.default_rng(0).standard_normal((64, 2, d)).astype(np.float32)
    if i.book is None:
        codecs.get(name).encode(x)
        with pytest.raises(ValueError, match="keeps no codebook"):
            codecs.book_shape(name, 2, d)
        return
    with pytest.raises(ValueError):
        codecs.get(name).encode(x)  # no book given
    book = codecs.train_book(name, x)
    assert book.shape == codecs.book_shape(name, 2, d)
    buf = codecs.get(name, book=book).encode(x)
    assert len(buf) == codecs.get(name, book=book).encoded_size(x.shape)


@pytest.mark.parametrize("name", NAMES)
def test_kernels(name):
    i = codecs.info(name)
    assert i.simd_ops <= {"encode", "decode", "score", "accumulate"}
    # scalar always; the SIMD levels together, where any operation has a kernel
    assert i.simd_levels == ((0, 1, 2) if i.simd_ops else (0,))
    if not i.fused_codes:  # decoded, then exact dots: no attention kernel of its own
        assert not {"score", "accumulate"} & i.simd_ops


def test_lists_read_from_the_info():
    by_book = {b: tuple(n for n in NAMES if codecs.info(n).book == b) for b in ("codebook", "plan")}
    assert codecs.CODEBOOK_CODECS == by_book["codebook"] == ("pq2", "vq8", "vq8f")
    assert codecs.PLAN_CODECS == by_book["plan"] == ("wfq2", "wfq3", "wfq4")
    assert codecs.BOOK_CODECS == codecs.CODEBOOK_CODECS + codecs.PLAN_CODECS
    from kvgguf.bindings.codecs import BOOK_CODECS

    assert BOOK_CODECS == codecs.BOOK_CODECS
    with pytest.raises(AttributeError):
        codecs.NO_SUCH_LIST


def test_policy_lists_name_codecs_the_info_allows():
    """CANDIDATES and PRESET_SLOW_FAMILIES are choices, not codec facts; what they rest on is."""
    for name in calibration_plan.CANDIDATES:
        i = codecs.info(name)
        assert i.fused_codes and {"score", "accumulate"} <= i.simd_ops, name
    families = {codecs.family(n) for n in NAMES}
    assert set(kv_codec.PRESET_SLOW_FAMILIES) <= families


def test_describe_refuses_bad_arguments():
    ffi, lib = binding.get_ffi(), binding.get_lib()
    out = ffi.new("kvg_codec_info *")
    for t in (-1, lib.kvg_codec_count()):
        assert lib.kvg_codec_describe(t, out) == lib.KVG_ERR_UNKNOWN_CODEC
    assert lib.kvg_codec_describe(0, ffi.NULL) == lib.KVG_ERR_INVALID_ARG
    with pytest.raises(ValueError, match="unknown"):
        codecs.info("rotq5")


def test_importing_kvgguf_loads_no_library():
    """The lists are read from the library on first use, not at import."""
    out = run_python(
        "import kvgguf, kvgguf.policy.calibration_plan, kvgguf.cli.inspect\n"
        "from kvgguf.bindings import binding\n"
        "assert binding._lib is None\n"
        "from kvgguf.bindings.codecs import BOOK_CODECS\n"
        "assert binding._lib is not None and 'wfq2' in BOOK_CODECS\n"
    )
    assert out.returncode == 0, out.stderr
