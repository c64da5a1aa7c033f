"""The search's on-disk cache is data, not code (issue 12, item 2): a file planted in it never
runs, an entry that fails its hashes, its schema or (schedules) its check against the problem is
ignored with one warning line and computed again, and the plan is then the one a clean cache
gives; a cache directory that cannot be used costs a warning, not the run.

End to end through ``phazec`` on the MLP example and the tiny space (a few seconds a run); the
checks of each kind of entry in process."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import EXAMPLES, run_main

from passes.algorithms import schedule as S
from passes.cache_file import FORMAT, VERSION, Store, content_hash, read_entry
from phaze.search import run as search_run
from phaze.search.setting import Setting
from phaze_ir.errors import PhazeWarning

MLP = str(EXAMPLES / "mlp.py")
TINY_SPACE = str(Path(__file__).parent / "data" / "tiny_space.toml")
ARGS = ["--space", TINY_SPACE, "--devices", "64", "--global-batch", "64", "--micro-batch", "8", "--tp", "1"]
ARGS += ["--no-baselines", "-q"]


def search(out: Path, cache: Path | None) -> tuple[str, dict, str]:
    """``phazec`` on the MLP with ``cache`` (None: ``--no-cache``): the plan's text, its JSON
    without the wall times and counters (which a warm cache changes), and stderr."""
    out.mkdir()
    args = [MLP, *ARGS, "-o", str(out / "plan.mlir"), "--json", str(out / "plan.json")]
    args += ["--cache", str(cache)] if cache is not None else ["--no-cache"]
    r = run_main("phazec", *args)
    assert r.returncode == 0, r.stderr
    data = json.loads((out / "plan.json").read_text())
    for k in ("wall_s", "evaluator"):
        data["search"].pop(k)
    return (out / "plan.mlir").read_text(), data, r.stderr


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("phazec: warning:")]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A search that fills a clean cache: ``(directory, plan text, JSON, cache)``."""
    root = tmp_path_factory.mktemp("clean")
    text, data, stderr = search(root / "run", root / "cache")
    assert warning_lines(stderr) == []
    return root, text, data, root / "cache"


def copy_cache(clean, tmp_path: Path) -> Path:
    """The clean run's settings and schedules, without its other stage entries (the answer, the
    search, the plan...), so that a run reads the settings and schedules again.
    tests/test_search_warm.py checks the stage entries."""
    cache = tmp_path / "cache"
    for part in ("settings", "schedule"):
        shutil.copytree(clean[3] / part, cache / part)
    return cache


def settings_file(cache: Path) -> Path:
    (file,) = sorted((cache / "settings").glob("*.json"))
    return file


def rewrite(file: Path, entry: dict, rehash: bool) -> None:
    """Write a cache entry back, its content hash recomputed (``rehash``) or left as it was."""
    if rehash:
        entry["content_hash"] = content_hash(entry["payload"])
    file.write_text(json.dumps(entry))


