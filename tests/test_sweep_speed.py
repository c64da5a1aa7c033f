"""What the ``--hw`` sweep skips or reuses for speed (issue 56, item 5) gives what it did
without: the settings' modules, no longer verified, verify; an attribute's text memoized by
the object is its text by value; the settings prepared, as a compilation,
with few young- and middle-generation collections."""

from __future__ import annotations

from conftest import MODELS
from xdsl.dialects.builtin import Float16Type, TensorType

from phaze.options import Options
from phaze_ir import dialect as ph

DEEP = str(MODELS / "tiny_gpt2_deep.py")


def test_the_settings_modules_verify(monkeypatch):
    """``_settings_of`` compiles each width's module without verifying it (only its setting is
    read of it): every module a setting is read from, kernels formed on the chip, at TP 1, 2
    with and without sequence parallelism, verifies."""
    import phaze.search.setting as st
    from phaze.pipeline import load_accelerator

    read = []
    real = st.setting_from_module

    def verified(module, *args, **kwargs):
        module.verify()  # raises when the IR is not valid
        read.append(module)
        return real(module, *args, **kwargs)

    monkeypatch.setattr(st, "setting_from_module", verified)
    opts = Options(hw="a100", kernels="eager", sequence_parallel="auto", tp_overlap="auto")
    ready, errors, _ = st.prepare_points(DEEP, 2, (1, 2), opts, load_accelerator("a100"))
    assert errors == [] and [(s.tp, s.sequence_parallel) for s in ready] == [(1, False), (2, False), (2, True)]
    assert len(read) == 2 * 3  # the model cut to 3 and to 4 blocks, three points each


def test_attr_text_by_object_is_its_text_by_value(monkeypatch):
    """Two equal types made apart, the same object asked twice, and past the objects kept
    (all forgotten at once): the same text, ``str`` of the attribute."""
    a, b = TensorType(Float16Type(), [4, 8]), TensorType(Float16Type(), [4, 8])
    assert a is not b
    assert ph.attr_text(a) == ph.attr_text(b) == ph.attr_text(a) == "tensor<4x8xf16>"
    monkeypatch.setattr(ph, "_TEXTS_KEPT", 2)
    c = TensorType(Float16Type(), [3])
    ph._TEXT_OF_OBJECT.clear()
    assert [ph.attr_text(x) for x in (a, b, c, a)] == ["tensor<4x8xf16>", "tensor<4x8xf16>", "tensor<3xf16>"] + [
        "tensor<4x8xf16>"
    ]
    assert len(ph._TEXT_OF_OBJECT) <= 2


#: Run in a new process (no training step traced yet, one thread: children may be forked): the
#: sweep with its later micro-batches' settings prepared in children, then (autograd has run:
#: no child) the same sweep without, printing whether children answered and whether the two
#: gave the same module text and points.
_BESIDE = """
import sys
from phaze.search import sweep
from phaze.options import Options
from phaze.search.settings_beside import SettingsBeside, can_fork
from phaze.search.setting import prepare_points
from phaze_ir.ir import print_module

answered = []
real = SettingsBeside.compute
def compute(self, index, job):
    got = real(self, index, job)
    answered.append((index, got is not prepare_points))
    return got
SettingsBeside.compute = compute
opts = Options(micro_batches=(1, 2, 4), tp_widths=(2,), sequence_parallel="auto", hw="a100", devices=8,
               global_batch=16)
before = can_fork()
said = []
out = []
for _ in range(2):
    module, cands = sweep.compile_plan(sys.argv[1], opts, said.append)
    points = [(c.micro_batch, c.tp, c.sequence_parallel, c.throughput, c.note) for c in cands]
    out.append((print_module(module), points))
said = [line for line in said if not line.startswith(("traced ", "built "))]  # (their seconds differ)
half = len(said) // 2
same_log = said[:half] == said[half:] and any("micro-batch 4" in s for s in said)
print(before, can_fork(), answered, out[0] == out[1], same_log)
"""


