"""A compiled point's plan text, placed again without compiling (``plan-template`` entries).

``phazec MODEL --hw CHIP`` ends in a plan module: the training step of one point (micro-batch,
TP width, sequence parallelism) through the whole pipeline, then ``phaze-place-devices`` (and
``phaze-estimate-power``) for the devices, batch and placement options.  Those last passes read
only the module's attributes (the layers' numbers, the chip) and write three module attributes
(``phaze.plan``, ``phaze.stages``, ``phaze.power``) and each op's ``phaze.stage``: nothing else of
the printed module depends on the placement.  So once a point is compiled, another question on
it (more devices, another batch, a fixed placement, ZeRO, a rank order...) needs neither the
model, nor torch, nor the pipeline: a :class:`PlanTemplate` keeps

- ``skeleton``: a module with the compiled module's attributes and its accelerator and an empty
  step function, on which the placement passes run as on the whole module (they overwrite what
  they write, in place: the attributes keep their order); kept as MLIR text but for its record
  attributes (the layers' numbers, most of it), kept as JSON fields and built directly, which
  takes a fraction of parsing them (GPT-3 175B: 133 KB of records, 0.3 s to parse);
- ``body``: the printed plan after its header line, each op's ``phaze.stage = K : i64`` written
  as a marker of the op's ``phaze.layer``.

The answer's text is the placed skeleton's header (:func:`phaze_ir.ir.module_header`) and the
body with each marker made the stage that holds its layer (:func:`place_devices.stage_of_layers`,
as ``phaze-place-devices`` writes it), or dropped when no stage holds it (a plan that does not
fit writes none).  A template is kept only when it gives back, byte for byte, the text it was
made from (placed again under the same options), and only from a plan that fits (its ops carry
their stages).  Printed in the custom form only (``--print-op-generic`` prints the module's
attributes after its body: compiled as before).

Its key: the environment digest (every stage entry's), the model's digest (its file and the
helpers it imports), the chip's data, the point and every option the pipeline before the
placement reads (sequence length, dtype, optimizer, ``--strict``, the capacity factor, the
solver's limits): never the placement's own options.  GPT-3 175B's plan is 11 MB: a template
costs as much space as the answer it came from; ``--cache-limit`` trims both.  An answer placed
from a template is not kept as an answer of its own (``hw_answer``): it is one template away.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xdsl.dialects import func
from xdsl.dialects.builtin import FunctionType, ModuleOp

from passes.cache_file import BadEntry, Store, fields, need
from phaze.options import Options
from phaze.pipeline import compile_from
from phaze.plan.plan_output import plan_record

if TYPE_CHECKING:
    from phaze_ir.attributes import RecordAttr

#: The store's kind of entry this module keeps.
KIND = "plan-template"

#: An op's stage as printed, and as the body keeps it (a NUL never appears in printed MLIR:
#: strings escape it), the layer's index between two NULs.
_STAGE = re.compile(r", phaze\.stage = \d+ : i64")
_LAYER = re.compile(r"phaze\.layer = (\d+) : i64")
_MARKED = re.compile(", phaze\\.stage = \x00(\\d+)\x00 : i64")


@dataclass
class PlanTemplate:
    """What a compiled, placed point's plan is made of again (see the module docstring)."""

    #: The skeleton module as MLIR text, without its record attributes (below).
    skeleton: str
    body: str
    #: The warnings the compilation said, as the tools print them (said again when the template is used).
    warnings: list[str] = field(default_factory=list)
    #: The skeleton's attributes that are records or arrays of records (the layers' numbers,
    #: most of its text), as ``[name, record kind, fields or a list of fields]`` in their
    #: order: built with ``make`` in a fraction of the time parsing them takes.
    records: list[list[Any]] = field(default_factory=list)
    #: The skeleton's attribute names in order (printed so).
    order: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Point:
    """A point of the sweep: micro-batch, TP width, sequence parallelism, context-parallel
    degree."""

    micro_batch: int
    tp: int
    sequence_parallel: bool
    context_parallel: int = 1


def key(stages: Store, model_digest: str, chip_digest: str, opts: Options, point: Point) -> str:
    """The key of ``point``'s template (see the module docstring)."""
    before_placement = (
        opts.seq_len,
        opts.traced_dtype,
        opts.kernels,
        opts.sdpa_order,
        opts.optimizer,
        opts.strict,
        opts.capacity_factor,
        opts.selective_recompute,
        opts.tp_overlap,
        opts.schedule_time_limit,
        opts.schedule_gap,
        opts.schedule_nodes,
        opts.schedule_max_binaries,
    )
    where = (point.micro_batch, point.tp, point.sequence_parallel, point.context_parallel)
    return stages.key(KIND, model_digest, chip_digest, where, before_placement)


def point_of(module: ModuleOp) -> Point:
    """The point a compiled module is of."""
    from phaze_ir import keys

    return Point(
        keys.int_of(module, keys.MICRO_BATCH_SIZE, 1),
        keys.int_of(module, keys.TP_WIDTH, 1),
        keys.SEQUENCE_PARALLEL in module.attributes,
        keys.int_of(module, keys.CONTEXT_PARALLEL, 1),
    )


