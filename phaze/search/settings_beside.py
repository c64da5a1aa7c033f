"""The sweep's settings of later micro-batches prepared meanwhile in forked child processes
(:class:`SettingsBeside`: one fewer than the cores, the micro-batches dealt in turn to them and
to the sweep), while the sweep prepares the first one itself.

Why: each micro-batch's settings (``phaze.search.setting.prepare_points``: the model cut to 3
and 4 blocks traced, imported and sharded at every TP point) are independent of the others',
and they were two fifths of ``phazec``'s time on GPT-3 175B, one micro-batch after another on
one core.  A child forked before this process traced anything has the model and torch already
(``fork``), runs the same code on the same inputs, and sends back its settings; the sweep
takes them in its own order, so its log, cache entries and plan are those of the sweep without
children.  Not the CPU time: the same work, on other cores.

When the sweep takes a child's answer, and when not: only when the child prepared exactly the
question the sweep asks (the micro-batch, the same options, the TP widths: or more widths, when
the first micro-batch found the model's shapes refuse the others and the child's answer refused
them alike, which are then left out of it); the warnings the child was told are said by the sweep
when it takes the answer, in order, through its own filters and registries (so once, as preparing
it itself would say them); a child that failed, was asked other widths or cannot be forked leaves
the question to the sweep, which prepares it itself as without children, its errors raised there.
A child's answer also carries the skeletons its 4-block check accepted for the job's question
(``phaze.search.setting.skeletons_shown``), which the sweep takes as its own: its later jobs of
that question take one trace, as they would had the sweep made the check (the same code and
inputs in both processes).
Children are forked only as ``_CheckTrace`` forks its check trace (``phaze_ir/frontend/deepen``):
on a platform with ``fork``, this process running one thread (a lock another thread holds
stays held in a child) and no training step traced yet (autograd cannot run in a child forked
after its parent ran it), with more than one core.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Sequence
from typing import Any

#: One child's question: (micro-batch, TP widths, the options its settings are traced under).
Job = tuple[int, tuple[int, ...], Any]


def can_fork() -> bool:
    """Whether children may be forked now (see the module docstring)."""
    import multiprocessing
    import threading

    from phaze_ir.frontend.trace import autograd_ran

    if "fork" not in multiprocessing.get_all_start_methods() or (os.cpu_count() or 1) < 2:
        return False
    return threading.active_count() == 1 and not autograd_ran()


class SettingsBeside:
    """Children preparing settings, each a share of the :data:`Job`\\ s; :meth:`compute` gives
    what the sweep prepares a job with: its child's answer or ``prepare_points`` itself."""

    def __init__(self, model_path: str = "", acc: Any = None) -> None:
        self._asked: dict[int, tuple[Job, Any]] = {}  # job index -> (job, its child's pipe end)
        self._children: list[Any] = []
        self._model_path, self._acc = model_path, acc
        self._finalizer = weakref.finalize(self, _stop, self._asked, self._children)

    @classmethod
    def start(cls, model_path: str, jobs: Sequence[tuple[int, Job]], acc: Any) -> SettingsBeside:
        """Children for ``(index, job)`` of ``jobs`` (none when :func:`can_fork` says no): one
        fewer than the cores, the sweep the last, the jobs dealt in turn (the sweep's share is
        prepared by the sweep itself); each child prepares its share in order."""
        import multiprocessing

        beside = cls(model_path, acc)
        if not jobs or not can_fork():
            return beside
        workers = min(len(jobs), max(1, (os.cpu_count() or 2) - 1))
        shares: list[list[tuple[int, Job]]] = [[] for _ in range(workers + 1)]
        for k, job in enumerate(jobs):  # the sweep's own job comes first: it takes the last share
            shares[k % (workers + 1)].append(job)
        context = multiprocessing.get_context("fork")
        for share in shares[:workers]:
            answer, sent = context.Pipe(duplex=False)
            child = context.Process(target=_prepare, args=(model_path, [j for _, j in share], acc, sent), daemon=True)
            child.start()
            sent.close()
            beside._children.append(child)
            beside._asked |= {index: (job, answer) for index, job in share}
        from phaze.search.setting import plan_traces

        # this process's share of the cut traces, as each child's (after the forks: not theirs too), so
        # that a family of enough of them is traced once (``setting.plan_traces``; the sweep's first job aside)
        plan_traces(model_path, [(b, o) for _, (b, _, o) in shares[workers]])
        return beside

    def compute(self, index: int, job: Job) -> Callable[..., tuple[list[Any], list[Any], str]]:
        """What ``phaze.search.sweep.prepared`` prepares job ``index`` (asked as ``job``) with: a call
        that gives the child's answer (and says its warnings) when the child prepared ``job``
        (:func:`_answer_for`), else ``prepare_points``.  Asked in the order of the indices."""
        from phaze.search.setting import learn_skeletons, prepare_points

        entry = self._asked.pop(index, None)
        if entry is None:
            return prepare_points
        asked, answer = entry
        try:
            got = answer.recv()
        except (EOFError, OSError):  # the child died (its error, if any, is raised here again)
            got = None
        if got is None:
            return prepare_points
        got, said, skeletons = got
        # what the child's 4-block check accepted: a later job of its question here takes one trace
        learn_skeletons(self._model_path, asked[2], self._acc, skeletons)
        taken = _answer_for(job, asked, got)
        where = [w for _, _, filename, _ in said if (w := _registry_of(filename)) is not None]
        if taken is None or len(where) != len(said):
            return prepare_points
        ready, errors, name = taken

        def answered(model_path: str, micro_batch: int, tps: tuple[int, ...], o: Any, acc: Any = None):
            import warnings

            assert (micro_batch, tps, o) == job  # asked as the sweep asks it
            # what the child was told, said here as preparing it here would say it: through this
            # process's filters, and once where its module's registry has it already
            for (text, category, filename, lineno), (module, registry) in zip(said, where):
                warnings.warn_explicit(text, category, filename, lineno, module=module, registry=registry)
            return ready, errors, name

        return answered

    def cancel(self) -> None:
        """Stop the children (their answers not taken are not needed)."""
        _stop(self._asked, self._children)


