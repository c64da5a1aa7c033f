"""``phazec --hw``'s sweep priced from settings (phaze/search/sweep.py) against the sweep that
compiles every point through the IR pipeline (``driver.compile_model``): the same module, byte
for byte, and the same points (throughputs, notes), on an ideal chip and on the calibrated,
serial a100; when nothing fits; under a power cap."""

from __future__ import annotations

import functools
import warnings
from dataclasses import replace

import pytest
from conftest import MODELS

from passes.algorithms.option_values import AUTO
from passes.cache_file import Store
from phaze import driver
from phaze.options import Options
from phaze.search import settings_beside, sweep
from phaze_ir.errors import PhazeError, PhazeWarning
from phaze_ir.ir import print_module

DEEP = str(MODELS / "tiny_gpt2_deep.py")


def _both(opts: Options, model: str = DEEP, stages: str | None = None):
    """The settings' sweep and the pipeline's of ``opts``: each its module text and points, or
    its error.  ``stages``: where the settings' sweep keeps and finds each micro-batch's
    settings (a cache folder: another question on the same model reads them)."""
    out = []
    for compile_ in (functools.partial(sweep.compile_plan, stages=Store.of(stages)), driver.compile_model):
        try:
            with warnings.catch_warnings():
                # the settings' best point must be the compiled one's: no fallback to the pipelines
                warnings.simplefilter("error", PhazeWarning)
                module, cands = compile_(model, opts, lambda msg: None)
        except PhazeError as e:
            out.append(str(e))
            continue
        points = [(c.micro_batch, c.tp, c.sequence_parallel, c.throughput, c.note, c.context_parallel) for c in cands]
        out.append((print_module(module), points))
    return out


@functools.cache
def _both_once(opts: Options):
    """``_both`` of ``opts`` on the deep GPT-2, kept per question (the options are frozen; none
    with a schedule cache of its own, which equality leaves out): a test that needs a sweep
    another test compares reads it (one sweep fewer)."""
    assert opts.schedule_cache is None
    return _both(opts)


#: The sweep at micro-batch 1 only (``_opts`` sweeps micro-batches 1 and 2).
MB1 = {"micro_batches": (1,)}


def _opts(**kw) -> Options:
    return Options(**{"micro_batches": (1, 2), "tp_widths": (1, 2), "sequence_parallel": "auto", **kw})


@pytest.mark.parametrize(
    "kw",
    [
        {"hw": "tpuv4", "devices": 8, "global_batch": 64},  # ideal chip: SCIP schedules through the cache
        {"hw": "a100", "devices": 8, "global_batch": 8},  # calibrated, serial: ops priced one by one
        # A fixed placement: at TP 1 it cannot divide the batch (8 over 3 replicas), so nothing
        # fits and the module says why; at TP 2 it does not apply (the placement's TP is 1).  At
        # micro-batch 1 only: micro-batch 2's points say the same (8 over 2·3, the placement's TP).
        {"hw": "a100", "devices": 3, "global_batch": 8, "placement": "expert:1,3,1"} | MB1,
        # Pipelined at TP 2, the boundary values split over the TP group (DeepSpeed's engine):
        # the settings must price the transfers as phaze-place-devices does (SP: its own shard).
        {"hw": "a100", "devices": 8, "global_batch": 8, "placement": "expert:2,2,2", "pipeline_transfer": "split"},
        # The placement pass's other options, each priced by the settings as by the pass: at
        # micro-batch 1 only (the points above compare micro-batches 1 and 2 under the others).
        {"hw": "a100", "devices": 8, "global_batch": 16, "recompute": "selective", "zero": "auto"} | MB1,
        # pipelined as given (PP 2), the schedule auto: interleaved, 319.6 against 1F1B's 273.4 samples/s
        {"hw": "a100", "devices": 8, "global_batch": 16, "placement": "expert:2,4,1", "pipeline_schedule": "auto"}
        | MB1,
        {"hw": "h100", "devices": 16, "global_batch": 32, "dp_overlap": True} | MB1,  # two nodes, NVLS
        # FP8 linears: each layer's weight casts a group of their own, once a step below ZeRO-3
        # and in every forward under it (the ZeRO stage auto: both), as phaze-place-devices prices them
        {"hw": "h100", "devices": 8, "global_batch": 16, "dtype": "fp8", "zero": "auto"} | MB1,
        # Two nodes at PP 2 x DP 8: the rank order decides whether the DP groups or the pipeline
        # cross the nodes; tp-dp-pp is not the one auto picks, and the settings price it as given.
        {"hw": "h100", "devices": 16, "global_batch": 32, "placement": "expert:2,8,1", "rank_order": "tp-dp-pp"} | MB1,
    ],
)
def test_the_settings_sweep_equals_the_pipelines(kw):
    fast, slow = _both_once(_opts(**kw))
    assert fast[0] == slow[0]  # the module
    assert fast[1] == slow[1]  # every point: throughput and note
    assert any(p[3] > 0 for p in fast[1]) == (kw.get("placement") != "expert:1,3,1")  # (nothing fits there)