class Plant:
    """A pickle that makes directory ``marker`` when it is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


# ---------------------------------------------------------------------------------------------
# End to end
# ---------------------------------------------------------------------------------------------


def test_a_planted_pickle_never_runs(clean, tmp_path):
    # The payload is live: unpickling it makes its directory.
    pickle.loads(pickle.dumps(Plant(tmp_path / "live")))
    assert (tmp_path / "live").is_dir()
    cache = copy_cache(clean, tmp_path)
    marker = tmp_path / "ran"
    hostile = pickle.dumps(Plant(marker))
    good = settings_file(cache)
    good.write_bytes(hostile)  # where the search reads its settings
    good.with_suffix(".pkl").write_bytes(hostile)  # where phaze used to read them
    (cache / "settings" / "0123456789abcdef0123456789abcdef.pkl").write_bytes(hostile)
    some_schedule = sorted((cache / "schedule").glob("*.json"))[0]
    some_schedule.write_bytes(hostile)
    text, data, stderr = search(tmp_path / "run", cache)
    assert not marker.exists()
    assert (text, data) == clean[1:3]
    lines = warning_lines(stderr)
    assert f"phazec: warning: cache entry {good} is not JSON: ignored, prepared again" in lines
    assert f"phazec: warning: schedule cache entry {some_schedule} is not JSON: ignored, solved again" in lines
    assert len(lines) == 2
    # Both are written again, as data.
    assert json.loads(good.read_text())["format"] == FORMAT
    assert json.loads(some_schedule.read_text())["format"] == FORMAT


def test_a_doctored_settings_entry_is_prepared_again(clean, tmp_path):
    cache = copy_cache(clean, tmp_path)
    file = settings_file(cache)
    entry = json.loads(file.read_text())
    table = entry["payload"][0]["table"]
    matmul = next(d for d in table if d["desc"] == "matmul")
    matmul["k"] *= 4  # a plausible op, four times the work: the plan would change
    rewrite(file, entry, rehash=False)
    text, data, stderr = search(tmp_path / "run", cache)
    assert warning_lines(stderr) == [
        f"phazec: warning: cache entry {file} does not match its content hash: ignored, prepared again"
    ]
    assert (text, data) == clean[1:3]
    fresh = json.loads(file.read_text())
    assert fresh["payload"][0]["table"] == json.loads(settings_file(clean[3]).read_text())["payload"][0]["table"]


def test_a_doctored_schedule_is_caught_and_solved_again(clean, tmp_path):
    """Schedules twice as fast, consistent with themselves and rehashed: the hashes hold, the check
    against the problem does not, and neither the search nor the winner's compilation (which
    shares the cache) uses them."""
    cache = copy_cache(clean, tmp_path)
    files = [
        f
        for f in sorted((cache / "schedule").glob("*.json"))
        if json.loads(f.read_text())["payload"]["schedule"]["makespan"] > 0
    ]
    assert files
    for file in files:
        entry = json.loads(file.read_text())
        s = entry["payload"]["schedule"]
        for k in ("start", "end"):
            s[k] = [t * 0.5 for t in s[k]]
        for k in ("makespan", "lower_bound", "list_makespan"):
            s[k] *= 0.5
        rewrite(file, entry, rehash=True)
        assert entry["input_hash"][:32] == file.stem  # its name is its key's
        read_entry(file, FORMAT, VERSION, entry["input_hash"])  # the hashes hold
    text, data, stderr = search(tmp_path / "run", cache)
    assert (text, data) == clean[1:3]
    lines = warning_lines(stderr)
    assert len(lines) == len(files)
    for file in files:
        assert any(line.startswith(f"phazec: warning: schedule cache entry {file} ") for line in lines)
        entry = json.loads(file.read_text())  # solved again and written back
        clean_entry = json.loads((clean[3] / "schedule" / file.name).read_text())
        for e in (entry, clean_entry):
            e["payload"]["schedule"].pop("solve_s")
        assert entry["payload"] == clean_entry["payload"]
    assert all("is not a valid schedule of its problem" in line for line in lines)


def test_a_cache_directory_that_is_a_file_costs_one_warning(clean, tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("not a directory\n")
    text, data, stderr = search(tmp_path / "run", cache)
    assert warning_lines(stderr) == [
        f"phazec: warning: cache directory {cache} is not usable (it is not a directory); running without a cache"
    ]
    assert (text, data) == clean[1:3]
    assert cache.read_text() == "not a directory\n"


# ---------------------------------------------------------------------------------------------
# The settings cache, entry by entry
# ---------------------------------------------------------------------------------------------


def settings_entry(root: Path, key: str) -> Path:
    """Where the settings entry of ``key`` lies in the cache ``root``."""
    file = Store(root, "").file(search_run.SETTINGS_KIND, key)
    assert file is not None
    return file


def load(file: Path, key: str):
    """The settings entry ``file`` (of ``key``) read as the search reads it."""
    store = Store(file.parent.parent, "")  # its environment is in the key given
    assert store.file(search_run.SETTINGS_KIND, key) == file
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = store.load(search_run.SETTINGS_KIND, key, search_run._check_settings(8, (1,)), again="prepared again")
    return got, [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]


def test_a_settings_entry_round_trips(clean):
    file = settings_file(clean[3])
    entry = json.loads(file.read_text())
    got, said = load(file, entry["input_hash"])
    assert said == [] and got is not None
    assert [s.to_json() for s in got] == entry["payload"]
    assert [Setting.from_json(s.to_json()).to_json() for s in got] == entry["payload"]


def _retag(entry):
    entry["input_hash"] = "0" * 64


def _version(entry):
    entry["version"] = VERSION + 1


def _tp_text(entry):
    entry["payload"][0]["tp"] = "1"


def _row_out_of_range(entry):
    entry["payload"][0]["groups"][0]["rows"][0] = len(entry["payload"][0]["table"])


def _cycle(entry):
    group = next(g for g in entry["payload"][0]["groups"] if len(g["rows"]) >= 2)
    group["edges"] += [[0, 1], [1, 0]]


def _negative_bytes(entry):
    entry["payload"][0]["layers"][0]["numbers"]["param_bytes"] = -1


def _other_micro_batch(entry):
    entry["payload"][0]["micro_batch"] = 4


@pytest.mark.parametrize(
    "doctor, reason",
    [
        (_retag, "was computed from other inputs (its input hash differs)"),
        (_version, f"is of version {VERSION + 1}, not {VERSION}"),
        (_tp_text, "does not hold valid settings (tp = '1': expected an integer >= 1)"),
        (_row_out_of_range, "does not hold valid settings (group 0: its rows are not rows of the"),
        (_cycle, "does not hold valid settings (group"),
        (_negative_bytes, "does not hold valid settings (layer 0: layer param_bytes = -1: expected a count >= 0)"),
        (_other_micro_batch, "holds settings of another micro-batch or TP width than 8 and (1,)"),
    ],
)
def test_a_settings_entry_that_fails_a_check_is_ignored(clean, tmp_path, doctor, reason):
    entry = json.loads(settings_file(clean[3]).read_text())
    input_hash = entry["input_hash"]
    file = settings_entry(tmp_path, input_hash)
    file.parent.mkdir()
    doctor(entry)
    rewrite(file, entry, rehash=True)  # the content hash holds: the other checks catch it
    got, said = load(file, input_hash)
    assert got is None
    assert len(said) == 1 and said[0].startswith(f"cache entry {file} {reason}")
    assert said[0].endswith(": ignored, prepared again")


@pytest.mark.parametrize("content", [b"", b"\x00\xff garbage \x80", b"[1, 2, 3]", b'{"format": "phaze-settings"}'])
def test_garbage_in_the_settings_cache_is_ignored(clean, tmp_path, content):
    key = json.loads(settings_file(clean[3]).read_text())["input_hash"]
    file = settings_entry(tmp_path, key)
    file.parent.mkdir()
    file.write_bytes(content)
    got, said = load(file, key)
    assert got is None and len(said) == 1 and said[0].startswith(f"cache entry {file} ")


# ---------------------------------------------------------------------------------------------
# The schedule cache, entry by entry
# ---------------------------------------------------------------------------------------------


def _problem() -> S.Problem:
    ops = [("tensor", 4.0, 1.5), ("vector", 2.0, 1.0), ("vector", 3.0, 0.5), ("tensor", 8.0, 2.0), ("none", 0, 0)]
    return S.Problem.make(ops, [(0, 3), (1, 3), (2, 4)], {"tensor": 2, "vector": 4})


def lookups(directory: Path, problem: S.Problem) -> tuple[S.Schedule | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = S.ScheduleCache(directory).get(problem)
    return got, [str(w.message) for w in caught if issubclass(w.category, PhazeWarning)]


def _scaled(s):
    for k in ("start", "end"):
        s[k] = [t * 0.5 for t in s[k]]
    s["makespan"] *= 0.5


def _makespan_only(s):
    s["makespan"] *= 0.9


def _bounds(s):
    s["cp_bound"] *= 0.5


def _slower_than_warm_start(s):
    s["list_makespan"] *= 0.5


def _status(s):
    s["status"] = "proven"


def _short(s):
    s["end"] = s["end"][:-1]


def _gap(s):
    s["gap"] = 0.25


def _lower_bound(s):
    s["lower_bound"] = s["makespan"] * 2


def _split(s):
    s["split"] = [not x for x in s["split"]]


def _types(s):
    s["cores"] = [str(c) for c in s["cores"]]


@pytest.mark.parametrize(
    "doctor, reason",
    [
        (_scaled, "is not a valid schedule of its problem: op "),
        (_makespan_only, "has a makespan "),
        (_bounds, "has bounds (critical path "),
        (_slower_than_warm_start, "has a makespan "),
        (_status, "has a status 'proven' not one of"),
        (_short, "has end that is not a list of 5 values"),
        (_gap, "has a gap 0.25 that does not follow"),
        (_lower_bound, "has a lower bound "),
        (_split, "has op "),
        (_types, "has core counts that are not counts"),
    ],
)
def test_a_schedule_entry_that_fails_its_check_is_solved_again(tmp_path, doctor, reason):
    p = _problem()
    cache = S.ScheduleCache(tmp_path)
    solved = cache.solve(p)
    file = cache.file(p.canonical())
    assert file is not None
    assert lookups(tmp_path, p) == (solved, [])  # a clean entry is read back as it was written
    entry = json.loads(file.read_text())
    doctor(entry["payload"]["schedule"])
    rewrite(file, entry, rehash=True)
    got, said = lookups(tmp_path, p)
    assert got is None
    assert said == [said[0]] and said[0].startswith(f"schedule cache entry {file} {reason}")
    assert said[0].endswith(": ignored, solved again")
    # Solved again and written back: the next run reads it without a word.
    with pytest.warns(PhazeWarning):
        again = S.ScheduleCache(tmp_path).solve(p)
    assert again == solved or (again.makespan == solved.makespan and again.start == solved.start)
    assert lookups(tmp_path, p)[1] == []


def test_a_schedule_entry_of_another_problem_or_with_a_wrong_hash_is_ignored(tmp_path):
    p = _problem()
    other = S.Problem.make([("vector", 1.0, 1.0)], [], {"vector": 1})
    cache = S.ScheduleCache(tmp_path)
    cache.solve(p)
    cache.solve(other)
    file, other_file = cache.file(p.canonical()), cache.file(other.canonical())
    assert file is not None and other_file is not None
    shutil.copy(other_file, file)  # the right name, another problem
    assert lookups(tmp_path, p) == (
        None,
        [f"schedule cache entry {file} was computed from other inputs (its input hash differs): ignored, solved again"],
    )
    with pytest.warns(PhazeWarning):
        S.ScheduleCache(tmp_path).solve(p)  # solved again, and written over the wrong file
    entry = json.loads(file.read_text())
    assert entry["input_hash"] == cache.key(p.canonical())
    entry["payload"]["schedule"]["makespan"] *= 2
    rewrite(file, entry, rehash=False)
    assert lookups(tmp_path, p) == (
        None,
        [f"schedule cache entry {file} does not match its content hash: ignored, solved again"],
    )


def test_schedule_entries_of_another_version_are_said_once(tmp_path):
    problems = [_problem(), S.Problem.make([("vector", 1.0, 1.0)], [], {"vector": 1})]
    cache = S.ScheduleCache(tmp_path)
    for p in problems:
        cache.solve(p)
        file = cache.file(p.canonical())
        assert file is not None
        file.write_text(json.dumps(json.loads(file.read_text())["payload"]))  # the unversioned layout
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        fresh = S.ScheduleCache(tmp_path)
        assert [fresh.get(p) for p in problems] == [None, None]
    assert [str(w.message) for w in caught] == [
        f"schedule cache {tmp_path}: entries of another format version are ignored and solved again"
    ]


def test_an_unusable_schedule_directory_keeps_schedules_in_memory(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = S.ScheduleCache(blocker / "schedules")
    p = _problem()
    with pytest.warns(PhazeWarning, match=r"schedule cache directory .* is not usable \(.*\); schedules are kept"):
        solved = cache.solve(p)
    assert cache.directory is None and cache.get(p) == solved


def test_the_settings_of_an_unusable_directory_are_not_kept(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = Store(blocker, "")
    with pytest.warns(PhazeWarning, match=r"cache directory .* is not usable \(Not a directory\)"):
        store.keep(search_run.SETTINGS_KIND, "0" * 64, [])
    assert store.broken  # nothing more is tried


def test_a_read_only_cache_directory_costs_one_warning(tmp_path):
    from phaze.tools.phazec import usable_cache_dir

    cache = tmp_path / "cache"
    cache.mkdir()
    cache.chmod(0o500)
    try:
        probe = cache / "probe"
        try:
            probe.write_text("")
        except OSError:
            pass
        else:
            probe.unlink()
            pytest.skip("this user writes into a read-only directory (root): chmod does not stop it")
        with pytest.warns(PhazeWarning) as caught:
            assert usable_cache_dir(str(cache)) is None
        assert [str(w.message) for w in caught] == [
            f"cache directory {cache} is not usable (Permission denied); running without a cache"
        ]
    finally:
        cache.chmod(0o700)


def test_a_cache_directory_that_cannot_be_made_costs_one_warning(tmp_path):
    from phaze.tools.phazec import usable_cache_dir

    (tmp_path / "file").write_text("")
    with pytest.warns(PhazeWarning) as caught:
        assert usable_cache_dir(str(tmp_path / "file" / "cache")) is None
    assert [str(w.message) for w in caught] == [
        f"cache directory {tmp_path / 'file' / 'cache'} is not usable (Not a directory); running without a cache"
    ]
    assert usable_cache_dir(str(tmp_path / "new" / "cache")) == str(tmp_path / "new" / "cache")
    assert (tmp_path / "new" / "cache").is_dir() and list((tmp_path / "new" / "cache").iterdir()) == []
