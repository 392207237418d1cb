"""A compressed prompt cache on Redis (or Valkey), shared by every server that points at it.

Each cached prompt is one .kvz session (as CompressedDiskCache keeps them), stored as a skeleton
under its entry key and one piece per block of compressed tokens (pieces.py), each piece under
its SHA-256: prompts that share a document hold its blocks once, counted once, and an entry
lets go of its pieces (a reference count) when it leaves. Its tokens are also indexed by chunks
of CHUNK_TOKENS: the key of chunk k chains the hash of chunk k-1's key with the chunk's tokens,
as LMCache keys its chunks, and holds the newest entry that starts with those k chunks. A
request then finds, in one MGET, the longest prefix any server cached, at chunk granularity,
without listing entries.

Every key starts with a namespace of the model's fingerprint, the codec and the .kvz format
version, so servers with another model, codec or kvgguf never read each other's entries.
Writing and dropping an entry are each one Lua script, so servers sharing the store never see
half an entry or lose a piece another entry holds.

Bounded twice: kvgguf evicts the least recently used entries past capacity_bytes (the bytes it
wrote: skeletons and pieces), and Redis's own maxmemory with an LRU policy is the outer bound.
Redis being down, slow (timeout_s), full or holding a damaged entry or piece is a miss: the
request prefills as if there were no cache, the fault is counted (`faults`) and warned about
once per fault, and a damaged entry is deleted.
"""

from __future__ import annotations

import hashlib
import json
import time
import warnings
from typing import Optional, Sequence

import numpy as np

from ..errors import SessionError
from . import container, pieces
from .prompt_cache import CompressedCache, Key, section_tokens, token_digest
from .state import SessionState

# How entries lie in Redis; in the namespace, so servers of another layout never read them.
# 1: one whole .kvz per entry. 2: a skeleton and shared pieces (pieces.py).
LAYOUT = 2
# The index's chunk: a prefix shorter than one chunk is not looked up. Measured
# (benchmarks/shared_cache.py, a 4K-token entry): 64 costs 2.6 index bytes per cached token
# (the entry holds 5,785) and 161 ms to find and assemble the entry against 129 ms at LMCache's
# 256, and finds shared prefixes (a system prompt) of 64-255 tokens that 256 misses.
CHUNK_TOKENS = 64
_FAULT = object()  # what _call returns after a fault where None is an answer (GET of a missing key)

# Both scripts take the namespace's key prefix as ARGV[1]: one Redis, not a cluster.
# release(p, id, members): each piece of members loses a reference; at none it goes.
_RELEASE = """
local function release(p, members)
  for i = 1, #members, 64 do
    local d = string.sub(members, i, i + 63)
    if redis.call('HINCRBY', p .. 'refs', d, -1) <= 0 then
      redis.call('DEL', p .. 'b:' .. d)
      redis.call('HDEL', p .. 'refs', d)
      redis.call('HDEL', p .. 'sizes', 'b:' .. d)
    end
  end
end
"""
# ARGV: prefix, id, skeleton, time, n, then n pairs (hex digest, piece or "" where held).
# Returns 0, or i when piece i was sent empty and is no longer held (the caller sends it).
_PUT = (
    _RELEASE
    + """
local p, id, n = ARGV[1], ARGV[2], tonumber(ARGV[5])
for i = 1, n do
  if ARGV[5 + 2 * i] == '' and redis.call('EXISTS', p .. 'b:' .. ARGV[4 + 2 * i]) == 0 then
    return i
  end
end
local old = redis.call('GET', p .. 'm:' .. id) or ''
local members = {}
for i = 1, n do
  local d, v = ARGV[4 + 2 * i], ARGV[5 + 2 * i]
  if v ~= '' and redis.call('EXISTS', p .. 'b:' .. d) == 0 then
    redis.call('SET', p .. 'b:' .. d, v)
    redis.call('HSET', p .. 'sizes', 'b:' .. d, #v)
  end
  redis.call('HINCRBY', p .. 'refs', d, 1)
  members[i] = d
end
release(p, old)
redis.call('SET', p .. 'e:' .. id, ARGV[3])
redis.call('SET', p .. 'm:' .. id, table.concat(members))
redis.call('HSET', p .. 'sizes', id, #ARGV[3])
redis.call('ZADD', p .. 'lru', ARGV[4], id)
return 0
"""
)
# ARGV: prefix, id.
_DROP = (
    _RELEASE
    + """
local p, id = ARGV[1], ARGV[2]
release(p, redis.call('GET', p .. 'm:' .. id) or '')
redis.call('DEL', p .. 'e:' .. id, p .. 'm:' .. id)
redis.call('HDEL', p .. 'sizes', id)
redis.call('ZREM', p .. 'lru', id)
return 0
"""
)


