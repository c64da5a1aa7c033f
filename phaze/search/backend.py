"""Where independent work items run: in-process, over local processes, or on a Ray cluster.

The architecture search solves many independent operator-scheduling problems (0.01-2 s each) and
prepares model settings (tens of seconds each); :func:`make_backend` returns a :class:`Backend`
whose ``map(fn, items)`` runs ``fn`` over the items and returns the results in input order.

* **Spawn, not fork.** The parent has torch imported; forking a process that owns torch's (and
  OpenMP's) threads can deadlock the child, so local workers start fresh interpreters, or are
  forked from a fork server that imported torch single-threaded before anything ran
  (:func:`start_fork_server`, a cold search's). Each worker is limited to one BLAS/OpenMP
  thread: N single-threaded workers on N cores, not N x N threads.
* **Chunks.** One task per item would cost a pickle round trip (or a Ray task) per 10 ms solve;
  items go out in chunks, a few per worker, so that the overhead is amortised while a slow chunk
  still cannot leave the other workers idle for long.
* **Determinism.** ``map`` preserves input order and the work items are deterministic functions of
  their inputs, so results never depend on the backend, the number of jobs or the scheduling; when
  several items fail, the error raised is the first one in input order.

``fn`` must be a module-level function (pickled by reference): the workers import its module. A
local Ray instance gets the parent's ``sys.path``; a remote cluster needs phaze installed.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import pickle
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import BrokenExecutor
from typing import Any

from phaze.messages import show_warnings_as
from phaze_ir.errors import PhazeError, PhazeWarning

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _run_chunk(fn: Callable, chunk: Sequence) -> tuple[bool, Any, list[tuple[type[Warning], str]]]:
    """Run ``fn`` over one chunk in a worker: ``(True, results, warned)`` or ``(False, exception,
    warned)``, ``warned`` being the phaze warnings issued meanwhile.

    Errors come back as values, not raised, so that the parent re-raises them unchanged: a raised
    exception would reach the caller wrapped by concurrent.futures or Ray (with a remote traceback
    in its message), and one that does not survive pickling would turn into a pickling error.
    Phaze's warnings come back too, for the parent to say each once: every worker would
    otherwise say what the others say (the same model imported in each).
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PhazeWarning)
        ok, value = _run(fn, chunk)
    warned: list[tuple[type[Warning], str]] = []
    for w in caught:
        if issubclass(w.category, PhazeWarning):
            warned.append((w.category, str(w.message)))
        else:  # not phaze's: shown here, as it would have been
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return ok, value, warned


def _run(fn: Callable, chunk: Sequence) -> tuple[bool, Any]:
    try:
        return True, [fn(item) for item in chunk]
    except Exception as e:
        if not isinstance(e, PhazeError):  # a bug, not the user's input: keep where it happened
            import traceback

            if hasattr(e, "add_note"):
                e.add_note("In a worker process:\n" + "".join(traceback.format_exception(e)).rstrip())
        try:
            pickle.loads(pickle.dumps(e))
            return False, e
        except Exception:
            if isinstance(e, PhazeError):
                return False, PhazeError(str(e))
            return False, RuntimeError(f"{type(e).__name__}: {e}")


def _unwrap(results: Iterable[tuple[bool, Any, list[tuple[type[Warning], str]]]]) -> list:
    """Concatenate chunk results in order, raising the first error (deterministically); the
    workers' warnings are issued here, where the usual filter says each message once."""
    out: list = []
    for ok, value, warned in results:
        for category, message in warned:
            warnings.warn(message, category, stacklevel=2)
        if not ok:
            raise value
        out.extend(value)
    return out


