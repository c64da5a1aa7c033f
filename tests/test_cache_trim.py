"""The cache kept under a size (``passes/cache_file.py``'s ``trim``, ``phazec
--cache-limit``): the least recently used entries go first, an entry read back counts as used,
nothing but entries is touched, and ``phazec`` trims after writing its outputs."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
from conftest import MODELS, run_main

from passes.cache_file import read_entry, trim, write_entry
from phaze.tools.flags import DEFAULT_CACHE_LIMIT, cache_size

FMT, VERSION = "phaze-test", 1


def _entry(path: Path, key: str, when: float) -> int:
    """Write an entry for ``key`` at ``path`` last used at ``when`` (seconds since the epoch);
    its size in bytes."""
    write_entry(path, FMT, VERSION, key, {"key": key, "data": "x" * 1000})
    os.utime(path, (when, when))
    return path.stat().st_size


def test_the_least_recently_used_entries_go_first(tmp_path):
    files = {k: tmp_path / sub / f"{k}.json" for k, sub in (("a", "s"), ("b", "t"), ("c", "s"), ("d", "t"))}
    sizes = {k: _entry(p, k, 1e9 + i) for i, (k, p) in enumerate(files.items())}
    # Reading "a" back whole makes it the most recently used, though it was written first.
    assert read_entry(files["a"], FMT, VERSION, "a")["key"] == "a"
    assert files["a"].stat().st_mtime > files["d"].stat().st_mtime
    # Room for two: "b" and "c" are the least recently used.
    removed, freed = trim(tmp_path, sizes["a"] + sizes["d"])
    assert (removed, freed) == (2, sizes["b"] + sizes["c"])
    assert sorted(p.name for p in tmp_path.rglob("*.json")) == ["a.json", "d.json"]
    # Under the limit nothing moves; a limit of nothing empties it.
    assert trim(tmp_path, 10**9) == (0, 0)
    assert trim(tmp_path, 0) == (2, sizes["a"] + sizes["d"])


def test_only_entries_are_touched(tmp_path):
    _entry(tmp_path / "old.json", "old", 1e9)
    other = tmp_path / "notes.txt"
    other.write_text("not an entry\n" * 1000)
    # A user's own JSON in a directory given as --cache: older than the entry, never removed.
    mine = tmp_path / "results" / "mine.json"
    mine.parent.mkdir()
    mine.write_text('{"format": "mine", "rows": [1, 2, 3]}' * 100)
    os.utime(mine, (1.0, 1.0))
    writing = tmp_path / ".new.json.abc123.tmp"  # write_entry's temporary file, being written
    writing.write_text("{" * 5000)
    os.utime(other, (1.0, 1.0))  # older than the entry: still not an entry
    size = (tmp_path / "old.json").stat().st_size
    assert trim(tmp_path, 0) == (1, size)
    assert other.exists() and writing.exists() and mine.exists() and not (tmp_path / "old.json").exists()
    with pytest.raises(ValueError, match="expected a name starting with 'phaze-'"):
        write_entry(tmp_path / "x.json", "mine", 1, "k", {})


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4GiB", 4 * 2**30),
        ("500MB", 500 * 10**6),
        ("0", 0),
        ("1e9", 10**9),
        ("2.5 gib", int(2.5 * 2**30)),
        ("12kB", 12000),
    ],
)
def test_sizes(text, size):
    assert cache_size(text) == size


@pytest.mark.parametrize("text", ["4 parsecs", "-1GB", "GB", ""])
def test_bad_sizes_are_refused(text):
    with pytest.raises(argparse.ArgumentTypeError, match="expected a size such as 4GiB, 500MB or 0"):
        cache_size(text)


def test_phazec_trims_its_cache_after_writing_the_plan(tmp_path):
    cache, plan = tmp_path / "cache", tmp_path / "plan.mlir"
    point = [str(MODELS / "tiny_gpt2.py"), "--hw", "a100", "--micro-batch", "1", "--tp", "1", "--devices", "8"]
    first = run_main("phazec", *point, "--global-batch", "8", "--cache", str(cache), "-o", str(plan))
    assert first.returncode == 0, first.stderr
    assert "cache: removed" not in first.stderr  # the default limit, 4 GiB, is far away
    assert DEFAULT_CACHE_LIMIT == 4 * 2**30
    kept = {p: p.stat().st_size for p in cache.rglob("*.json")}
    assert kept
    # Another question with room for nothing: the plan is written, every entry goes, and it says so.
    plan.unlink()
    second = run_main(
        "phazec", *point, "--global-batch", "16", "--cache", str(cache), "-o", str(plan), "--cache-limit", "1"
    )
    assert second.returncode == 0, second.stderr
    assert plan.exists() and not list(cache.rglob("*.json"))
    assert "least recently used entries" in second.stderr and "under 1 B (--cache-limit)" in second.stderr
    bad = run_main("phazec", *point, "--cache-limit", "lots")
    assert bad.returncode == 2 and "--cache-limit: 'lots': expected a size such as 4GiB" in bad.stderr