def test_split_pipeline_transfers_are_priced_in_the_settings_sweep():
    """``--pipeline-transfer split`` changes the pipelined plan's throughput without sequence
    parallelism (one TP rank's 1/t crosses, then an all-gather) and not with it; the settings'
    points are the pipelines' (the parametrized test above compares them, and its split sweep is
    read here from ``_both_once``'s memo: one sweep fewer)."""
    points = {}
    for transfer in ("whole", "split"):
        opts = _opts(hw="a100", devices=8, global_batch=8, placement="expert:2,2,2", pipeline_transfer=transfer)
        if transfer == "split":
            cands = _both_once(opts)[0][1]
        else:
            with warnings.catch_warnings():
                warnings.simplefilter("error", PhazeWarning)  # the settings priced it as compiled
                _, candidates = sweep.compile_plan(DEEP, opts, lambda msg: None)
            cands = [(c.micro_batch, c.tp, c.sequence_parallel, c.throughput) for c in candidates]
        points[transfer] = {(b, sp): throughput for b, t, sp, throughput, *_ in cands if t == 2}
    for (b, sp), whole in points["whole"].items():
        assert whole > 0
        assert (points["split"][b, sp] == whole) == sp, (b, sp)


def test_the_settings_sweep_under_a_power_cap(tmp_path):
    """A cap that no point meets gives the same error; one between the points' powers the same
    plan (the a100's tiny-model powers are about 113.6-113.7 W).  At micro-batch 2 only: its
    points straddle the cap (TP 1 over it, TP 2 under), those of micro-batch 1 all meet it, and
    the sweeps over micro-batches 1 and 2 are compared under the other options above."""
    stages = str(tmp_path / "cache")  # the second question's settings read from the first's
    mb2 = {"micro_batches": (2,)}
    low, high = _opts(hw="a100", devices=8, global_batch=64, power_cap_w=60.0, **mb2), None
    fast, slow = _both(low, stages=stages)
    assert isinstance(fast, str) and fast == slow and "no plan meets --power-cap 60 W" in fast
    high = _opts(hw="a100", devices=8, global_batch=64, power_cap_w=113.65, **mb2)
    fast, slow = _both(high, stages=stages)
    assert fast == slow and any("over the cap" in p[4] for p in fast[1]) and any(p[3] > 0 for p in fast[1])


