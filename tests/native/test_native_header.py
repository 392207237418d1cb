"""The cffi declarations are the real header: they parse, resolve in the loaded library, and
agree with the C compiler and with the Python side."""

from __future__ import annotations

import re
import shutil
import subprocess

import cffi
import pytest

from kvgguf import codecs
from kvgguf.bindings import binding as _native

from conftest import run_python


def region() -> str:
    return _native.cdef_source(_native.header_path())


def strip_comments(src: str) -> str:
    src = re.sub(r"//[^\n]*", "", src)
    return re.sub(r"/\*.*?\*/", "", src, flags=re.S)


def declared_functions(src: str) -> list[str]:
    src = re.sub(r"\{[^{}]*\}", "", strip_comments(src))  # drop enum and struct bodies
    names = []
    for decl in src.split(";"):
        m = re.search(r"(\w+)\s*\(", decl)
        if m:
            names.append(m.group(1))
    return names


def test_region_is_plain_declarations():
    src = region()
    assert src.strip(), "empty cffi region"
    for line in src.splitlines():
        assert not line.lstrip().startswith("#"), f"preprocessor line in the cffi region: {line!r}"
    code = strip_comments(src)
    assert "__attribute__" not in code and "__declspec" not in code
    macros = set(re.findall(r"#\s*define\s+(\w+)", _native.header_path().read_text()))
    used = macros & set(re.findall(r"\w+", code))
    assert not used, f"macros used inside the cffi region: {sorted(used)}"


def test_region_parses_with_a_fresh_ffi():
    ffi = cffi.FFI()
    ffi.cdef(region())
    fields = dict(ffi.typeof("kvg_codec_params").fields)
    assert fields["group_size"].type.cname == "int32_t"
    assert fields["seed"].type.cname == "uint64_t"


def test_every_declared_function_resolves():
    names = declared_functions(region())
    assert len(names) >= 14
    assert {"kvg_encode", "kvg_decode", "kvg_encoded_size", "kvg_strerror"} <= set(names)
    lib = _native.get_lib()
    for name in names:
        assert callable(getattr(lib, name)), name


def test_codec_enum_matches_names():
    ffi = _native.get_ffi()
    enum = ffi.typeof("enum kvg_codec_type").elements  # value -> C name
    from_enum = [enum[v][len("KVG_CODEC_") :].lower() for v in sorted(enum)]
    assert sorted(enum) == list(range(len(enum)))
    assert from_enum == codecs.names()
    lib = _native.get_lib()
    assert lib.kvg_codec_count() == len(enum)


def test_kind_and_tier_enums_match_the_header():
    """kvgguf.enums is Python's one definition of K/V and the tiers; C's must be the same numbers."""
    from kvgguf.enums import Kind, Tier

    ffi = _native.get_ffi()
    kinds = ffi.typeof("enum kvg_kind").elements
    tiers = {v: n for v, n in ffi.typeof("enum kvg_tier").elements.items() if n != "KVG_TIER_COUNT"}
    assert {int(k): f"KVG_KIND_{k.name}" for k in Kind} == kinds
    assert {int(t): f"KVG_TIER_{t.name}" for t in Tier} == tiers
    assert Kind.of("value") is Kind.V and Kind.of(0) is Kind.K and Tier.ARCHIVE.label == "archive"
    for bad in ("x", 2, True, 0.0, None):
        with pytest.raises(ValueError, match="kind"):
            Kind.of(bad)


def test_status_enum_matches_python_errors():
    ffi, lib = _native.get_ffi(), _native.get_lib()
    statuses = ffi.typeof("enum kvg_status").elements
    errors = {v for v in statuses if v != 0}
    assert errors == set(_native._STATUS_CLASS)
    strings = set()
    for v in statuses:
        s = ffi.string(lib.kvg_strerror(v)).decode()
        assert s and s != "unknown status"
        strings.add(s)
    assert len(strings) == len(statuses)
    assert ffi.string(lib.kvg_strerror(12345)).decode() == "unknown status"
    with pytest.raises(_native.KvgCorruptError):
        _native.check(lib.KVG_ERR_CORRUPT)
    assert _native.check(0) == 0