class CompressedRedisCache(CompressedCache):
    """Compressed sessions in Redis.

    url: redis://HOST:PORT/DB. capacity_bytes: the most .kvz bytes this namespace holds (the
    least recently used go first). timeout_s: how long one Redis call may take before it counts
    as a fault (the request goes on without the cache). codec, entropy: as CompressedDiskCache.
    The namespace comes from the model: kvgguf.Llama.set_cache calls attach(llm).
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        capacity_bytes: int = 2 << 30,
        codec: Optional[str] = None,
        entropy: bool = True,
        *,
        timeout_s: float = 0.5,
        chunk_tokens: int = CHUNK_TOKENS,
        client=None,
    ):
        super().__init__(capacity_bytes, codec, entropy)
        if chunk_tokens <= 0:
            raise ValueError(f"chunk_tokens must be > 0, got {chunk_tokens}")
        if client is None:
            try:
                import redis
            except ImportError as e:
                raise ImportError("a Redis prompt cache needs the redis package: pip install 'kvgguf[redis]'") from e
            client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self.url, self.client, self.chunk_tokens = url, client, chunk_tokens
        self.namespace: Optional[str] = None
        self.faults: dict[str, int] = {}
        self.hits = self.misses = self.tokens_served = 0
        self._scripts: dict[str, object] = {}

    # --- namespace ------------------------------------------------------------------------

    def attach(self, llm) -> None:
        """Keys this cache by llm's model fingerprint and the codec its states are saved with."""
        from .fingerprint import ModelFingerprint

        codec = self.codec or (llm.kv_config.warm if llm.kv_config is not None else "default")
        ident = json.dumps(
            {
                "model": ModelFingerprint.of(llm).to_json(),
                "codec": str(codec),
                "format": container.FORMAT_VERSION,
                "layout": LAYOUT,
            },
            sort_keys=True,
        )
        self.namespace = hashlib.sha256(ident.encode()).hexdigest()[:24]

    def _key(self, *parts: str) -> str:
        return ":".join(("kvgguf", self.namespace or "-") + parts)

    def _chunk_keys(self, tokens: Key) -> list[str]:
        """Chained keys of tokens' whole chunks: key k covers chunks 0..k."""
        keys, h = [], hashlib.sha256(self._key("chunks").encode()).digest()
        for c0 in range(0, len(tokens) - self.chunk_tokens + 1, self.chunk_tokens):
            h = hashlib.sha256(h + np.asarray(tokens[c0 : c0 + self.chunk_tokens], dtype="<i4").tobytes()).digest()
            keys.append(self._key("p", h.hex()[:32]))
        return keys

    # --- faults ---------------------------------------------------------------------------

    def _fault(self, name: str, detail: object) -> None:
        self.faults[name] = self.faults.get(name, 0) + 1
        if self.faults[name] == 1:
            warnings.warn(
                f"kvgguf: the Redis prompt cache at {self.url}: {name} ({detail}); requests go on "
                "without it where it fails (counted in faults)",
                RuntimeWarning,
                stacklevel=3,
            )

    def _call(self, what: str, fn, *args, fault=None):
        """fn(*args), or `fault` after counting a fault (Redis down, slow, full, refusing)."""
        import redis

        try:
            return fn(*args)
        except redis.exceptions.TimeoutError as e:
            self._fault("timeout", e)
        except redis.exceptions.ConnectionError as e:
            self._fault("unreachable", e)
        except redis.exceptions.ResponseError as e:  # OutOfMemoryError: past Redis's maxmemory
            full = isinstance(e, getattr(redis.exceptions, "OutOfMemoryError", ())) or "maxmemory" in str(e)
            self._fault("full" if full else "refused", e)
        except redis.exceptions.RedisError as e:
            self._fault(f"error in {what}", e)
        return fault

    # --- BaseLlamaCache -------------------------------------------------------------------

    @property
    def cache_size(self) -> int:
        sizes = self._call("size", self.client.hvals, self._key("sizes")) if self.namespace else None
        return sum(int(s) for s in sizes) if sizes else 0

    def _find_longest_prefix_key(self, key: Key) -> Optional[Key]:
        found = self._lookup(key)
        return None if found is None else found[0]

    def _lookup(self, tokens: Key) -> Optional[tuple[Key, bytes, list, str]]:
        """(the entry's tokens, its skeleton, the skeleton's sections, its id) of the longest
        cached prefix of tokens; the skeleton is unpacked here once for the whole hit."""
        if self.namespace is None:
            return None
        keys = self._chunk_keys(tokens)
        if not keys:
            return None
        ids = self._call("lookup", self.client.mget, keys)
        if not ids:
            return None
        for k in range(len(keys) - 1, -1, -1):
            if ids[k] is None:
                continue
            entry_id = ids[k].decode()
            data = self._call("read", self.client.get, self._key("e", entry_id), fault=_FAULT)
            if data is _FAULT:  # Redis failed: a miss, and the entry, which may be whole, stays
                return None
            if data is None:  # evicted by Redis (maxmemory) or by another server: the index lags
                self._call("drop", self.client.delete, keys[k])
                self._delete(entry_id)
                continue
            try:
                sections = container.unpack(data)
                entry = tuple(section_tokens(sections).tolist())
            except (SessionError, KeyError) as e:
                self._fault("damaged entry", e)
                self._delete(entry_id)
                continue
            if tuple(entry[: (k + 1) * self.chunk_tokens]) != tuple(tokens[: (k + 1) * self.chunk_tokens]):
                self._fault("index pointing at another prompt", entry_id)
                self._call("drop", self.client.delete, keys[k])
                continue
            return entry, data, sections, entry_id
        return None

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._lookup(tuple(key)) is not None

    def __getitem__(self, key: Sequence[int]) -> SessionState:
        found = self._lookup(tuple(key))
        data = None if found is None else self._assemble(*found[1:])
        if data is None:
            self.misses += 1
            raise KeyError("no cached prefix")
        entry, _, _, entry_id = found
        self.hits += 1
        self.tokens_served += min(len(entry), len(key))
        self._call("touch", self.client.zadd, self._key("lru"), {entry_id: time.time()})
        return SessionState(np.asarray(entry, dtype=np.intc), data, None)

    def _assemble(self, skeleton: bytes, sections: list, entry_id: str) -> Optional[bytes]:
        """The .kvz of an entry: its skeleton (and its sections, unpacked) and its pieces, or
        None (a miss) when a piece is gone or damaged (the entry is then dropped) or Redis failed."""
        try:
            names = pieces.names(sections)
        except SessionError as e:
            self._fault("damaged entry", e)
            self._delete(entry_id)
            return None
        if not names:
            return skeleton
        stored = self._call("read", self.client.mget, [self._key("b", d.hex()) for d in names])
        if stored is None:
            return None
        if any(v is None for v in stored):  # Redis's maxmemory took it: the entry cannot be whole
            self._fault("piece evicted by Redis", "raise Redis's maxmemory or lower the byte budget")
            self._delete(entry_id)
            return None
        try:
            return pieces.join_sections(sections, [dict(container.unpack(v))[pieces.PIECES] for v in stored])
        except (SessionError, KeyError) as e:
            self._fault("damaged entry", e)
            self._delete(entry_id)
            return None

    def __setitem__(self, key: Sequence[int], value: Optional[SessionState]) -> None:
        if value is None:  # a context save_state could not keep (one a context shift moved): not cached
            return
        value = self._check_state(value)
        if self.namespace is None:
            self._fault("not attached to a model", "use kvgguf.Llama.set_cache")
            return
        key = tuple(key)
        entry_id = token_digest(key)
        skeleton, parts = pieces.split(value.llama_state)
        names = [pieces.digest(p).hex() for p in parts]
        held = self._call("read", self.client.hmget, self._key("refs"), names) if names else []
        if held is None:
            return
        send = [h is None or int(h) <= 0 for h in held]
        for _attempt in range(2):
            args = [self._key(""), entry_id, skeleton, time.time(), len(parts)]
            for name, part, must in zip(names, parts, send):
                args += [name, container.pack([(pieces.PIECES, part)], entropy=self.entropy) if must else b""]
            missing = self._call("write", self._script("put"), [], args)
            if missing is None:
                return
            if missing == 0:
                break
            send = [True] * len(parts)  # a piece went between the two calls: send them all
        else:
            return
        pipe = self.client.pipeline(transaction=True)
        for chunk_key in self._chunk_keys(key):
            pipe.set(chunk_key, entry_id)
        if self._call("write", pipe.execute) is None:
            return
        self._evict()

    def _script(self, name: str):
        if name not in self._scripts:
            self._scripts[name] = self.client.register_script(_PUT if name == "put" else _DROP)
        return self._scripts[name]

    # --- bounds ---------------------------------------------------------------------------

    def _evict(self) -> None:
        """Drops the least recently used entries until the bytes held fit capacity_bytes (a
        piece that another entry holds stays, so each drop is measured again)."""
        total = self.cache_size
        if total <= self.capacity_bytes:
            return
        oldest = self._call("lru", self.client.zrange, self._key("lru"), 0, -1) or []
        for raw in oldest:
            self._delete(raw.decode())
            total = self.cache_size
            if total <= self.capacity_bytes:
                break

    def _delete(self, entry_id: str) -> None:
        """Drops an entry and its references to its pieces; its chunk keys lapse on their next
        lookup (they point at nothing)."""
        self._call("delete", self._script("drop"), [], [self._key(""), entry_id])

    def stats(self) -> dict:
        """What /kvgguf/memory shows of it: the counters of this process, and what the shared
        store holds (entries; pieces, and those that more than one entry holds)."""
        refs = (self._call("size", self.client.hvals, self._key("refs")) or []) if self.namespace else []
        entries = (self._call("size", self.client.zcard, self._key("lru")) or 0) if self.namespace else 0
        return {
            "entries": entries,
            "pieces": len(refs),
            "shared_pieces": sum(int(r) > 1 for r in refs),
            "url": self.url,
            "hits": self.hits,
            "misses": self.misses,
            "tokens_served": self.tokens_served,
            "faults": dict(self.faults),
            "chunk_tokens": self.chunk_tokens,
        }