@pytest.mark.parametrize(
    "kw", [{"expert_parallel": "2", "zero": "1"}, {"expert_parallel": "auto", "capacity_factor": 1.25}]
)
def test_the_settings_price_an_moe_model_as_the_pipeline(kw, tmp_path):
    """The settings carry each MoE layer's experts, their bytes and the tokens it dispatches
    (the PricedStep's fields ``phaze-place-devices`` reads), so expert parallelism and a
    capacity factor (the trace padded at import, as the pipeline imports it) are priced from
    them: the same module and points as the pipeline's sweep, no fallback."""
    from test_moe_conv import MIXTRAL

    model = tmp_path / "tiny_mixtral.py"
    model.write_text(MIXTRAL.format(seq=32))
    # TP 1 (at TP 2 the router's linears stay replicated: a warning, which _both makes an error)
    opts = Options(micro_batches=(1, 2), tp_widths=(1,), hw="a100", devices=4, global_batch=8, **kw)
    assert sweep.why_compiled_point_by_point(opts) == ""  # priced from the settings
    fast, slow = _both(opts, str(model))
    assert not isinstance(fast, str) and fast == slow
    assert any(p[3] > 0 for p in fast[1])
    if kw["expert_parallel"] == "2":
        assert "expert_parallel = 2" in fast[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        {"hw": "h100", "kernels": "eager", "devices": 8, "global_batch": 16},  # calibrated: flash attention rings
        # ideal chip: SCIP schedules, one point t·c > N (micro-batch 1 only: its schedules are
        # the slow part, and micro-batch 2 is compared on the h100 above)
        {"hw": "tpuv4", "devices": 4, "global_batch": 8, "micro_batches": (1,)},
    ],
)
def test_the_settings_price_a_fixed_context_parallel_degree_as_the_pipeline(kw):
    """``--context-parallel 2``: each point's setting traced at S/2 tokens, its fused attention
    kernels rings of 2 steps on the chip's network (``Setting.ring_factors``, the factors
    ``phaze-context-parallel`` scales them by), its PricedStep of CP 2: the same module and
    points as the pipeline's sweep, no fallback."""
    from passes.algorithms.schedule import ScheduleCache

    model = str(MODELS / "tiny_llama_sdpa.py")
    # One schedule cache for both sweeps: a problem the settings build as the pipeline does gets
    # the same schedule (SCIP stops at a gap, so a loaded machine may find another within it).
    cache = ScheduleCache(None)
    opts = replace(_opts(context_parallel="2", **kw), schedule_cache=cache)
    assert sweep.why_compiled_point_by_point(opts) == ""
    fast, slow = _both(opts, model)
    assert not isinstance(fast, str) and fast == slow
    assert "cp = 2" in fast[0] and any(p[3] > 0 for p in fast[1])


@pytest.mark.slow
@pytest.mark.parametrize(
    "kw",
    [
        {"hw": "h100", "kernels": "eager"},
        # the paper's ops: the pipeline's sweep traces every degree of auto, 1 too, with fused
        # attention (driver.with_runtime_attention), and so must the settings at CP 1 (at every
        # micro-batch alike: one here, the pipeline's compiles of 8k-token points halved)
        {"hw": "a100", "kernels": "ops", "micro_batches": (1,)},
    ],
)
def test_the_settings_price_context_parallel_auto_as_compiling_each_degree(kw, tmp_path):
    """``--context-parallel auto`` (8,192 tokens: degrees 1 and 2, AUTO_MIN_LOCAL_TOKENS a
    device): each degree's settings priced on the one evaluator, in the pipeline's order
    (micro-batch, degree, TP, SP): the same module and points, degree by degree, as the
    pipeline's sweep compiling every point of every degree, and no fallback."""
    from passes.algorithms.schedule import ScheduleCache

    model = tmp_path / "tiny_llama_sdpa_8k.py"  # configured for 8,192 positions
    source = (MODELS / "tiny_llama_sdpa.py").read_text()
    model.write_text(source.replace("max_position_embeddings=64", "max_position_embeddings=8192"))
    opts = Options(
        **{"micro_batches": (1, 2), **kw},
        tp_widths=(1, 2),
        devices=4,
        global_batch=8,
        seq_len=8192,
        context_parallel="auto",
        schedule_cache=ScheduleCache(None),  # one for both sweeps (see above)
    )
    assert sweep.why_compiled_point_by_point(opts) == ""
    fast, slow = _both(opts, str(model))
    assert not isinstance(fast, str) and fast == slow
    assert {p[5] for p in fast[1]} == {1, 2}  # both degrees priced
    assert all(p[3] > 0 for p in fast[1] if p[1] * p[5] <= 4)


