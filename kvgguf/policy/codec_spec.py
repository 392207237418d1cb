"""Which codec each (layer, K/V) list uses: the spec users write, and the table it expands to.

A spec is one codec name for everything ("rotq4"), a (K, V) pair (("kivi4", "rotq3")), or a
mapping per layer over a default ({"default": "rotq4", 0: ("kivi4", "kivi4")}). The live
cache's tiers and the session codec take the same specs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Tuple, Union

from ..bindings import codecs
from ..enums import Kind

CodecSpec = Union[str, Tuple[str, str], Mapping[Union[int, str], Union[str, Tuple[str, str]]]]


def _pair(value) -> tuple[str, str]:
    if isinstance(value, str):
        k = v = value
    elif isinstance(value, (tuple, list)) and len(value) == 2 and all(isinstance(x, str) for x in value):
        k, v = value
    else:
        raise TypeError(f"a codec spec entry is a codec name or a (K, V) pair of names, got {value!r}")
    codecs.get(k), codecs.get(v)  # unknown names fail here, naming the known ones
    return k, v


def check(spec: CodecSpec) -> None:
    """TypeError or ValueError unless spec is well formed and names known codecs (layers are
    checked against a model by ``choice``)."""
    if isinstance(spec, Mapping):
        if "default" not in spec:
            raise ValueError("a per-layer codec spec needs a 'default' entry")
        for key, value in spec.items():
            if key != "default" and (isinstance(key, bool) or not isinstance(key, int) or key < 0):
                raise ValueError(f"a per-layer codec spec is keyed by layer numbers >= 0 and 'default', got {key!r}")
            _pair(value)
    else:
        _pair(spec)


def choice(spec: CodecSpec, n_layer: int) -> dict[tuple[int, int], str]:
    """{(layer, kind): codec name} for a model of n_layer layers; ValueError for unknown names
    or layers."""
    check(spec)
    if isinstance(spec, Mapping):
        per = {il: _pair(spec.get(il, spec["default"])) for il in range(n_layer)}
        extra = [k for k in spec if k != "default" and k not in per]
        if extra:
            raise ValueError(f"the codec spec names layers {extra} outside [0, {n_layer})")
    else:
        per = {il: _pair(spec) for il in range(n_layer)}
    return {(il, kind): per[il][kind] for il in range(n_layer) for kind in Kind}


def describe(table: dict[tuple[int, int], str]) -> str:
    """ "rotq4", "K kivi4 / V rotq3", or "per layer: kivi4 x4, rotq3 x56"."""
    names = set(table.values())
    if len(names) == 1:
        return names.pop()
    k = {c for (_, kind), c in table.items() if kind == Kind.K}
    v = {c for (_, kind), c in table.items() if kind == Kind.V}
    if len(k) == 1 and len(v) == 1:
        return f"K {k.pop()} / V {v.pop()}"
    values = list(table.values())
    return "per layer: " + ", ".join(f"{n} x{values.count(n)}" for n in sorted(names))


def parse_kv(text: str) -> tuple[str, str]:
    """ "k:kivi4,v:rotq3" -> ("kivi4", "rotq3"); ValueError naming what is wrong."""
    parts = dict(p.split(":", 1) for p in (s.strip() for s in text.split(",")) if ":" in p)
    if set(parts) != {"k", "v"} or len(text.split(",")) != 2:
        raise ValueError(f"kv_codec {text!r}: write K and V codecs as 'k:NAME,v:NAME', e.g. 'k:kivi4,v:rotq3'")
    return _pair((parts["k"].strip(), parts["v"].strip()))


def unfit(spec: CodecSpec, n_layer: int, layers, head_dim: Callable[[int, int], int]) -> dict[str, str]:
    """{codec: why} for the codecs spec gives any of `layers` that cannot take that layer's head
    dim (head_dim(il, kind); rotations need a power of two), so a config is refused or changed
    before the first token rather than failing at the first eviction."""
    out = {}
    for (il, kind), name in choice(spec, n_layer).items():
        if il in layers and name not in out:
            try:
                codecs.get(name).encoded_size((1, 1, head_dim(il, kind)), "k" if kind == Kind.K else "v")
            except ValueError as e:
                out[name] = str(e)
    return out