def test_default_params_match_header_macros():
    ffi, lib = _native.get_ffi(), _native.get_lib()
    p = ffi.new("kvg_codec_params *")
    lib.kvg_codec_default_params(p)
    text = _native.header_path().read_text()
    assert p.group_size == int(re.search(r"#define KVG_DEFAULT_GROUP_SIZE\s+(\d+)", text).group(1))
    assert p.seed == int(re.search(r"#define KVG_DEFAULT_SEED\s+(0x[0-9a-fA-F]+)ULL", text).group(1), 16)


@pytest.mark.parametrize("lang,compiler,std", [("c", "cc", "-std=c11"), ("c++", "c++", "-std=c++11")])
def test_header_compiles_cleanly(tmp_path, lang, compiler, std):
    exe = shutil.which(compiler) or shutil.which({"cc": "gcc", "c++": "g++"}[compiler])
    if exe is None:
        pytest.skip(f"no {lang} compiler on PATH")
    src = tmp_path / ("t.c" if lang == "c" else "t.cpp")
    src.write_text('#include "kvgguf.h"\nint main(void) { return kvg_codec_count() > 0 ? 0 : 1; }\n')
    cmd = [
        exe,
        std,
        "-Wall",
        "-Wextra",
        "-Werror",
        "-pedantic",
        "-fsyntax-only",
        f"-I{_native.header_path().parent}",
        str(src),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_struct_layouts_match_the_compiler(tmp_path):
    """cffi lays out the header's structs itself (ABI mode): every size and field offset must be
    the C compiler's, or a call would read the fields of another layout."""
    exe = shutil.which("cc") or shutil.which("gcc")
    if exe is None:
        pytest.skip("no C compiler on PATH")
    ffi = _native.get_ffi()
    structs = re.findall(r"typedef struct (\w+) \{", strip_comments(region()))
    assert "kvg_codec_info" in structs and "kvg_codec_params" in structs
    lines, want = [], []
    for s in structs:
        lines.append(f'printf("%zu\\n", sizeof({s}));')
        want.append(ffi.sizeof(s))
        for f, _ in ffi.typeof(s).fields:
            lines.append(f'printf("%zu\\n", offsetof({s}, {f}));')
            want.append(ffi.offsetof(s, f))
    src = tmp_path / "layout.c"
    body = "\n    ".join(lines)
    src.write_text(f'#include <stddef.h>\n#include <stdio.h>\n#include "kvgguf.h"\nint main(void) {{\n    {body}\n}}\n')
    r = subprocess.run(
        [exe, "-std=c11", f"-I{_native.header_path().parent}", str(src), "-o", str(tmp_path / "layout")],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    got = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split()
    assert [int(v) for v in got] == want


def test_library_and_header_agree_on_the_abi_version():
    lib = _native.get_lib()
    assert lib.kvg_abi_version() == lib.KVG_ABI_VERSION >= 2


def test_a_header_of_another_abi_is_refused_with_a_clear_error(tmp_path):
    text = _native.header_path().read_text()
    assert "KVG_ABI_VERSION = " in text
    other = tmp_path / "kvgguf.h"
    other.write_text(re.sub(r"KVG_ABI_VERSION = \d+", "KVG_ABI_VERSION = 999", text))
    out = run_python("from kvgguf import codecs\ncodecs.names()", env_update={"KVGGUF_HEADER": str(other)})
    assert out.returncode == 1, out.stderr  # an exception, not a crash
    assert "KvgLoadError" in out.stderr and "declares ABI version 999" in out.stderr
    assert f"built for ABI version {_native.get_lib().kvg_abi_version()}" in out.stderr
    assert str(other) in out.stderr and str(_native.library_path()) in out.stderr
    assert "reinstall kvgguf" in out.stderr and "KVGGUF_HEADER" in out.stderr