@pytest.mark.parametrize(
    "kw",
    [
        {"tp_overlap": "on", "sequence_parallel": "on"},
        {"tp_overlap": "auto", "sequence_parallel": "auto", "context_parallel": "2"},  # rings, then overlap
        # torch's micro-pipelined TP keeps every SM for its GEMMs (no SM margin), as the pipeline
        {"tp_overlap": "on", "sequence_parallel": "on", "kernels": "inductor"},
    ],
)
def test_the_settings_price_tp_overlap_as_the_pipeline(kw):
    """``--tp-overlap``: each SP point's setting records its TP all-gathers and reduce-scatters
    with their methods and GEMMs (``passes.overlap_tensor_parallel.overlapped``), and prices
    what each adds to its GEMMs on the chip's SMs as ``phaze-overlap-tensor-parallel`` does:
    the same module and points as the pipeline's sweep, no fallback."""
    from passes.algorithms.schedule import ScheduleCache
    from phaze.pipeline import load_accelerator
    from phaze.search.setting import prepare_points

    model = str(MODELS / "tiny_llama_sdpa.py")
    kw = {"kernels": "eager", **kw}
    opts = Options(micro_batches=(1, 2), tp_widths=(1, 2), hw="h100", devices=8, global_batch=16, **kw)
    opts = replace(opts, schedule_cache=ScheduleCache(None))  # one for both sweeps, as above
    assert sweep.why_compiled_point_by_point(opts) == ""
    if "context_parallel" not in kw:  # the settings hold the overlap (the sweep passes the chip)
        (setting,), _, _ = prepare_points(model, 1, (2,), opts, load_accelerator("h100"))
        assert setting.tp_overlap and sum(len(g.overlap) for g in setting.groups) > 0
        assert setting.tp_overlap_sm_margin == (kw["kernels"] != "inductor")
        assert setting.from_json(setting.to_json()).groups == setting.groups
        if kw["kernels"] == "inductor":  # a setting stored before torch's own pricing is not read back
            assert setting.micro_pipelined_rows
            stale = {k: v for k, v in setting.to_json().items() if k != "micro_pipelined_rows"}
            with pytest.raises(ValueError, match="do not fit torch's TP overlap"):
                setting.from_json(stale)
    fast, slow = _both(opts, model)
    assert not isinstance(fast, str) and fast == slow
    assert any(p[3] > 0 for p in fast[1])


@pytest.mark.slow
def test_the_settings_price_tp_overlap_under_selective_recompute_as_the_pipeline():
    """``--tp-overlap auto`` with selective recompute re-running TP collectives (torchtitan's
    per-op policy re-runs the all-gathers before the GEMMs): a re-run collective is scheduled
    with what it adds beside its GEMMs in its layer's forward, the latency
    ``phaze-insert-recompute`` reads off the op (``Group.borrowed``); the settings price it, no
    fallback, the same module and points as the pipeline's sweep on a model cut to 3 and 4 blocks
    (at micro-batch 1: micro-batch 2 re-runs the same collectives, and micro-batches 1 and 2 are
    compared under the other options above)."""
    from passes.algorithms.schedule import ScheduleCache
    from phaze.pipeline import load_accelerator
    from phaze.search.setting import Setting, prepare_points

    opts = Options(
        micro_batches=(1,),
        tp_widths=(1, 2),
        hw="a100",
        devices=8,
        global_batch=16,
        sequence_parallel="auto",
        tp_overlap="auto",
        recompute="selective",
        selective_recompute="op",
    )
    opts = replace(opts, schedule_cache=ScheduleCache(None))
    sp = replace(opts, sequence_parallel="on")
    (setting,), errors, _ = prepare_points(DEEP, 1, (2,), sp, load_accelerator("a100"))
    assert errors == [] and setting.blocks is not None  # priced from settings, deepened from the cut model
    borrowed = [b for g in setting.groups for b in g.borrowed]
    assert borrowed and all(setting.groups[home].overlap for _, home, _ in borrowed)
    assert Setting.from_json(setting.to_json()).groups == setting.groups
    fast, slow = _both(opts)
    assert not isinstance(fast, str) and fast == slow
    assert any(p[3] > 0 and p[2] for p in fast[1])  # an SP point (overlapped) fits