def test_settings_prepared_in_children_are_the_sweeps_own(tmp_path):
    """The settings of micro-batches 2 and 4 prepared in forked children while the sweep
    prepares micro-batch 1 (``phaze.search.settings_beside``; on two cores micro-batch 2 only, 4 the
    sweep's own): the children's answers taken, and the
    plan's module text, every point's throughput and note, and the log the same as the sweep
    that prepares them one after another (the second sweep: no child once autograd has run)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(MODELS.parents[1]))
    done = subprocess.run(
        [sys.executable, "-c", _BESIDE, DEEP], capture_output=True, text=True, check=False, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    if (os.cpu_count() or 1) < 2:  # no child on one core: the sweep alone, as before
        assert done.stdout.strip() == "False False " + str([(k % 3, False) for k in range(6)]) + " True True"
        return
    # micro-batch 1 the sweep's own; 2 and 4 dealt to one child a core but one and the sweep
    # (two cores: 2 the child's, 4 the sweep's); the second sweep all its own
    workers = min(2, max(1, (os.cpu_count() or 2) - 1))
    first = [(0, False)] + [(k + 1, k % (workers + 1) != workers) for k in range(2)]
    answered = first + [(k, False) for k in range(3)]
    assert done.stdout.strip() == f"True False {answered} True True", done.stdout


def test_a_broken_settings_entry_is_said_once_with_children(tmp_path):
    """Another question on the same model reads each micro-batch's settings from the cache:
    the sweep probes the store before it forks a child for a micro-batch (none when its
    settings are kept, the probe silent). Every entry broken: each said once, prepared again
    (micro-batches 2, 4, 8 by the children where there are cores) and kept anew."""
    import json

    from conftest import run_main

    from passes.cache_file import FORMAT, VERSION, read_entry
    from phaze.search.sweep import _check_prepared

    cache = tmp_path / "cache"
    args = [DEEP, "--hw", "a100", "--global-batch", "16", "--tp", "1", "--cache", str(cache)]
    first = run_main("phazec", *args, "--devices", "8", "-o", str(tmp_path / "a.mlir"))
    assert first.returncode == 0, first.stderr[-2000:]
    files = sorted((cache / "sweep-settings").glob("*.json"))
    assert len(files) == 4  # micro-batches 1, 2, 4, 8
    for f in files:
        entry = json.loads(f.read_text())
        entry["payload"]["errors"] = [[3, False, "planted"]]  # its content hash left as it was
        f.write_text(json.dumps(entry))
    again = run_main("phazec", *args, "--devices", "4", "-o", str(tmp_path / "b.mlir"))
    assert again.returncode == 0, again.stderr[-2000:]
    said = [line for line in again.stderr.splitlines() if line.startswith("phazec: warning: cache entry")]
    assert sorted(said) == sorted(
        f"phazec: warning: cache entry {f} does not match its content hash: ignored, computed again" for f in files
    )
    for f in files:  # kept anew: the planted error gone, the hash holds (read without a warning)
        assert "planted" not in f.read_text()
        # read as a third question on the model reads it (its settings in its payload), without
        # a third phazec: the hashes hold and the payload is the micro-batch's settings
        entry = json.loads(f.read_text())
        payload = read_entry(f, FORMAT, VERSION, entry["input_hash"])
        b = entry["payload"]["settings"][0]["micro_batch"]
        settings, errors = _check_prepared(payload, b, (1,))
        assert [s.micro_batch for s in settings] == [b] and errors == []


def test_settings_are_prepared_with_few_young_collections(monkeypatch):
    """``prepare_points`` (the model file's import, the cut traces, the pipeline to ``sharded``)
    runs with the young generation collected every YOUNG_COLLECTION_ALLOCATIONS allocations,
    as a compilation: the architecture search's settings too, not only the ``--hw`` sweep's;
    Python's thresholds come back after it."""
    import gc

    import phaze.search.setting as st
    from phaze.pipeline import YOUNG_COLLECTION_ALLOCATIONS

    seen = []

    def prepared(*args):
        seen.append(gc.get_threshold()[0])
        return [], [], "model"

    monkeypatch.setattr(st, "_prepare_points", prepared)
    before = gc.get_threshold()
    assert before[0] != YOUNG_COLLECTION_ALLOCATIONS
    assert st.prepare_points(DEEP, 1, (1,), Options()) == ([], [], "model")
    assert seen == [YOUNG_COLLECTION_ALLOCATIONS] and gc.get_threshold() == before


def test_ir_is_built_with_few_middle_collections():
    """Under ``few_collections`` the middle generation is collected every
    MIDDLE_COLLECTION_YOUNG young collections, not Python's 10: a dozen young collections of
    objects that live on (as a pipeline's IR) set off no middle one; Python's thresholds come
    back after it."""
    import gc

    from phaze.pipeline import MIDDLE_COLLECTION_YOUNG, YOUNG_COLLECTION_ALLOCATIONS, few_collections

    collected: list[int] = []

    def counted(phase: str, info: dict) -> None:
        if phase == "start":
            collected.append(info["generation"])

    before = gc.get_threshold()
    gc.collect()  # every generation empty: the count starts from none
    gc.callbacks.append(counted)
    try:
        with few_collections():
            assert gc.get_threshold()[:2] == (YOUNG_COLLECTION_ALLOCATIONS, MIDDLE_COLLECTION_YOUNG)
            gc.set_threshold(100, *gc.get_threshold()[1:])  # young collections a hundred objects apart
            kept = [[] for _ in range(12 * 100)]  # tracked, alive to the end
    finally:
        gc.callbacks.remove(counted)
    assert len(kept) == 12 * 100
    assert collected.count(0) >= 11 and 1 not in collected and 2 not in collected
    assert gc.get_threshold() == before


def test_phazec_runs_main_with_few_collections_to_its_exit():
    """``phazec``'s process (``phaze.tools.phazec.run``) runs ``main`` with ``few_collections``'
    thresholds and ends with them: Python's, set back after a compilation, would collect the
    middle generation (everything the compilation left) just before ``os._exit`` drops it; its
    exit status is ``main``'s."""
    import subprocess
    import sys

    from conftest import ROOT

    from phaze.pipeline import MIDDLE_COLLECTION_YOUNG, YOUNG_COLLECTION_ALLOCATIONS

    script = (
        "import atexit, gc\n"
        "import phaze.tools.phazec as p\n"
        "p.main = lambda: print(gc.get_threshold()[:2]) or 3\n"
        "atexit.register(lambda: print(gc.get_threshold()[:2]))\n"
        "p.run()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=False)
    expected = str((YOUNG_COLLECTION_ALLOCATIONS, MIDDLE_COLLECTION_YOUNG))
    assert done.returncode == 3 and done.stdout.split("\n") == [expected, expected, ""]