def make(module: ModuleOp, text: str, opts: Options, said: list[str]) -> PlanTemplate | None:
    """The template of a placed plan ``module`` printed as ``text`` (custom form) under ``opts``;
    None when its plan does not fit, it has expert GEMMs (their time at an EP degree is read from
    its ops) or the template does not give ``text`` back."""
    from passes.how_ops_run import expert_gemm_ops
    from phaze_ir.errors import PhazeError
    from phaze_ir.ir import module_header, print_module

    if plan_record(module).get("feasible") != "yes":
        return None
    if expert_gemm_ops(module):
        # an MoE layer's expert GEMMs are priced at each EP degree from the ops
        # (phaze-place-devices), which a skeleton has not: placed again, another EP degree
        # would price them at the traced shape
        return None
    header = module_header(module) + " {\n"
    if not text.startswith(header):
        return None
    lines = text[len(header) :].split("\n")
    for i, line in enumerate(lines):
        if ", phaze.stage = " in line:
            layer = _LAYER.search(line)
            marked, n = _STAGE.subn(f", phaze.stage = \x00{layer.group(1) if layer else ''}\x00 : i64", line)
            if layer is None or n != 1:
                return None
            lines[i] = marked
    record_fields = {name: _record_fields(attr) for name, attr in module.attributes.items()}
    records = [[name, *f] for name, f in record_fields.items() if f]
    plain = {name: attr for name, attr in module.attributes.items() if not record_fields[name]}
    skeleton = print_module(skeleton_of(module, plain))
    template = PlanTemplate(skeleton, "\n".join(lines), said, records, list(module.attributes))
    try:  # as a later question reads it back
        placed = place(check(json.loads(json.dumps(vars(template))))[1], opts, point_of(module))
    except (PhazeError, BadEntry):
        return None
    return template if text_of(template, placed) == text else None


def skeleton_of(module: ModuleOp, attributes: dict[str, Any] | None = None) -> ModuleOp:
    """A module with ``module``'s accelerator, an empty step function and its attributes (or
    ``attributes``): what the placement passes read, placed again as the whole module would be
    (:func:`place`)."""
    from passes.graph_view import step_function
    from phaze_ir.dialect import AcceleratorOp

    fn = step_function(module)
    shell = func.FuncOp(fn.sym_name.data, FunctionType.from_lists([], []))
    shell.body.block.add_op(func.ReturnOp())
    ops = [op.clone() for op in module.ops if isinstance(op, AcceleratorOp)] + [shell]
    return ModuleOp(ops, attributes=dict(module.attributes) if attributes is None else attributes)


def _record_fields(attr: Any) -> list[Any]:
    """``[kind, fields]`` of a record attribute, ``[kind, [fields, ...]]`` of a non-empty array of
    records of one kind, ``[]`` for any other attribute."""
    from xdsl.dialects.builtin import ArrayAttr

    from phaze_ir.attributes import RecordAttr

    if isinstance(attr, RecordAttr):
        return [attr.name, attr.as_dict()]
    items = attr.data if isinstance(attr, ArrayAttr) else ()
    if items and all(isinstance(a, RecordAttr) and a.name == items[0].name for a in items):
        return [items[0].name, [a.as_dict() for a in items]]
    return []


@functools.cache
def _record_kinds() -> dict[str, type[RecordAttr]]:
    """The record attribute classes by name."""
    from phaze_ir.attributes import RecordAttr

    kinds: dict[str, type[RecordAttr]] = {}
    todo = list(RecordAttr.__subclasses__())
    while todo:
        kind = todo.pop()
        kinds[kind.name] = kind
        todo += kind.__subclasses__()
    return kinds


def place(skeleton: ModuleOp, opts: Options, point: Point) -> ModuleOp:
    """The template's parsed skeleton placed under ``opts`` (``phaze-place-devices`` and, on a
    chip with an ``[energy]`` table, ``phaze-estimate-power``), in place: a module whose
    attributes are the plan's, as compiling the point would give them."""
    return compile_from(skeleton, "recompute", "plan", point.tp, opts, point.sequence_parallel)


def text_of(template: PlanTemplate, placed: ModuleOp) -> str:
    """The printed plan of the placed skeleton ``placed``: what ``print_module`` gives of the
    whole module placed so."""
    from passes.place_devices import stage_of_layers
    from phaze_ir import keys
    from phaze_ir.attributes import StageInfoAttr
    from phaze_ir.ir import module_header

    stage_of = stage_of_layers([s.as_dict() for s in keys.records_of(placed, keys.STAGES, StageInfoAttr)])

    def stage(m: re.Match) -> str:
        k = stage_of.get(int(m.group(1)))  # None: no stage holds the layer (a plan that does not fit)
        return "" if k is None else f", phaze.stage = {k} : i64"

    return module_header(placed) + " {\n" + _MARKED.sub(stage, template.body)


