"""Shared fixtures: traced and imported models, cached for the whole session (tracing a real
model takes seconds; every test that reads its IR shares one import)."""

from __future__ import annotations

import functools
import os
import random
import signal
import stat
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
MODELS = Path(__file__).resolve().parent / "models"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Module- and session-scoped fixtures run before ``own_cache``: they too get a cache of this
# session only, never the user's ~/.cache/phaze (phazec keeps answers there by default).
# Removed when the session's interpreter exits (a bare mkdtemp left one behind per run).
_SESSION_CACHE = tempfile.TemporaryDirectory(prefix="phaze-tests-cache-")
os.environ["XDG_CACHE_HOME"] = _SESSION_CACHE.name
# torch sets this itself, in the process's environment, the first time Inductor asks for its cache
# (torch/_inductor/runtime/cache_dir_utils.py): set here, once, it stays the same for every test.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(_SESSION_CACHE.name, "torchinductor")


def gpu_script(name: str):
    """A script of ``benchmarks/gpu/`` as a module, imported as it runs (its folder first on
    ``sys.path``, so its sibling imports resolve) and that folder taken off ``sys.path`` again at
    once: left there, its modules would shadow installed packages for every later test (a
    ``kernels.py`` there once hid Hugging Face's ``kernels`` from transformers).  benchmarks/ is no
    package: xDSL's wheel installs a top-level ``benchmarks`` of its own."""
    import importlib

    folder = str(ROOT / "benchmarks" / "gpu")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "leaves_global_state: the test starts a runtime that keeps process-wide state for the process's life "
        "(ray.init edits sys.path, the environment and signal handlers, and caches its auth token): not checked "
        "by check_no_global_state, and not restored (restoring would break the runtime's next start)",
    )


def pytest_addoption(parser):
    parser.addoption(
        "--file-order",
        default="given",
        metavar="given|reverse|shuffle:SEED",
        help="run the test files in this order (tests within a file keep theirs; given: the longest files "
        "first, LONGEST_FIRST, then as collected): the suite passes in any file order, since no test leaves "
        "global state behind (check_no_global_state)",
    )


#: The files that take longest (pytest --junitxml's times on a 2-core machine, 2026-12-07), run
#: first: pytest-xdist deals whole files (``--dist loadfile``) in collection order, so one of
#: these dealt last would leave the other worker idle for minutes at the end.
LONGEST_FIRST = (
    "test_sweep.py",
    "test_readme.py",
    "test_search_warm.py",
    "test_tp_shard.py",
    "test_deepen.py",
    "test_bad_input.py",
    "test_search.py",
    "test_search_dims.py",
    "test_examples.py",
)


def pytest_collection_modifyitems(config, items):
    order = config.getoption("--file-order")
    if order == "given":
        rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
        items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest as collected
        return
    files = list(dict.fromkeys(item.path for item in items))
    if order == "reverse":
        files.reverse()
    elif order.startswith("shuffle:") and order[len("shuffle:") :].isdigit():
        random.Random(int(order[len("shuffle:") :])).shuffle(files)
    else:
        raise pytest.UsageError(f"--file-order: expected given, reverse or shuffle:SEED, got {order!r}")
    rank = {path: i for i, path in enumerate(files)}
    items.sort(key=lambda item: rank[item.path])  # stable: a file's tests keep their order


#: The signals whose handlers a test might set (a tool's SIGINT/SIGPIPE handling, a timeout's SIGALRM).
_SIGNALS = [
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGPIPE,
    signal.SIGALRM,
    signal.SIGUSR1,
    signal.SIGUSR2,
]


#: The machine's own device files, which no test may replace (tests make device nodes in
#: tmp_path): a test that wrote ``-o /dev/null`` through a path that renames would replace it.
_MACHINE_DEVICES = ("/dev/null", "/dev/full", "/dev/zero")


def _device_files() -> dict[str, tuple[bool, int]]:
    out = {}
    for path in _MACHINE_DEVICES:
        try:
            st = os.lstat(path)
        except OSError:
            out[path] = (False, -1)
            continue
        out[path] = (stat.S_ISCHR(st.st_mode), st.st_rdev if stat.S_ISCHR(st.st_mode) else -1)
    return out


def _restore_device_files(before: dict[str, tuple[bool, int]]) -> None:
    """Put back a device file a test replaced (as root; else the failure names it)."""
    for path, (was_device, rdev) in before.items():
        if was_device and _device_files()[path] != (was_device, rdev):
            try:
                if os.path.lexists(path):
                    os.remove(path)
                os.mknod(path, 0o666 | stat.S_IFCHR, rdev)
                os.chmod(path, 0o666)
            except OSError:
                pass