def test_what_the_settings_do_not_cover_is_compiled_point_by_point(monkeypatch):
    """A stage before the plan, one point: the pipeline's sweep itself."""
    assert sweep.why_compiled_point_by_point(Options(emit="recompute")) == "--emit recompute"
    assert sweep.why_compiled_point_by_point(Options(context_parallel="auto")) == ""
    assert sweep.why_compiled_point_by_point(Options(context_parallel="2")) == ""
    assert sweep.why_compiled_point_by_point(Options(tp_overlap="on")) == ""
    assert sweep.why_compiled_point_by_point(Options(expert_parallel="auto", capacity_factor=1.5)) == ""
    assert sweep.why_compiled_point_by_point(Options()) == ""
    calls = []
    monkeypatch.setattr(driver, "compile_model", lambda *a, **k: calls.append(a) or ("module", []))
    one = Options(hw="tpuv4", micro_batches=(1,), tp_widths=(2,), devices=8, global_batch=8)
    assert sweep.compile_plan(DEEP, one, lambda msg: None) == ("module", [])
    assert len(calls) == 1


def test_priced_step_is_the_layers_numbers_with_their_times():
    """``Setting.priced_step``: each layer's numbers with its groups' makespans as its times
    (the optimizer step's too: ``opt_s``), one object (and so one dict of the DP's problem)
    shared by the layers that are the same (the repeated blocks)."""
    from dataclasses import replace

    import numpy as np

    from passes.algorithms import placement as pl
    from passes.algorithms.placement_options import PlacementOptions
    from phaze.search.setting import prepare_points

    (setting, *_), _, _ = prepare_points(DEEP, 1, (1,), Options())
    makespan = np.arange(1.0, len(setting.groups) + 1.0) / 1e3
    step = setting.priced_step(makespan)
    got = list(step.layers)

    def want(lr):
        fwd, bwd, opt, sel = (float(makespan[g]) if g >= 0 else 0.0 for g in (lr.fwd, lr.bwd, lr.opt, lr.selective))
        return replace(lr.numbers, fwd_s=fwd, bwd_s=bwd, recompute_s=(0.0, sel, fwd), opt_s=opt)

    assert got == [want(lr) for lr in setting.layers]
    assert (step.micro_batch, step.tp, step.cp, step.blocks) == (1, 1, 1, setting.blocks)
    assert all(n.opt_s > 0 for n in got)  # every layer has parameters to update
    assert len({id(n) for n in got}) < len(got)  # the blocks share one
    assert setting.priced_step(makespan * 2).layers[1].fwd_s == 2 * got[1].fwd_s  # made anew per makespans
    dicts = pl.problem(
        step, PlacementOptions(devices=8, global_batch=8), hbm_bytes=1 << 30, levels=[], memory_bound_Bps=1e12
    )["layers"]
    assert dicts == [n.as_dict() for n in got]
    assert len({id(d) for d in dicts}) == len({id(n) for n in got})  # one dict per distinct layer