def check(payload: Any) -> tuple[PlanTemplate, ModuleOp]:
    """A ``plan-template`` entry's payload as a :class:`PlanTemplate` and its skeleton parsed
    (:class:`BadEntry` when it does not hold them)."""
    from xdsl.dialects.builtin import ArrayAttr

    from phaze_ir.errors import PhazeError
    from phaze_ir.ir import parse_module

    d = fields(payload, ("skeleton", "body", "warnings", "records", "order"), "a plan template")
    need(isinstance(d["skeleton"], str), "a skeleton module")
    need(isinstance(d["body"], str) and d["body"] != "", "a plan's body")
    need(isinstance(d["warnings"], list) and all(isinstance(w, str) for w in d["warnings"]), "warnings")
    need(isinstance(d["order"], list) and all(isinstance(n, str) for n in d["order"]), "the attributes' order")
    records = d["records"]
    need(isinstance(records, list) and all(isinstance(r, list) and len(r) == 3 for r in records), "records")
    try:
        skeleton = parse_module(d["skeleton"], "<plan template>")
    except PhazeError as e:
        raise BadEntry(f"does not hold a skeleton module ({str(e).splitlines()[0]})") from None
    attributes = dict(skeleton.attributes)
    for name, kind, values in records:
        cls = _record_kinds().get(kind) if isinstance(kind, str) else None
        need(isinstance(name, str) and cls is not None, f"a record kind ({kind!r})")
        assert cls is not None
        try:
            if isinstance(values, list):
                attributes[name] = ArrayAttr([cls.make(**f) for f in values])
            else:
                attributes[name] = cls.make(**values)
        except (TypeError, ValueError) as e:
            raise BadEntry(f"does not hold {kind} records ({e})") from None
    need(sorted(attributes) == sorted(d["order"]), "the skeleton's attributes")
    skeleton.attributes = {name: attributes[name] for name in d["order"]}
    return PlanTemplate(d["skeleton"], d["body"], d["warnings"], records, d["order"]), skeleton


class Templates:
    """The plan templates of one model on one chip under one question's options, in a stage
    cache: :meth:`placed` a point from its template, :meth:`text` the printed plan of a module
    (from its template when it is a placed skeleton), :meth:`keep` a compiled plan's template."""

    def __init__(self, stages: Store, model_digest: str, chip_digest: str, opts: Options):
        self.stages, self.model_digest, self.chip_digest, self.opts = stages, model_digest, chip_digest, opts
        self._used: dict[int, tuple[ModuleOp, PlanTemplate]] = {}

    def under(self, opts: Options) -> Templates:
        """These templates under ``opts`` instead (a narrowing of the question's: the plan an
        ``--export`` launches, ``phaze.search.sweep.compile_launchable``), with what was placed
        from either: :meth:`text` and :meth:`keep` know a module either placed."""
        other = Templates(self.stages, self.model_digest, self.chip_digest, opts)
        other._used = self._used
        return other

    def _key(self, point: Point) -> str:
        return key(self.stages, self.model_digest, self.chip_digest, self.opts, point)

    def placed(self, point: Point) -> ModuleOp | None:
        """``point`` placed under the options from its template (its compilation's warnings said
        again); None when the cache has none."""
        import warnings

        from phaze_ir.errors import PhazeWarning

        hit = self.stages.load(KIND, self._key(point), check)
        if hit is None:
            return None
        template, module = hit
        place(module, self.opts, point)
        for message in template.warnings:
            warnings.warn(message, PhazeWarning, stacklevel=2)
        self._used[id(module)] = (module, template)
        return module

    @property
    def placed_any(self) -> bool:
        """Whether :meth:`placed` gave a module (the answer is then one template away: not worth
        keeping as an answer of its own, the size of its plan)."""
        return bool(self._used)

    def text(self, module: ModuleOp) -> str:
        """``print_module(module)`` (custom form), from the template when ``module`` is a
        skeleton :meth:`placed` gave."""
        from phaze_ir.ir import print_module

        used = self._used.get(id(module))
        if used is not None and used[0] is module:
            return text_of(used[1], module)
        return print_module(module)

    def keep(self, module: ModuleOp, text: str, said: list[str]) -> None:
        """Keep the template of the compiled plan ``module`` printed (custom form) as ``text``,
        ``said`` the warnings of its compilation (nothing when it is a placed skeleton, or
        no template gives ``text`` back)."""
        if id(module) in self._used:
            return
        template = make(module, text, self.opts, list(said))
        if template is not None:
            self.stages.keep(KIND, self._key(point_of(module)), vars(template))

    def reject(self, module: ModuleOp, why: str) -> None:
        """Say that the template ``module`` was placed from does not hold its plan (``why``): the
        caller computes it again."""
        import warnings

        from phaze_ir.errors import PhazeWarning

        self._used.pop(id(module), None)
        file = self.stages.file(KIND, self._key(point_of(module)))
        message = f"cache entry {file} does not hold {why}: ignored, computed again"
        warnings.warn(message, PhazeWarning, stacklevel=2)