def _global_state() -> dict:
    return {
        "the machine's device files": _device_files(),
        "sys.path": list(sys.path),
        "os.environ": {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"},  # pytest's own, per phase
        "the working folder": os.getcwd(),
        "warnings filters": list(warnings.filters),
        "signal handlers": {s.name: signal.getsignal(s) for s in _SIGNALS},
    }


@pytest.fixture(autouse=True)
def check_no_global_state(request):
    """A test leaves the process as it found it: ``sys.path`` (a folder left there shadows installed
    packages for every later test on the worker: benchmarks/gpu/ once hid Hugging Face's ``kernels``
    from transformers), the environment, the working folder, the warnings filters and the signal
    handlers, and the machine's own device files (``/dev/null``, ``/dev/full``, ``/dev/zero``).
    What a test changed is put back and the test fails, naming it; monkeypatch and
    tmp_path undo their own changes before this runs (this fixture is set up first, so torn down
    last)."""
    if request.node.get_closest_marker("leaves_global_state"):
        yield
        return
    before, modules = _global_state(), len(sys.modules)
    yield
    after = _global_state()
    changed = [name for name in before if before[name] != after[name]]
    if "warnings filters" in changed and len(sys.modules) > modules:
        # Libraries add filters of their own when first imported (torch, numpy, scipy, sympy), and
        # pytest puts the filters back after every test anyway: what a test must not do is take
        # filters away, or add them without importing anything.
        if all(f in after["warnings filters"] for f in before["warnings filters"]):
            changed.remove("warnings filters")
    if not changed:
        return
    if "the machine's device files" in changed:
        _restore_device_files(before["the machine's device files"])
    sys.path[:] = before["sys.path"]
    for key in set(os.environ) - set(before["os.environ"]) - {"PYTEST_CURRENT_TEST"}:
        del os.environ[key]
    os.environ.update(before["os.environ"])
    os.chdir(before["the working folder"])
    warnings.filters[:] = before["warnings filters"]
    for s in _SIGNALS:
        signal.signal(s, before["signal handlers"][s.name])
    details = []
    if "sys.path" in changed:
        details.append(f"sys.path gained {sorted(set(after['sys.path']) - set(before['sys.path']))}")
    if "the machine's device files" in changed:
        devices = before["the machine's device files"]
        details.append(f"device files replaced: {sorted(p for p in devices if devices[p] != after[p])}")
    if "os.environ" in changed:
        keys = {
            k
            for k in before["os.environ"].keys() | after["os.environ"].keys()
            if before["os.environ"].get(k) != after["os.environ"].get(k)
        }
        details.append(f"environment variables changed: {sorted(keys)}")
    pytest.fail(
        "the test left global state changed (restored now): "
        + ", ".join(changed)
        + (" (" + "; ".join(details) + ")" if details else ""),
        pytrace=False,
    )


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory, monkeypatch):
    """Each test's own empty default cache (phazec keeps answers, settings and schedules there):
    a test never reads what another test, or the user, left."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture(autouse=True)
def own_deepenings():
    """Each test starts with no deepening shown exact (``phaze.search.setting._SHOWN``, per
    process): what a test counts of the cut traces is what its own questions trace."""
    yield
    setting = sys.modules.get("phaze.search.setting")
    if setting is not None:
        setting._SHOWN.clear()


@functools.cache
def compiled(model_path: str, emit: str = "training", micro_batch: int = 1, kernels: str | None = None) -> str:
    """The printed module of ``phazec MODEL --emit EMIT`` (in-process, cached); ``kernels``:
    ``--kernels`` (a GPU runtime's keeps an SDPA model's attention, which ``ops``, the paper's
    default, runs eager: ``phaze.driver.with_runtime_attention``)."""
    from phaze.tools.phazec import _parser, compile_model

    flags = ["--kernels", kernels] if kernels else []
    args = _parser().parse_args([model_path, "--emit", emit, "--micro-batch", str(micro_batch), "-q", *flags])
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


def module_text(plan_text: str) -> str:
    """A plan file without the summary's ``//`` comment block that heads it (what ``phaze-opt``
    prints back: MLIR tools keep no comments)."""
    lines = plan_text.splitlines(keepends=True)
    i = 0
    while i < len(lines) and lines[i].startswith("//"):
        i += 1
    if i and i < len(lines) and lines[i] == "\n":
        i += 1
    return "".join(lines[i:])


@pytest.fixture(scope="session")
def tiny_gpt2_text() -> str:
    return compiled(str(MODELS / "tiny_gpt2.py"))


@pytest.fixture
def tiny_gpt2_module(tiny_gpt2_text):
    from phaze_ir.ir import parse_module

    return parse_module(tiny_gpt2_text)


def run_tool(
    *args: str, input: str | None = None, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run ``phazec``/``phaze-opt`` as a user would, via ``python -m`` so that the tests work
    from a source tree too."""
    tool, *rest = args
    module = {"phazec": "phaze.tools.phazec", "phaze-opt": "phaze.tools.phaze_opt"}[tool]
    full_env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", module, *rest],
        input=input,
        capture_output=True,
        text=True,
        cwd=cwd or ROOT,
        env=full_env,
        timeout=600,
    )