def _chunks(items: Sequence, jobs: int) -> list[list]:
    """Split ``items`` into consecutive chunks, about four per worker."""
    size = max(1, -(-len(items) // (4 * jobs)))
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def _init_worker() -> None:
    """Process-pool initializer: one math thread per worker, Ctrl-C left to the parent."""
    import signal

    # Workers ignore SIGINT (the terminal sends it to the whole process group): the parent
    # cancels the pool and terminates them, instead of every worker printing a traceback.  A
    # worker starts with SIGINT blocked (:func:`_sigint_deferred`): a Ctrl-C that came while it
    # started is pending until here, and is ignored when unblocked.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    for var in _THREAD_VARS:
        os.environ[var] = "1"
    if "torch" in sys.modules:  # imported by the spawned __main__ before the environment was set
        sys.modules["torch"].set_num_threads(1)
    show_warnings_as("phazec")


@contextlib.contextmanager
def _sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C back while worker processes (or the fork server they fork from) start, and
    raise it when they have: SIGINT blocked in this thread, and meanwhile handled by a handler
    that only notes it.

    - Workers start with SIGINT blocked (a signal mask is inherited across fork and exec), so
      a Ctrl-C that reaches one before its initializer ran stays pending until
      :func:`_init_worker` ignores it (an interrupted half-started worker prints a traceback).
      The pool's threads, started inside the block, inherit the mask too.
    - The parent's Ctrl-C is never lost: one taken by another thread of this process that does
      not block SIGINT (torch's native threads, once a model was traced here) reaches the noting
      handler, and one sent here stays pending until the mask is restored.  It is raised when
      the block ends, never inside it: an interrupt between a worker's start and its
      registration with the pool would leave that worker out of the abort's reach (it would
      then fail on the pool's vanished semaphores with a traceback)."""
    import signal
    import threading
    from multiprocessing import resource_tracker

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # multiprocessing starts its resource tracker with the first process, and unblocks SIGINT
    # after it (CPython's resource_tracker.ensure_running): started first, it leaves the mask be.
    resource_tracker.ensure_running()
    came: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: came.append(signum))
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # a pending Ctrl-C is noted here
        signal.signal(signal.SIGINT, previous)
    if came and callable(previous):
        previous(signal.SIGINT, None)
    elif came and previous == signal.SIG_DFL:
        signal.raise_signal(signal.SIGINT)


class Backend:
    """Runs ``fn`` over independent items; serial and in-process in this base class."""

    name: str = "serial"
    jobs: int = 1

    def map(self, fn: Callable, items: Sequence) -> list:
        """``[fn(item) for item in items]``, in input order."""
        return [fn(item) for item in items]

    def close(self) -> None:
        """Release workers (none here); the backend may not be used afterwards."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


#: The modules the fork server was started with (:func:`start_fork_server`), None until then.
#: A module global because the server is the process's: Python's ``multiprocessing`` keeps one
#: fork server per process, its preload list process-wide too, and a pool made later in the
#: process (another backend) forks from it as well.  It decides only how local workers start
#: (forked from the server, or spawned), never what they answer: every work item is a function
#: of its inputs (``tests/test_backend.py``: ``test_workers_fork_from_a_server_that_imported_torch``
#: gets the same results as spawned workers).
_fork_server_modules: tuple[str, ...] | None = None


def start_fork_server(modules: Sequence[str]) -> None:
    """Start now, in the background, a process that imports ``modules`` and then forks this
    process's local workers (Python's ``forkserver``), instead of spawning each afresh.

    A cold search prepares its settings on the workers, and each spawned worker spent about 5 s
    importing torch and transformers before its first item, after the main process had spent as
    long importing them for itself; a server started before the main process imports them does
    it once, on the other core, meanwhile.  The server imports with one math thread
    (``_THREAD_VARS``, set for it alone), so that it forks from a single thread, and holds no
    torch state but its modules: forking it is as safe as spawning.  Started at most once per
    process; later pools fork from it too."""
    global _fork_server_modules
    if _fork_server_modules is not None:
        return
    import multiprocessing
    import multiprocessing.forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(list(modules))
    saved = {var: os.environ.get(var) for var in _THREAD_VARS}
    os.environ.update(dict.fromkeys(_THREAD_VARS, "1"))
    try:
        with _sigint_deferred():  # the server's workers fork with its mask: SIGINT blocked
            multiprocessing.forkserver.ensure_running()
    except OSError:  # no server (e.g. no Unix sockets here): the workers are spawned, as before
        return
    finally:
        for var, value in saved.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
    _fork_server_modules = tuple(modules)


class LocalBackend(Backend):
    """A process pool of ``jobs`` workers, started on first use and reused: spawned, or forked
    from the fork server when this process started one (:func:`start_fork_server`)."""

    name = "local"

    def __init__(self, jobs: int):
        self.jobs = jobs
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None

    def map(self, fn: Callable, items: Sequence) -> list:
        """Run the chunks on the pool; 0 or 1 item runs in-process (starting workers costs more)."""
        items = list(items)
        if len(items) <= 1:
            return super().map(fn, items)
        if self._pool is None:
            import multiprocessing

            self._pool = concurrent.futures.ProcessPoolExecutor(
                max_workers=self.jobs,
                mp_context=multiprocessing.get_context("spawn" if _fork_server_modules is None else "forkserver"),
                initializer=_init_worker,
            )
        futures: list[concurrent.futures.Future] = []
        try:
            with _sigint_deferred():  # workers start here: a Ctrl-C now must not reach them half-started
                futures += (self._pool.submit(_run_chunk, fn, chunk) for chunk in _chunks(items, self.jobs))
            return _unwrap(f.result() for f in futures)
        except BaseException as e:
            # KeyboardInterrupt: stop everything now; a broken pool (a worker died) cannot be reused.
            if not isinstance(e, Exception) or isinstance(e, BrokenExecutor):
                self._abort()
            raise
        finally:
            for f in futures:  # after an error, chunks not started yet are not wanted
                f.cancel()

    def _abort(self) -> None:
        """Drop the pool without letting running chunks finish (they may take tens of seconds)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        # Kill the workers first, then join the pool: its manager thread sees them die and fails
        # the pending futures itself.  (Cancelling them first makes Python 3.11's manager thread
        # raise InvalidStateError on a cancelled future and print it at exit.)
        for p in list((getattr(pool, "_processes", None) or {}).values()):
            p.terminate()
        pool.shutdown(wait=True)

    def close(self) -> None:
        """Shut the pool down, waiting for its workers to exit."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _probe(address: str) -> None:
    """Fail fast on an unreachable Ray head: ``ray.init`` retries a dead address for minutes."""
    import socket

    host, sep, port = address.split("://", 1)[-1].rpartition(":")
    if not sep or not port.isdigit():  # "auto" and the like: left to Ray's own lookup
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as e:
        raise PhazeError(f"--backend ray: cannot connect to Ray at {address}: {e.strerror or e}") from None


def _forget_ray_token() -> None:
    """Make Ray read its auth settings and token from the environment again before a new local
    instance starts.  Ray 2.60 caches both in the process (``ray._raylet``'s
    ``AuthenticationTokenLoader`` and ``Config``), so a second instance started in the same
    process after its environment changed (a new token, or ``RAY_AUTH_MODE`` gone: a caller that
    restores its environment) gave its GCS the new token while the client kept sending the old
    one ("InvalidAuthToken").  Ray's own tests reset them so
    (``ray/_private/authentication_test_utils.py``, ``reset_auth_token_state``)."""
    try:
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # Cython, no stubs
    except ImportError:  # a Ray without token auth caches nothing
        return
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


class RayBackend(Backend):
    """One Ray task per chunk, on a local Ray instance or the cluster at ``address``."""

    name = "ray"

    def __init__(self, jobs: int, address: str | None):
        try:
            import ray
        except ImportError:
            raise PhazeError("--backend ray needs Ray: pip install 'phaze[ray]'") from None
        self.jobs, self._ray, self._owned = jobs, ray, False
        local = address is None or address == "local"
        threads = dict.fromkeys(_THREAD_VARS, "1")  # one math thread per task, as in the local pool
        if address is not None and not local:
            _probe(address)
        if ray.is_initialized():  # someone in this process already connected: share, never shut down
            pass
        elif local:
            import secrets

            # Recent Ray turns token auth on for a local instance and saves a generated token
            # under ~/.ray; a token in our environment (inherited by the raylet and workers)
            # keeps auth on without writing to $HOME, and its "auth is enabled" notice is ours.
            if not any(v in os.environ for v in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")):
                os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
                logging.getLogger("ray._private.authentication").setLevel(logging.ERROR)
            _forget_ray_token()
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage report sent home
            # Workers import fn's module by name: give them the modules this process sees.
            path = os.pathsep.join(os.path.abspath(p or ".") for p in sys.path if os.path.isdir(p or "."))
            ray.init(
                # "local": always a new instance of our own; without an address Ray joins a cluster
                # it finds running on the machine (ray/_private/services.py,
                # get_ray_address_from_environment: /tmp/ray/ray_current_cluster, GCS processes)
                address="local",
                num_cpus=jobs,
                include_dashboard=False,
                log_to_driver=False,
                ignore_reinit_error=True,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": {**threads, "PYTHONPATH": path}},
            )
            self._owned = True
        else:
            try:
                ray.init(
                    address=address,
                    log_to_driver=False,
                    logging_level=logging.WARNING,
                    runtime_env={"env_vars": threads},
                )
            except Exception as e:
                # Ray's message is generic ("Failed to connect"); the root cause, whose message may
                # embed a traceback, ends with the reason (e.g. a missing auth token).
                root: BaseException = e
                while root.__cause__ is not None:
                    root = root.__cause__
                why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                if root is not e and str(root).strip():
                    why += f" ({str(root).strip().splitlines()[-1].split('. ')[0]})"
                raise PhazeError(f"--backend ray: cannot connect to Ray at {address}: {why}") from None
            # Chunk for the cluster's size, not the local -j.
            self.jobs = max(jobs, int(ray.cluster_resources().get("CPU", 0)))
        self._task = ray.remote(_run_chunk)

    def map(self, fn: Callable, items: Sequence) -> list:
        """Submit the chunks as Ray tasks and gather their results in order."""
        items = list(items)
        if not items:
            return []
        refs = [self._task.remote(fn, chunk) for chunk in _chunks(items, self.jobs)]
        try:
            return _unwrap(self._ray.get(refs))
        except KeyboardInterrupt:
            for ref in refs:
                self._ray.cancel(ref, force=True)
            raise

    def close(self) -> None:
        """Shut Ray down if this backend started it; a shared connection stays open."""
        if self._owned:
            self._owned = False
            self._ray.shutdown()


def make_backend(kind: str = "local", jobs: int = 1, address: str | None = None) -> Backend:
    """The backend for ``--backend KIND -j JOBS [--ray-address ADDRESS]``.

    ``local`` with one job runs in-process; ``local`` with more uses a process pool; ``ray`` starts
    a local Ray instance of ``jobs`` CPUs (``address`` None or "local") or connects to ``address``.
    """
    if not isinstance(jobs, int) or jobs < 1:
        raise PhazeError(f"-j {jobs}: expected a positive number of processes")
    if kind == "local":
        return Backend() if jobs == 1 else LocalBackend(jobs)
    if kind == "ray":
        return RayBackend(jobs, address)
    raise PhazeError(f"--backend {kind}: expected 'local' or 'ray'")
