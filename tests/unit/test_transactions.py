"""All or nothing (issue "Nothing torn, nothing crashed", item 1): a failure injected at every step
of a store mutation (kvg_debug_fail_after) leaves every layer and kind exactly as it was, and the
same mutation then succeeds. No model: the native store alone (the live cache: test_live_failures)."""

import numpy as np
import pytest

from kvgguf.bindings.binding import KvgError, get_lib
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.store import KVStore

N_LAYER, N_HEAD_KV, HEAD_DIM = 3, 2, 64


def snapshot(store: KVStore):
    """Everything a reader can see: each list's blocks with their bytes, codecs and tiers."""
    return [(il, kind, store.blocks(il, kind)) for il in range(N_LAYER) for kind in Kind]


def rows(rng, n):
    return rng.standard_normal((n, N_HEAD_KV * HEAD_DIM)).astype(np.float32)


def filled_store(seed=0) -> KVStore:
    rng = np.random.default_rng(seed)
    store = KVStore(N_LAYER, N_HEAD_KV, HEAD_DIM, HEAD_DIM)
    for tier, codec, n in (
        (Tier.SINK, "f16", 4),
        (Tier.WARM, "kivi4", 28),
        (Tier.WARM, "rotq3", 32),
        (Tier.WARM, "crotq3", 17),
    ):
        for il in range(N_LAYER):
            for kind in Kind:
                store.append(il, kind, tier, codec, rows(rng, n))
    return store


def evict(store: KVStore, r0: int, n: int, seed: int) -> None:
    """What LiveCache._evict does to the store: an append to every list, undone on failure."""
    rng = np.random.default_rng(seed)
    try:
        for il in range(N_LAYER):
            for kind in Kind:
                store.append(il, kind, Tier.WARM, "rotq4", rows(rng, n))
    except BaseException:
        store.truncate(r0)
        raise


MUTATIONS = {
    "retier_lists": lambda s: s.retier_lists(
        32, 81, Tier.ARCHIVE, {(il, k): ("rotq2" if k else "kivi2") for il in range(N_LAYER) for k in (0, 1)}
    ),
    # the same on 4 threads: the first failure stops the others, and nothing is committed
    "retier_lists_on_threads": lambda s: (
        s.set_threads(4),
        s.retier_lists(
            32, 81, Tier.ARCHIVE, {(il, k): ("rotq2" if k else "kivi2") for il in range(N_LAYER) for k in (0, 1)}
        ),
    ),
    "retier_one_codec": lambda s: s.retier(4, 64, Tier.ARCHIVE, "rotq3"),
    "truncate_cutting_blocks": lambda s: s.truncate(50),
    "truncate_to_zero": lambda s: s.truncate(0),
    "evict_with_rollback": lambda s: evict(s, 81, 40, seed=7),
    "append_encoded": lambda s: s.append_encoded(1, Kind.V, s.blocks(1, Kind.V)[2]),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_a_failure_at_any_step_leaves_the_store_as_it_was(name):
    mutate = MUTATIONS[name]
    reference = filled_store()
    mutate(reference)
    expected_after = snapshot(reference)

    failures = 0
    for k in range(10_000):
        store = filled_store()
        before = snapshot(store)
        KVStore.fail_after(k)
        try:
            mutate(store)
        except KvgError as e:
            assert "injected failure" in str(e)
            assert snapshot(store) == before, f"{name}: step {k} left the store changed"
            failures += 1
            continue
        finally:
            pending = KVStore.fail_after(-1)
        assert pending >= 0, f"{name}: step {k} failed, yet the mutation reported success"
        # Fewer than k + 1 fallible steps: it ran to the end, and did what it does without failures.
        assert snapshot(store) == expected_after
        break
    else:
        pytest.fail("the mutation never ran out of steps")
    assert failures >= 1 or name == "truncate_to_zero"  # dropping everything has nothing that can fail


def test_a_failed_mutation_can_be_retried():
    store = filled_store()
    KVStore.fail_after(5)
    with pytest.raises(KvgError, match="injected failure"):
        MUTATIONS["retier_lists"](store)
    MUTATIONS["retier_lists"](store)
    assert {b.tier for b in store.blocks(2, Kind.K)[2:]} == {Tier.ARCHIVE}


def test_unreadable_blocks_fail_reads_and_their_retier_but_not_the_others():
    store = filled_store()
    store.fail_reads(1, Kind.K, 40)
    with pytest.raises(KvgError, match="injected read failure"):
        store.decode(1, Kind.K, 0, 81)
    store.decode(1, Kind.V, 0, 81)  # V of the same layer, and other layers, read fine
    store.decode(0, Kind.K, 0, 81)
    before = snapshot(store)
    with pytest.raises(KvgError, match="injected read failure"):
        store.retier(32, 64, Tier.ARCHIVE, "rotq2")  # must re-read the block: fails as a whole
    assert snapshot(store) == before
    store.fail_reads(1, Kind.K, 40, on=False)
    store.retier(32, 64, Tier.ARCHIVE, "rotq2")


def test_the_cold_row_count_is_what_both_k_and_v_hold():
    store = KVStore(1, N_HEAD_KV, HEAD_DIM, HEAD_DIM)
    rng = np.random.default_rng(1)
    store.append(0, Kind.K, Tier.WARM, "rotq4", rows(rng, 8))
    assert get_lib().kvg_store_hook_n_cold(store._ptr, 0) == 0  # V not appended yet: no row is whole
    store.append(0, Kind.V, Tier.WARM, "rotq4", rows(rng, 8))
    assert get_lib().kvg_store_hook_n_cold(store._ptr, 0) == 8
