"""The compressed prompt cache on Redis (kvgguf/session/redis_cache.py) against a real
redis-server: two Llamas standing for two servers share entries, another model never reads
them, and Redis stopped, full or holding damaged entries costs a prefill, never an answer.

redis-server comes from Debian's package (scripts/system_packages.sh installs it; without it
these tests skip); each test module starts its own on a free loopback port, without persistence,
in a temporary folder."""

from __future__ import annotations

import threading
import time

import pytest

from kvgguf import Llama
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.errors import SessionCorruptError
from kvgguf.session import container, pieces
from kvgguf.session.prompt_cache import CompressedRAMCache
from kvgguf.session.redis_cache import CompressedRedisCache

from servers import RedisServer, get_json, kvgguf_serve, redis_server_binary

redis = pytest.importorskip("redis")

KW = dict(n_ctx=2048, n_threads=1, n_threads_batch=1, verbose=False)
CHUNK = 64  # small chunks keep the documents (and the test) short


def _binary() -> str:
    found = redis_server_binary()
    if found is None:
        pytest.skip("redis-server is not installed (bash scripts/system_packages.sh, or apt-get install redis-server)")
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = RedisServer(_binary(), tmp_path_factory.mktemp("redis"))
    yield s
    s.stop()


@pytest.fixture
def flushed(server):
    redis.Redis(port=server.port).flushall()
    return server


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    return Llama(str(smollm2_path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def document(vocab):
    return vocab.tokenize(wikitext2_test()[:2500].encode("utf-8"))[:300]


def _serve(path, url, kv_codec="tiered", **kw):
    llm = Llama(str(path), kv_codec=kv_codec, **KW)
    cache = CompressedRedisCache(url, chunk_tokens=CHUNK, **kw)
    llm.set_cache(cache)
    return llm, cache


def _answer(llm, prompt) -> tuple[str, int]:
    """Greedy completion of prompt, and how many tokens llama_decode evaluated for it."""
    before = llm.tokens_evaluated
    out = llm.create_completion(prompt, max_tokens=6, temperature=0.0)
    return out["choices"][0]["text"], llm.tokens_evaluated - before


@pytest.mark.parametrize("kv_codec", [None, "tiered"])
def test_a_second_server_continues_from_the_first_servers_prompt(smollm2_path, flushed, vocab, document, kv_codec):
    """Entries written exactly (codec f16): the second Llama evaluates only what follows the
    cached chunks; on llama.cpp's own cache it answers as a Llama without a cache does (the
    tiered cache holds other rows cold after a restore than after one prefill, so its greedy
    tokens may part: that is its codec's loss, measured elsewhere)."""
    question = document + vocab.tokenize(b" The question: who", add_bos=False)
    first, _ = _serve(smollm2_path, flushed.url, kv_codec, codec="f16")
    _answer(first, document + vocab.tokenize(b" Summary:", add_bos=False))  # writes the document's entry
    second, cache = _serve(smollm2_path, flushed.url, kv_codec, codec="f16")
    got, evaluated = _answer(second, question)
    assert cache.hits == 1 and cache.tokens_served >= 256
    assert evaluated <= len(question) - 256  # the cached chunks were not evaluated again
    if kv_codec is None:
        assert got == _answer(Llama(str(smollm2_path), **KW), question)[0]
    assert cache.cache_size > 0 and cache.faults == {}


def test_another_model_or_codec_never_reads_the_entries(smollm2_path, gemma3_path, flushed, document):
    first, _ = _serve(smollm2_path, flushed.url)
    _answer(first, document)
    _, other_codec = _serve(smollm2_path, flushed.url, codec="kivi4")
    assert document not in other_codec
    _, gemma = _serve(gemma3_path, flushed.url)
    assert document not in gemma and gemma.namespace != other_codec.namespace


def test_damaged_entries_are_misses_and_are_deleted(smollm2_path, flushed, document):
    first, cache = _serve(smollm2_path, flushed.url)
    _answer(first, document)
    client = redis.Redis(port=flushed.port)
    (entry,) = client.keys(f"kvgguf:{cache.namespace}:e:*")
    data = bytearray(client.get(entry))
    data[len(data) // 2] ^= 0x40  # one flipped bit
    client.set(entry, bytes(data))
    second, cache2 = _serve(smollm2_path, flushed.url)
    _, evaluated = _answer(second, document)
    assert evaluated >= len(document) and cache2.faults.get("damaged entry") == 1  # prefilled again
    assert client.get(entry) != bytes(data)  # deleted, then written whole by the second Llama
    client.set(entry, bytes(data[:100]))  # truncated: never read either
    assert document not in cache2 and not client.exists(entry)


def test_redis_stopped_or_full_costs_a_prefill_not_an_answer(smollm2_path, tmp_path, document):
    server = RedisServer(_binary(), tmp_path)
    try:
        llm, cache = _serve(smollm2_path, server.url, timeout_s=0.5)
        plain, _ = _answer(Llama(str(smollm2_path), kv_codec="tiered", **KW), document)
        assert _answer(llm, document)[0] == plain
        server.stop()
        llm.reset()
        got, evaluated = _answer(llm, document)
        assert got == plain and evaluated >= len(document) and cache.faults.get("unreachable", 0) >= 1
        server.start()  # an empty Redis again: a miss, then a write another Llama reads
        llm.reset()
        assert _answer(llm, document)[0] == plain
        other, cache2 = _serve(smollm2_path, server.url)
        assert _answer(other, document)[0] == plain and cache2.hits == 1
        redis.Redis(port=server.port).config_set("maxmemory", "100kb")  # now every write fails with OOM
        llm.reset()
        assert _answer(llm, document[:200] + document)[0]
        assert cache.faults.get("full", 0) >= 1
    finally:
        server.stop()


def test_two_servers_share_one_redis(smollm2_path, flushed, tmp_path):
    """`kvgguf serve --prompt-cache redis://...` twice: the second server answers a question on
    the first one's document evaluating only what follows the cached chunks (its memory
    endpoint shows it, and the Redis hit)."""
    openai = pytest.importorskip("openai")
    doc = wikitext2_test()[:4000]  # about 900 tokens: fourteen chunks of 64
    args = [
        str(smollm2_path),
        "--model_alias",
        "smollm2-135m",
        "--n_ctx",
        "2048",
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
        "--prompt-cache",
        flushed.url,
    ]
    with kvgguf_serve(args, tmp_path / "a.log", {}) as a, kvgguf_serve(args, tmp_path / "b.log", {}) as b:

        def ask(base, prompt):
            return openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0).completions.create(
                model="smollm2-135m", prompt=prompt, max_tokens=4, temperature=0.0
            )

        ask(a, doc + "\nSummary:")
        before = get_json(b + "/kvgguf/memory")
        ask(b, doc + "\nTitle:")
        after = get_json(b + "/kvgguf/memory")
    evaluated = after["tokens_evaluated"] - before["tokens_evaluated"]
    assert after["prompt_cache"]["hits"] == 1 and after["prompt_cache"]["tokens_served"] >= 768
    assert 0 < evaluated < 200, f"{evaluated} tokens evaluated: the shared prefix was not used"
    assert after["prompt_cache"]["type"] == "CompressedRedisCache" and not after["prompt_cache"]["faults"]


def test_a_session_cut_into_pieces_joins_back_whole_and_refuses_another_piece(smollm2_path, document):
    """No Redis: pieces.split/join on a tiered session with compressed blocks."""
    llm = Llama(str(smollm2_path), kv_codec="tiered", **KW)
    llm.eval(document)
    data = llm.save_state().llama_state
    skeleton, parts = pieces.split(data)
    assert len(parts) == len(llm.kv_cache.blocks) >= 2 and len(skeleton) < len(data) - sum(map(len, parts)) / 2
    assert container.unpack(pieces.join(skeleton, parts)) == container.unpack(data)
    with pytest.raises(SessionCorruptError, match="not the one"):
        pieces.join(skeleton, parts[:-1] + [parts[-1][:-1] + b"x"])
    with pytest.raises(SessionCorruptError, match="not the one"):
        pieces.join(skeleton, parts[:-1])
    sections = container.unpack(skeleton)  # what a hit unpacks once: the same session back
    assert container.unpack(pieces.join_sections(sections, parts)) == container.unpack(data)
    with pytest.raises(SessionCorruptError, match="not its last section"):
        pieces.join_sections(sections[-1:] + sections[:-1], parts)
    stock = Llama(str(smollm2_path), **KW)
    stock.set_cache(CompressedRAMCache())  # its states are .kvz too, without blocks
    stock.eval(document[:50])
    whole = stock.save_state().llama_state
    assert pieces.split(whole) == (whole, []) and pieces.join(whole, []) == whole


def test_prompts_sharing_a_document_hold_its_blocks_once(smollm2_path, flushed, vocab, document):
    """A second server restores the first one's entry and writes its own: the document's
    blocks are held once, and each entry still loads after the other is dropped."""
    first, cache = _serve(smollm2_path, flushed.url)
    _answer(first, document + vocab.tokenize(b" Summary:", add_bos=False))
    one = cache.cache_size
    second, cache2 = _serve(smollm2_path, flushed.url)
    question = document + vocab.tokenize(b" The question: who", add_bos=False)
    _answer(second, question)
    stats = cache2.stats()
    assert cache2.hits == 1 and stats["entries"] == 2 and stats["shared_pieces"] >= 1
    assert one < cache2.cache_size < 2 * one  # the shared blocks are counted once
    cache2.capacity_bytes = cache2.cache_size - 1  # the least recently used (the first) goes
    cache2._evict()
    assert cache2.stats()["entries"] == 1 and 0 < cache2.cache_size <= cache2.capacity_bytes
    third, cache3 = _serve(smollm2_path, flushed.url)
    _, evaluated = _answer(third, question)
    assert cache3.hits == 1 and evaluated < len(question) - 256 and cache3.faults == {}


def test_a_damaged_or_evicted_piece_is_a_miss_and_drops_its_entry(smollm2_path, flushed, document):
    first, cache = _serve(smollm2_path, flushed.url)
    _answer(first, document)
    client = redis.Redis(port=flushed.port)
    keys = sorted(client.keys(f"kvgguf:{cache.namespace}:b:*"))
    data = bytearray(client.get(keys[0]))
    data[-3] ^= 0x01
    client.set(keys[0], bytes(data))
    second, cache2 = _serve(smollm2_path, flushed.url)
    _, evaluated = _answer(second, document)
    assert evaluated >= len(document) and cache2.faults.get("damaged entry") == 1
    client.delete(sorted(client.keys(f"kvgguf:{cache.namespace}:b:*"))[-1])  # as maxmemory would
    third, cache3 = _serve(smollm2_path, flushed.url)
    _, evaluated = _answer(third, document)
    assert evaluated >= len(document) and cache3.faults.get("piece evicted by Redis") == 1


def test_capacity_counts_the_bytes_held_and_drops_the_least_recently_used(smollm2_path, flushed, document):
    llm, cache = _serve(smollm2_path, flushed.url)
    _answer(llm, document)
    one = cache.cache_size
    cache.capacity_bytes = int(1.5 * one)  # room for one entry, not two
    llm.reset()
    _answer(llm, document[::-1])  # another prompt: the first entry goes
    assert 0 < cache.cache_size <= cache.capacity_bytes
    assert document not in cache and document[::-1] in cache


def test_a_slow_redis_is_a_timeout_and_a_prefill(smollm2_path, flushed, document):
    """Redis busy for 3 s (DEBUG SLEEP) against a 0.2 s timeout: the lookup gives up, the
    request prefills and is answered as without a cache."""
    first, _ = _serve(smollm2_path, flushed.url)
    plain, _ = _answer(first, document)  # cached, for the lookup that will time out
    other, cache = _serve(smollm2_path, flushed.url, timeout_s=0.2)
    busy = threading.Thread(target=lambda: redis.Redis(port=flushed.port).execute_command("DEBUG", "SLEEP", "3"))
    busy.start()
    time.sleep(0.3)
    got, evaluated = _answer(other, document)
    busy.join()
    assert got == plain and evaluated >= len(document) and cache.faults.get("timeout", 0) >= 1


def test_a_failed_read_is_a_miss_that_keeps_the_entry():
    """A GET that times out says nothing about the entry: it is a miss, not a reason to delete
    the entry or its index (a stub client: no Redis needed)."""

    class Client:
        deleted: list = []

        def mget(self, keys):
            return [b"entry"] * len(keys)

        def get(self, key):
            raise redis.exceptions.TimeoutError("slow")

        def delete(self, *keys):
            self.deleted.extend(keys)

        def pipeline(self, transaction=True):
            raise AssertionError("a failed read must not delete the entry")

    cache = CompressedRedisCache("redis://stub", chunk_tokens=4, client=Client())
    cache.namespace = "ns"
    with pytest.warns(RuntimeWarning, match="timeout"):
        assert [1, 2, 3, 4, 5] not in cache
    assert cache.faults == {"timeout": 1} and Client.deleted == []


@pytest.mark.slow  # 21 s; the RAM and disk caches answer the same in tests/model/test_prefix_reuse.py
def test_entries_restored_and_cut_answer_as_a_fresh_context(smollm2_path, flushed):
    """The prompt that shares a prefix with an entry (tests/model/test_prefix_reuse.py's sequence):
    restored from Redis and cut, the context answers as a fresh one."""
    from test_prefix_reuse import check_sequence, completion

    def make():
        llm = Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW)
        llm.set_cache(CompressedRedisCache(f"redis://127.0.0.1:{flushed.port}/0", chunk_tokens=CHUNK))
        return llm

    def ask(llm, tokens):
        llm.reset()  # what the cache holds is what is reused
        return completion(llm, tokens)

    check_sequence(make, ask=ask)