def _answer_for(job: Job, asked: Job, got: Any) -> Any:
    """A child's answer ``got`` to ``asked``, as the answer to the sweep's ``job``, or None
    when it is not that answer: ``job`` asks what ``asked`` did but, perhaps, fewer widths,
    those the first micro-batch found the model's shapes refuse (``UNSHARDABLE``, at every
    micro-batch); the child's answer is then taken when it refused each of them so too and
    has no setting at them, and its refusals of them are left out, so that it is what
    ``prepare_points`` asked ``job`` gives (each width is sharded apart from the same trace)."""
    from phaze.search.sweep import UNSHARDABLE

    (b, widths, opts), (b_asked, widths_asked, opts_asked) = job, asked
    if (b, opts) != (b_asked, opts_asked) or not set(widths) <= set(widths_asked):
        return None
    ready, errors, name = got
    dropped = set(widths_asked) - set(widths)
    if any(s.tp in dropped for s in ready) or any(t in dropped and not e.startswith(UNSHARDABLE) for t, _, e in errors):
        return None
    return ready, [(t, sp, e) for t, sp, e in errors if t not in dropped], name


def _registry_of(filename: str) -> tuple[str, dict] | None:
    """The name and warnings registry (``__warningregistry__``, as :func:`warnings.warn` keeps
    it) of the loaded module of ``filename``, where a warning said there is said once; None
    when no loaded module has that file."""
    import sys

    for name, module in list(sys.modules.items()):
        if getattr(module, "__file__", None) == filename:
            return name, vars(module).setdefault("__warningregistry__", {})
    return None


def _stop(asked: dict[int, tuple[Job, Any]], children: list[Any]) -> None:
    for _, answer in asked.values():
        answer.close()
    for child in children:
        child.terminate()
        child.join()
    asked.clear()
    children.clear()


def _prepare(model_path: str, jobs: list[Job], acc: Any, sent: Any) -> None:
    """In the child: each job's ``prepare_points`` in turn, each sent as ``((settings, errors,
    model name), warnings, skeletons)`` (each warning it was told: its text, category, file and
    line; the skeletons its 4-block check accepted for the job's question,
    ``setting.skeletons_shown``), or None when it failed (the sweep then prepares it itself and
    says why).  Silent: what it would say the sweep says (its warnings when it takes the
    answer); Ctrl-C is the parent's to handle."""
    import signal
    import warnings

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    quiet = os.open(os.devnull, os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    from phaze.search.setting import plan_traces

    plan_traces(model_path, [(b, o) for b, _, o in jobs])  # its cut traces (a family of enough: traced once)
    for b, widths, opts in jobs:
        try:
            from phaze.search.setting import prepare_points, skeletons_shown

            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                got: Any = prepare_points(model_path, b, widths, opts, acc)
            told = [(str(w.message), w.category, w.filename, w.lineno) for w in said]
            answer = (got, told, skeletons_shown(model_path, opts, acc))
        except BaseException:  # the sweep prepares it itself, and raises what it raises
            answer = None
        try:
            sent.send(answer)
        except Exception:  # an answer that cannot be sent: the sweep prepares it itself
            sent.send(None)
    sent.close()
