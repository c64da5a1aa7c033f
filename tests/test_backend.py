"""The work-distribution backends: in-process, a local process pool and a local Ray instance all
return the same results in the same order, and report errors the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from phaze.search.backend import Backend, make_backend
from phaze_ir.errors import PhazeError

ITEMS = list(range(50))


# Module-level, so that workers can import them by reference.
def square(x: int) -> int:
    return x * x


def fail_on_7(x: int) -> int:
    if x == 7:
        raise ValueError(f"bad item {x}")
    return x


def phaze_fail_on_3(x: int) -> int:
    if x >= 3:
        raise PhazeError(f"item {x}: not schedulable")
    return x


class Unpicklable(Exception):
    def __init__(self, a, b):  # pickling re-calls __init__ with one argument: cannot round-trip
        super().__init__(f"{a}/{b}")


def raise_unpicklable(x: int) -> int:
    raise Unpicklable(x, "why")


def thread_vars(_x: int) -> tuple:
    return tuple(os.environ.get(v) for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"))


def worker_state(_x: int) -> tuple:
    """Whether torch was imported before the item (by the fork server), and its threads."""
    preloaded = "torch" in sys.modules
    import torch

    return preloaded, torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


@pytest.fixture(scope="module")
def pool():
    with make_backend("local", jobs=2) as backend:
        yield backend


@pytest.fixture(scope="module")
def ray_backend():
    pytest.importorskip("ray")
    with make_backend("ray", jobs=2) as backend:
        yield backend


@pytest.fixture(params=["serial", "local", pytest.param("ray", marks=pytest.mark.leaves_global_state)])
def backend(request) -> Backend:
    if request.param == "serial":
        return make_backend("local", jobs=1)
    return request.getfixturevalue("pool" if request.param == "local" else "ray_backend")


def test_kinds():
    assert type(make_backend()) is Backend and make_backend().jobs == 1
    assert make_backend("local", jobs=3).name == "local"


def test_same_ordered_results(backend):
    assert backend.map(square, ITEMS) == [x * x for x in ITEMS]
    assert backend.map(square, iter(ITEMS)) == [x * x for x in ITEMS]


def test_reusable_and_small_inputs(backend):
    assert backend.map(square, []) == []
    assert backend.map(square, [3]) == [9]
    for n in (2, 5, 13):
        assert backend.map(square, range(n)) == [x * x for x in range(n)]


def test_value_error_propagates(backend):
    with pytest.raises(ValueError) as info:
        backend.map(fail_on_7, ITEMS)
    assert str(info.value) == "bad item 7"
    assert backend.map(square, [1, 2]) == [1, 4]  # still usable after an error


def test_phaze_error_keeps_message(backend):
    # The first failure in input order, whatever the workers' timing.
    with pytest.raises(PhazeError) as info:
        backend.map(phaze_fail_on_3, ITEMS)
    assert str(info.value) == "item 3: not schedulable"


def test_unpicklable_error(backend):
    # In a worker, an exception that cannot cross the process boundary keeps its type's name.
    expected = (Unpicklable, "0/why") if backend.name == "serial" else (RuntimeError, "Unpicklable: 0/why")
    with pytest.raises(expected[0]) as info:
        backend.map(raise_unpicklable, [0, 1])
    assert str(info.value) == expected[1]


def test_workers_single_threaded(backend):
    if backend.name == "serial":
        pytest.skip("no workers: the items run in this process")
    # N one-thread workers, not N workers of N threads each.
    assert set(backend.map(thread_vars, range(8))) == {("1", "1", "1")}


INTERRUPTED = r"""
import sys, time
from phaze.search.backend import make_backend
if __name__ == "__main__":
    backend = make_backend("local", jobs=2)
    backend.map(abs, [0, 0])  # the workers are up
    print("ready", flush=True)
    try:
        backend.map(time.sleep, [60] * 4)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
    backend.close()
"""


def test_ctrl_c_does_not_hang():
    """Ctrl-C (SIGINT to the whole process group) stops a pool busy with minute-long items."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # A shell's background job starts with SIGINT ignored, and so would the child without this.
    proc = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert proc.stdout.readline() == "ready\n"
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert out == "interrupted\n" and proc.returncode == 0


FORK_SERVER = r"""
import os, sys
from phaze.search.backend import make_backend, start_fork_server
from test_backend import worker_state
if __name__ == "__main__":
    start_fork_server(["torch", "no_such_module"])
    print(os.environ.get("OMP_NUM_THREADS"), "torch" in sys.modules)
    with make_backend("local", jobs=2) as backend:
        print(sorted(set(backend.map(worker_state, range(4)))), sorted(backend.map(abs, [-2, -1])))
"""


