"""The W-TinyLFU cache behind tsh's tool-path cache (SPEC H-4)."""

from __future__ import annotations

import pytest

from cortexfs.tools.tinylfu import FrequencySketch, WTinyLFU


def lookup(cache: WTinyLFU[str, str], key: str) -> str | None:
    """What tsh does: look up, and store the value on a miss."""
    value = cache.get(key)
    if value is None:
        cache.put(key, f"path of {key}")
    return value


def test_unpinned_entries_never_exceed_the_capacity() -> None:
    cache: WTinyLFU[str, str] = WTinyLFU(capacity=8, window_percent=25)
    for n in range(200):
        lookup(cache, f"tool-{n % 37}")
        assert len(cache) <= 8


@pytest.mark.parametrize(
    ("capacity", "percent", "window", "probation", "protected"),
    [(32, 1, 1, 6, 25), (32, 50, 16, 3, 13), (100, 10, 10, 18, 72), (1, 1, 1, 0, 0)],
)
def test_window_percent_sizes_the_admission_window(
    capacity: int, percent: int, window: int, probation: int, protected: int
) -> None:
    cache: WTinyLFU[str, str] = WTinyLFU(capacity, percent)
    assert (cache.window_size, cache.probation_size, cache.protected_size) == (
        window,
        probation,
        protected,
    )
    assert window + probation + protected == capacity


def test_a_frequently_used_tool_survives_a_scan_of_one_time_names() -> None:
    """Admission by frequency: names used once cannot push out names used often, which an
    LRU of the same size would have dropped after ``capacity`` new names.  (The scan is
    shorter than the sketch's sample of 10 x capacity lookups, after which old counts fade.)"""
    cache: WTinyLFU[str, str] = WTinyLFU(capacity=10, window_percent=10)
    hot = [f"hot-{n}" for n in range(5)]
    for _ in range(4):
        for name in hot:
            lookup(cache, name)
    for n in range(70):
        lookup(cache, f"once-{n}")
    assert all(name in cache for name in hot)
    assert sum(f"once-{n}" in cache for n in range(70)) <= 5


def test_a_name_used_again_replaces_a_colder_one() -> None:
    """The other side of admission: a candidate asked for more often than main's victim
    gets in, so the cache follows a shift in what is used."""
    cache: WTinyLFU[str, str] = WTinyLFU(capacity=4, window_percent=25)
    for name in ("a", "b", "c", "d"):
        lookup(cache, name)
    for _ in range(6):
        lookup(cache, "new")
    assert "new" in cache
    assert len(cache) == 4


def test_pinned_entries_are_exempt_from_eviction_and_capacity() -> None:
    cache: WTinyLFU[str, str] = WTinyLFU(capacity=2, window_percent=50)
    cache.pin("tsh.config", "/ctx/tool/tsh.config")
    for n in range(50):
        lookup(cache, f"tool-{n}")
    assert cache.get("tsh.config") == "/ctx/tool/tsh.config"
    assert cache.is_pinned("tsh.config")
    assert len(cache) == 2  # the pinned entry is not counted
    cache.clear()
    assert "tsh.config" in cache and len(cache) == 0
    cache.unpin("tsh.config")
    assert not cache.is_pinned("tsh.config") and "tsh.config" in cache


def test_a_second_use_on_probation_promotes_to_protected() -> None:
    cache: WTinyLFU[str, str] = WTinyLFU(capacity=10, window_percent=10)
    for name in ("a", "b"):
        lookup(cache, name)
    lookup(cache, "c")  # pushes b... out of the window onto probation
    assert cache.keys()[-1] == "c"  # the window holds the newest
    cache.get("a")
    assert cache.keys()[0] == "a"  # protected, listed first


def test_the_sketch_never_undercounts_and_ages_by_halving() -> None:
    sketch: FrequencySketch[str] = FrequencySketch(capacity=4)  # halves after 40 lookups
    for _ in range(12):
        sketch.increment("x")
    assert sketch.frequency("x") >= 12
    for n in range(27):
        sketch.increment(f"other-{n}")
    assert sketch.frequency("x") >= 12
    sketch.increment("x")  # the 40th lookup
    assert 6 <= sketch.frequency("x") <= 7


def test_counters_saturate_at_fifteen() -> None:
    sketch: FrequencySketch[str] = FrequencySketch(capacity=1000)
    for _ in range(100):
        sketch.increment("x")
    assert sketch.frequency("x") == 15


def test_a_capacity_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        WTinyLFU(0, 1)
    with pytest.raises(ValueError):
        WTinyLFU(4, 0)