def test_beyond_devices_defers_only_widths_prepared_before():
    """At CP c > 1 a TP width t with t·c over the devices is not prepared (no replica fits; the
    sweep says so unpriced) once an earlier pair prepared it; never at c = 1, never every width."""
    assert sweep.beyond_devices((1, 2, 4), 2, 4, {1, 2, 4}) == (4,)
    assert sweep.beyond_devices((1, 2, 4), 2, 4, {1, 2}) == ()  # 4 never prepared: learnt now
    assert sweep.beyond_devices((1, 2, 4), 1, 2, {1, 2, 4}) == ()  # c = 1: as before
    assert sweep.beyond_devices((2, 4), 4, 4, {2, 4}) == ()  # all would wait: (b, c) traced


def _sweep_8k(tmp_path, **kw) -> Options:
    from passes.algorithms.schedule import ScheduleCache

    model = tmp_path / "tiny_llama_sdpa_8k.py"  # configured for 8,192 positions: degrees 1 and 2
    source = (MODELS / "tiny_llama_sdpa.py").read_text()
    model.write_text(source.replace("max_position_embeddings=64", "max_position_embeddings=8192"))
    opts = Options(
        micro_batches=(1, 2),
        tp_widths=(1, 2),
        devices=2,
        global_batch=4,
        seq_len=8192,
        context_parallel="auto",
        hw="h100",
        kernels="eager",
        schedule_cache=ScheduleCache(None),
        **kw,
    )
    return opts


@pytest.mark.slow
def test_context_parallel_auto_waits_on_the_points_beyond_the_devices(tmp_path, monkeypatch):
    """On 2 devices CP 2 at TP 2 needs 4: those settings are not prepared (the sweep prepares
    TP 1 and 2 at CP 1, TP 1 at CP 2), and the module and points are the pipeline's sweep's.
    When no point fits (all but no HBM usable), the nearest plan on more devices is priced from
    every setting, in the sweep's order, as without the wait: the same message."""
    opts = _sweep_8k(tmp_path)
    model = str(tmp_path / "tiny_llama_sdpa_8k.py")
    # every setting prepared in this process, where the patch below sees it: a sweep that is the
    # first to trace in its process forks children for its later jobs (settings_beside), which
    # made the calls seen here depend on the tests run before it in the worker
    monkeypatch.setattr(settings_beside, "can_fork", lambda: False)
    asked = []
    real = sweep.prepared
    monkeypatch.setattr(
        sweep,
        "prepared",
        lambda m, b, tps, o, *a, **k: asked.append((b, tps, o.context_parallel)) or real(m, b, tps, o, *a, **k),
    )
    fast, slow = _both(opts, model)
    assert not isinstance(fast, str) and fast == slow
    assert [(b, tps, c) for b, tps, c in asked] == [
        (1, (1, 2), AUTO),
        (1, (1,), 2),
        (2, (1, 2), AUTO),
        (2, (1,), 2),
    ]
    assert any(p[3] > 0 for p in fast[1]) and any("t·c = 2·2 exceeds N = 2" in p[4] for p in fast[1])

    unfit = replace(opts, memory_headroom=0.9999, unfit_plan=False)
    tasks = []
    real_nearest = sweep.nearest_fit
    monkeypatch.setattr(
        sweep,
        "nearest_fit",
        lambda o, acc, task, jobs, log: (
            tasks.append([(s.micro_batch, s.tp, s.sequence_parallel, s.cp) for s in task.settings])
            or real_nearest(o, acc, task, jobs, log)
        ),
    )
    said = []
    for wait in (True, False):
        if not wait:
            monkeypatch.setattr(sweep, "beyond_devices", lambda *a: ())
        with pytest.raises(PhazeError) as e:
            sweep.compile_plan(model, unfit, lambda msg: None)
        said.append(str(e.value))
    assert said[0] == said[1] and "no placement fits" in said[0]
    assert tasks[0] == tasks[1] and (1, 2, False, 2) in tasks[0]