def test_workers_fork_from_a_server_that_imported_torch():
    """A cold search's workers fork from a server that imported torch with one math thread
    (a module that is not installed is left out); the parent's environment and modules stay
    its own."""
    root = Path(__file__).resolve().parent.parent
    path = os.pathsep.join([str(root), str(root / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    r = subprocess.run(
        [sys.executable, "-c", FORK_SERVER], env={**env, "PYTHONPATH": path}, cwd=root, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["None False", "[(True, 1, '1')] [1, 2]"]


@pytest.mark.parametrize(
    "kind, jobs, message",
    [
        ("local", 0, "-j 0: expected a positive number of processes"),
        ("ray", -1, "-j -1: expected a positive number of processes"),
        ("foo", 1, "--backend foo: expected 'local' or 'ray'"),
    ],
)
def test_bad_arguments(kind, jobs, message):
    with pytest.raises(PhazeError) as info:
        make_backend(kind, jobs=jobs)
    assert str(info.value) == message


def test_ray_unreachable():
    pytest.importorskip("ray")
    with pytest.raises(PhazeError, match=r"^--backend ray: cannot connect to Ray at 127\.0\.0\.1:1: "):
        make_backend("ray", jobs=1, address="127.0.0.1:1")


def test_ray_missing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(PhazeError, match=r"pip install 'phaze\[ray\]'"):
        make_backend("ray", jobs=2)


def test_a_ctrl_c_while_workers_start_reaches_the_parent_after():
    """SIGINT is held back while workers start (they inherit the blocked mask), and one that
    came meanwhile is not lost: it is raised in the parent when the block ends (the Ctrl-C
    test's race), never inside it."""
    import threading

    from phaze.search.backend import _sigint_deferred

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only; this runner runs tests on another")
    raised_inside = False
    # as in phazec (a test runner's worker may ignore SIGINT itself)
    runner = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            with _sigint_deferred():
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
                raised_inside = True  # not raised here: the workers would have seen it
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, runner)
    assert raised_inside
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())


def test_a_ctrl_c_another_thread_takes_while_workers_start_is_raised_after():
    """A Ctrl-C that a thread not blocking SIGINT takes meanwhile (torch's threads in phazec)
    is neither dropped nor raised inside the block (where it could fall between a worker's
    start and its registration with the pool): it is raised when the block ends."""
    import threading

    from phaze.search.backend import _sigint_deferred

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only; this runner runs tests on another")
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)  # started before the block: SIGINT unblocked
    other.start()
    runner = signal.signal(signal.SIGINT, signal.default_int_handler)
    # The C-level handler writes each signal it takes to the wakeup fd: read back, it says the
    # other thread took the Ctrl-C (no clock: the read waits for exactly that).
    woken_r, woken_w = os.pipe()
    os.set_blocking(woken_w, False)
    wakeup = signal.set_wakeup_fd(woken_w)
    done_inside = False
    try:
        with pytest.raises(KeyboardInterrupt):
            with _sigint_deferred():
                assert other.ident is not None
                signal.pthread_kill(other.ident, signal.SIGINT)
                assert os.read(woken_r, 1) == bytes([signal.SIGINT])
                for _ in range(1000):  # bytecode boundaries: where a raised Ctrl-C would land
                    pass
                done_inside = True
    finally:
        signal.set_wakeup_fd(wakeup)
        os.close(woken_r)
        os.close(woken_w)
        signal.signal(signal.SIGINT, runner)
        stop.set()
        other.join()
    assert done_inside


def _blocked_signals(_: object) -> list[int]:
    return sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, set()))


def test_a_process_started_in_the_block_starts_with_sigint_blocked():
    """The mask crosses fork and exec (a spawned process starts with SIGINT blocked) even on the
    process's first spawn, when multiprocessing starts its resource tracker, which unblocks
    SIGINT after it; and the pool's initializer ignores and unblocks it in each worker."""
    import concurrent.futures
    import multiprocessing
    import threading

    from phaze.search.backend import _init_worker, _sigint_deferred

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("the block applies to the main thread only")
    ctx = multiprocessing.get_context("spawn")
    with _sigint_deferred():
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as bare:
            assert int(signal.SIGINT) in bare.submit(_blocked_signals, None).result()
    with _sigint_deferred():
        pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_worker)
        future = pool.submit(_blocked_signals, None)
    with pool:
        assert int(signal.SIGINT) not in future.result()


def test_ray_starts_again_after_its_environment_is_put_back(tmp_path):
    """A second local Ray instance in one process, after the caller put the environment back
    (as the tests' in-process ``phazec --backend ray`` does: the first start's token and auth
    mode gone), starts and runs: Ray's cached token is read again (it was the first one's, and the
    new GCS refused it). In a child process, so that no Ray of this test process is shared."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # not imported here: importing Ray changes sys.path
        pytest.skip("needs Ray")
    script = tmp_path / "twice.py"
    script.write_text(
        "import os\n"
        "from phaze.search.backend import make_backend\n"
        "saved = dict(os.environ)\n"
        "for _ in range(2):\n"
        "    with make_backend('ray', jobs=1) as backend:\n"
        "        print(backend.map(abs, [-1, -2]))\n"
        "    os.environ.clear()\n"
        "    os.environ.update(saved)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n") == ["[1, 2]", "[1, 2]", ""]