#: Python's own warning filters (a process started without -W or PYTHONWARNINGS): what a tool's
#: subprocess has, where pytest's are ``always`` for DeprecationWarning.
_PYTHON_FILTERS = (
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
)


def run_main(
    *args: str, input: str | None = None, cwd: Path | None = None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """:func:`run_tool`'s answer (exit status, stdout, stderr) from the tool's ``main`` in this
    process, for a test that checks what a tool says and writes, not the process it runs in: a
    subprocess spends about 5 of its 5.5 CPU-seconds importing torch, transformers and phaze.
    As the subprocess would: the working folder ``cwd`` (the checkout's root), ``env`` over this
    process's environment, ``input`` on stdin, Python's own warning filters, argparse's
    ``SystemExit`` as the status; everything put back after (the environment, the folder, the
    streams, the warnings, the exception hook and the route of transformers' warnings that a
    tool's ``main`` sets for its process).  An exception the tool does not catch is raised here
    (a subprocess would print its traceback and exit 1): the test fails with it.  The process's
    own behaviour (signals, exit codes of a crash, file limits, what it imports) needs
    :func:`run_tool`."""
    import contextlib
    import io

    from phaze_ir import warning as phaze_warning

    tool, rest = args[0], [os.fspath(arg) for arg in args[1:]]  # paths too, as subprocess takes them
    if tool == "phazec":
        from phaze.tools.phazec import main
    elif tool == "phaze-opt":
        from phaze.tools.phaze_opt import main
    elif tool == "phaze-validate":
        from phaze.tools.phaze_validate import main
    else:
        raise ValueError(f"run_main: expected phazec, phaze-opt or phaze-validate, got {tool!r}")
    saved_env, saved_cwd, saved_hook = dict(os.environ), os.getcwd(), sys.excepthook
    routed = phaze_warning.routed_for_the_process()
    saved_streams, saved_tempdir = (sys.stdin, sys.stdout, sys.stderr), tempfile.tempdir
    # Text streams over bytes, as a process's are (xDSL reads ``sys.stdin.buffer``).
    out, err = (io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True) for _ in range(2))
    try:
        os.environ.update(env or {})
        tempfile.tempdir = None  # read again from TMPDIR (Python keeps the first it found)
        os.chdir(cwd or ROOT)
        sys.stdin = io.TextIOWrapper(io.BytesIO((input or "").encode()), encoding="utf-8")
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()
            for action, category, module in reversed(_PYTHON_FILTERS):
                warnings.filterwarnings(action, category=category, module=module)
            try:
                status = main(rest)
            except SystemExit as e:  # argparse's --help and usage errors
                status = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                if e.code is not None and not isinstance(e.code, int):
                    print(e.code, file=sys.stderr)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        sys.excepthook, tempfile.tempdir = saved_hook, saved_tempdir
        phaze_warning.route_transformers(routed, for_the_process=True)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    said = [stream.buffer.getvalue().decode(errors="replace") for stream in (out, err)]  # type: ignore[attr-defined]
    return subprocess.CompletedProcess([tool, *rest], status, *said)


def compiled_with(model_path: str, emit: str, *flags: str) -> str:
    """The printed module of ``phazec MODEL --emit EMIT FLAGS`` (in-process)."""
    from phaze.tools.phazec import _parser, compile_model

    args = _parser().parse_args([model_path, "--emit", emit, *flags, "-q"])
    text, failure = compile_model(args, lambda msg: None)
    assert failure is None, failure
    return text


@pytest.fixture
def no_trace(monkeypatch):
    """Any trace fails the test: the refusal must come before it."""
    import phaze_ir.frontend as frontend

    def traced(*args, **kwargs):
        raise AssertionError("traced before refusing")

    monkeypatch.setattr(frontend, "trace_step", traced)
    monkeypatch.setattr(frontend, "trace_step_checked_later", traced)
    monkeypatch.setattr(frontend, "trace_cut_or_whole", traced)
