"""Trace one training step of a model into an aten-level torch.fx graph, without weights.

How (docs/design.md §2): the model is built on ``meta``, then inside a
``FakeTensorMode`` it is given fake storage (``to_empty``) and its shared weights re-tied; then
``make_fx`` traces a function that runs the forward through ``torch.func.functional_call``, the
loss, and ``torch.autograd.grad`` with respect to every parameter.  That records the *real*
backward that autograd runs: input-gradient and weight-gradient GEMMs, and the forward tensors
the backward reads (what autograd saves).

Provenance is recorded while tracing:

- forward nodes get the module path from global module hooks (``nn_module_stack``);
- backward nodes get the sequence number of the autograd node that created them (the hooks
  AOTAutograd uses for the same purpose), which maps them back to their forward module;
- every node created after the forward carries ``meta["custom"]["phaze_phase"] = "bwd"``.
"""

from __future__ import annotations

import contextlib
import contextvars
import inspect
import time
import traceback
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from phaze_ir.errors import ModelTooLarge, PhazeError, PhazeWarning
from phaze_ir.frontend.float8_linear import Fp8Recipe, fp8_linears, fp8_linears_patched, register_fp8_scales
from phaze_ir.frontend.gpu_dispatch import as_on_cuda
from phaze_ir.frontend.loader import ModelSpec, exit_call, failure, hard_exit_refused

if TYPE_CHECKING:
    from phaze_ir.frontend.symbolic_trace import SymbolicSizes

DTYPES = ("float16", "bfloat16", "float32", "amp-bfloat16", "amp-float16", "fp8", "model")
#: Mixed precision as ``torch.autocast`` runs it: fp32 weights, each GEMM on 16-bit casts of its
#: operands, softmax, norms and the loss in fp32, fp32 gradients (the Hugging Face Trainer's
#: ``bf16=True``/``fp16=True``).  Traced under CPU autocast (the tensors are fake CPU tensors),
#: whose lower-precision list matches CUDA's for GEMMs; CUDA runs more ops in fp32 than CPU
#: autocast does (norms, softmax, sums, ``pow``, ``exp``): ``gpu_dispatch.as_on_cuda`` applies
#: CUDA's lists while tracing.
AMP_DTYPES = {"amp-bfloat16": "bfloat16", "amp-float16": "float16"}
#: FP8 training as Transformer Engine runs it (``float8_linear``): weights, activations and
#: gradients in this precision, the linears' GEMMs on FP8 casts of their operands.
FP8_DTYPES = {"fp8": "bfloat16"}


@dataclass
class TracedGraph:
    """A traced step and what the importer needs to know about its placeholders."""

    #: a torch.fx.GraphModule; a deepened step's is a ``deepen.StepGraph`` (its ``graph`` and
    #: its constants as attributes: what the importer reads)
    graph_module: Any
    model_name: str
    training: bool
    micro_batch_size: int
    seq_len: int | None
    #: placeholder kind per placeholder, in order: ("param" | "buffer" | "input", name)
    placeholders: list[tuple[str, str]]
    #: for each output after the loss: the parameter name whose gradient it is (None outputs dropped)
    grad_names: list[str]
    #: parameters that received no gradient (unused in the loss)
    no_grad_params: list[str] = field(default_factory=list)
    #: forward module path of each autograd sequence number
    seq_module: dict[int, str] = field(default_factory=dict)
    trace_seconds: float = 0.0
    #: (blocks traced, blocks the model has) of its repeated blocks when ``trace_model`` was
    #: asked for fewer (``max_blocks``) and cut the model's block list short; None otherwise
    blocks: tuple[int, int] | None = None
    #: the model's shape as a launcher builds it (:func:`phaze_ir.frontend.shape.model_shape`),
    #: read before any cut: the importer keeps it as ``phaze.model_shape`` for the exports
    shape: dict[str, Any] = field(default_factory=dict)
    #: module path of the model's list of repeated blocks (``uniform_blocks``), e.g.
    #: ``transformer.h``; "" when it has none or ``max_blocks`` was not asked
    block_path: str = ""
    #: blocks of the cut trace this step was deepened from (``deepen.trace_step``); None
    #: when it was traced as it is
    deepened_from: int | None = None


@contextlib.contextmanager
def _transformers_meta_patches() -> Iterator[None]:
    """transformers 5 checks for packed sequences with a data-dependent ``.item()`` while building
    the attention mask; on fake tensors that cannot run.  phaze traces unpacked batches, so the
    answer is known: there are none."""
    try:
        import transformers.masking_utils as mu
    except Exception:  # transformers absent or laid out differently: nothing to patch
        yield
        return
    original = getattr(mu, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    mu.find_packed_sequence_indices = lambda *a, **k: None
    try:
        yield
    finally:
        mu.find_packed_sequence_indices = original


@contextlib.contextmanager
def _quiet_fake_tensor_log() -> Iterator[None]:
    """torch logs a failing meta kernel with its whole traceback (18 lines) before raising; the
    exception itself becomes phaze's one-line error, so the log is only noise."""
    import logging

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


#: The initialisers of ``torch.nn.init`` (the names transformers' ``initialization.py`` guards too).
_INIT_FUNCTIONS = (
    "uniform_",
    "normal_",
    "constant_",
    "ones_",
    "zeros_",
    "eye_",
    "dirac_",
    "xavier_uniform_",
    "xavier_normal_",
    "kaiming_uniform_",
    "kaiming_normal_",
    "trunc_normal_",
    "orthogonal_",
    "sparse_",
)


@contextlib.contextmanager
def _meta_init_skipped() -> Iterator[None]:
    """While ``get_model()`` builds the model on the meta device, the weight initialisers return
    a meta tensor untouched: it has no values to set, yet torch runs each initialiser through
    its reference decompositions (``torch/_refs``), half the build time of a deep model (a
    2,000-block GPT-2: 24 of 48 s per build).  Only the initialisers are skipped, not
    ``init_weights`` (transformers ties the embeddings there), and a real tensor is initialised
    as before.  transformers (5.x, ``initialization.py``) calls torch's originals from its table
    ``TORCH_INIT_FUNCTIONS``, so the table's entries are wrapped too."""
    import sys

    import torch

    def skipping(original):
        def init(tensor, *args, **kwargs):
            if isinstance(tensor, torch.Tensor) and tensor.is_meta:
                return tensor
            return original(tensor, *args, **kwargs)

        return init

    tables: list[dict] = [vars(torch.nn.init)]
    hf_init = sys.modules.get("transformers.initialization")
    if isinstance(getattr(hf_init, "TORCH_INIT_FUNCTIONS", None), dict):
        tables.append(hf_init.TORCH_INIT_FUNCTIONS)  # type: ignore[union-attr]
    saved = [(table, name, table[name]) for table in tables for name in _INIT_FUNCTIONS if callable(table.get(name))]
    try:
        for table, name, original in saved:
            table[name] = skipping(original)
        yield
    finally:
        for table, name, original in saved:
            table[name] = original


class _NoDefaultLossNotice:
    """A logging filter: transformers (5.x, ``PreTrainedModel.loss_function`` in
    ``modeling_utils.py``) warns once per process that ``loss_type=None`` "is unrecognized"
    when a config leaves the loss to its default, which every config built from its class does;
    the default (causal LM cross-entropy) is the loss the model trains with, so the notice tells
    a phaze user nothing, and a sweep's worker processes printed it once each."""

    @staticmethod
    def filter(record) -> bool:
        return not record.getMessage().startswith("`loss_type=None` was set in the config")


@contextlib.contextmanager
def _quiet_default_loss_notice() -> Iterator[None]:
    import logging

    log = logging.getLogger("transformers.modeling_utils")
    log.addFilter(_NoDefaultLossNotice)
    try:
        yield
    finally:
        log.removeFilter(_NoDefaultLossNotice)


@contextlib.contextmanager
def _module_stack_hooks(model) -> Iterator[list[tuple[str, str]]]:
    """Record the module path of every forward node in ``meta["nn_module_stack"]``."""
    import torch
    import torch.fx.traceback as fxt

    paths = {id(m): (p, type(m).__qualname__) for p, m in model.named_modules()}
    stack: list[tuple[str, str]] = []

    def publish() -> None:
        fxt.current_meta["nn_module_stack"] = {p: (p, t) for p, t in stack}

    def pre(module, args):
        entry = paths.get(id(module))
        if entry is not None:
            stack.append(entry)
            publish()

    def post(module, args, output):
        entry = paths.get(id(module))
        if entry is not None and stack and stack[-1] == entry:
            stack.pop()
            publish()

    h1 = torch.nn.modules.module.register_module_forward_pre_hook(pre)
    h2 = torch.nn.modules.module.register_module_forward_hook(post)
    try:
        yield stack  # after a failure it still holds the modules the failing op was called in
    finally:
        h1.remove()
        h2.remove()
        fxt.current_meta.pop("nn_module_stack", None)


def _default_loss(output: Any):
    import torch

    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if loss is None and isinstance(output, (tuple, list)) and output:
        first = output[0]
        if isinstance(first, torch.Tensor) and first.dim() == 0:
            loss = first
    if loss is None and isinstance(output, torch.Tensor):
        loss = output if output.dim() == 0 else output.float().sum()
    if loss is None:
        raise PhazeError("the model output has no .loss and is not a tensor; define loss_fn(output) in the model file")
    return loss


def _describe_trace_failure(exc: BaseException, spec: ModelSpec, modules: list[tuple[str, str]]) -> str:
    """One line: what went wrong, the source line (user code first, then library code; torch's
    own frames and generated code say nothing to the user) and the module it happened in
    (``modules``: the module stack at the failure, innermost last)."""
    import torch

    torch_dir = str(Path(torch.__file__).parent)
    here = str(Path(__file__).parent.parent)
    frames = traceback.extract_tb(exc.__traceback__)
    user = [f for f in frames if Path(f.filename) == spec.path]
    lib = [f for f in frames if not f.filename.startswith((torch_dir, here, "<")) and "contextlib" not in f.filename]
    candidates = user or lib
    frame = candidates[-1] if candidates else None
    where = ""
    if modules:
        path, kind = modules[-1]
        where = f" in module '{path or '<root>'}' ({kind})"
    if frame is not None:
        where += f" at {Path(frame.filename).name}:{frame.lineno}"
        if frame.line:
            where += f": `{frame.line.strip()}`"
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    data_dependent = (
        "data-dependent" in text.lower()
        or "data dependent" in text.lower()
        or "_local_scalar_dense" in text
        or ".item()" in text
        or type(exc).__name__ in ("DataDependentOutputException", "GuardOnDataDependentSymNode")
    )
    if data_dependent:
        return f"cannot trace {spec.path.name}: data-dependent control flow (a tensor's value decides what runs){where}"
    return f"cannot trace {spec.path.name}{where}: {type(exc).__name__}: {text}"


#: Config fields (transformers) that give the longest sequence a model is built for.
_POSITION_FIELDS = ("n_positions", "max_position_embeddings")

#: The whole sequence of a sample when a trace holds only a part of it (context parallelism
#: traces one device's S/c tokens): the length the position check compares and says, so that
#: its warning names the length the user gave, once, not each degree's part of it.
_WHOLE_SEQUENCE: contextvars.ContextVar[int | None] = contextvars.ContextVar("whole_sequence", default=None)


@contextlib.contextmanager
def whole_sequence(seq_len: int | None) -> Iterator[None]:
    """Trace, within it, parts of samples of ``seq_len`` tokens (None: whole samples)."""
    token = _WHOLE_SEQUENCE.set(seq_len)
    try:
        yield
    finally:
        _WHOLE_SEQUENCE.reset(token)


def position_limit(model) -> tuple[str, int, bool] | None:
    """``(config field, longest sequence, whether a learned table holds its positions)`` of the
    model's config (:data:`_POSITION_FIELDS`); None when it states none: what
    :func:`check_position_limit` checks a sequence length against (kept by a trace that serves
    other shapes, ``symbolic_trace``, to check each of them)."""
    import torch

    config = getattr(model, "config", None)
    if config is None:
        return None
    for name in _POSITION_FIELDS:
        limit = getattr(config, name, None)
        if isinstance(limit, int) and limit > 0:
            break
    else:
        return None
    # A learned table: an embedding with that many rows (OPT's keeps 2 more, its position offset).
    learned = any(isinstance(m, torch.nn.Embedding) and m.num_embeddings in (limit, limit + 2) for m in model.modules())
    return name, limit, learned


def check_position_limit(found: tuple[str, int, bool] | None, spec: ModelSpec, seq_len: int | None) -> None:
    """A sequence longer than the model's learned position table (``found``: its
    :func:`position_limit`) would index past it on a GPU (on meta tensors nothing checks it):
    refuse it.  Models with rotary positions have no table; beyond their configured length
    they get a warning.  Under :func:`whole_sequence` the whole sample's length is the one
    checked."""
    seq_len = _WHOLE_SEQUENCE.get() or seq_len
    if seq_len is None or found is None:
        return
    name, limit, learned = found
    if seq_len <= limit:
        return
    what = f"{spec.path.name}: sequence length {seq_len} is beyond the model's {name} = {limit}"
    if learned:
        raise PhazeError(what + " (its learned position table has no rows for the positions after it)")
    warnings.warn(what + " (no position table, but the model is not configured for it)", PhazeWarning, stacklevel=3)


def _plain_attributes(block) -> list[tuple[str, str, Any]]:
    """Every plain (number, string, bool, None, tuple) attribute of ``block`` and its
    submodules: what, besides the parameters' shapes, can make one block run other code than
    another (e.g. a sliding window on some layers only)."""
    out = []
    for path, m in block.named_modules():
        for k, v in sorted(vars(m).items()):
            if k.startswith("_") or k == "training":
                continue
            if v is None or isinstance(v, (bool, int, float, str, tuple)):
                out.append((path, k, v))
    return out


def uniform_blocks(model) -> tuple[Any, str, int] | None:
    """``(parent, attribute, count)`` of the model's list of repeated blocks: the
    ``nn.ModuleList`` with the most children (at least 2) that all have the same class, the
    same module tree, the same parameter shapes and the same plain attributes, except an integer
    that equals the block's own index (``layer_idx``); None when the model has no such list.
    Only such blocks run the same code, so that a model cut to its first few of them traces
    the same graph for each (``trace_model``'s ``max_blocks``)."""
    import torch

    best = None
    for parent in model.modules():
        for name, child in parent.named_children():
            if not isinstance(child, torch.nn.ModuleList) or len(child) < 2:
                continue
            if best is not None and len(child) <= best[2]:
                continue
            blocks = list(child)

            def structure(b):
                shapes = [(n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in b.named_parameters()]
                bufs = [(n, tuple(t.shape), t.dtype) for n, t in b.named_buffers()]
                return type(b), repr(b), shapes, bufs, [(p, k) for p, k, _ in _plain_attributes(b)]

            first = structure(blocks[0])  # (once: each block's structure is its whole repr)
            if any(structure(b) != first for b in blocks[1:]):
                continue
            # Each attribute the same in every block, or every block's own index.
            values = zip(*([v for _, _, v in _plain_attributes(b)] for b in blocks))
            if all(all(v == vs[0] for v in vs) or list(vs) == list(range(len(blocks))) for vs in values):
                best = (parent, name, len(blocks))
    return best


def _torch_dtype(name: str):
    import torch

    name = FP8_DTYPES.get(name, name)
    return {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[name]


def cast_inputs(args: tuple, kwargs: dict, dtype: str) -> tuple[tuple, dict]:
    """The model's inputs with floating tensors in the training precision ``dtype`` (as
    autocast-free fp16 training feeds them; ``"model"``: as given)."""
    import torch

    if dtype == "model" or dtype in AMP_DTYPES:  # autocast casts inside the step
        return args, kwargs

    def cast(v):
        return v.to(_torch_dtype(dtype)) if isinstance(v, torch.Tensor) and v.is_floating_point() else v

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def unflatten_step_inputs(
    flat: Sequence[Any], pnames: list[str], bnames: list[str], args: tuple, kwargs: dict
) -> tuple[dict, dict, tuple, dict]:
    """A traced step's flat inputs (the parameters, the buffers, then the tensors of the call
    in order) back as ``(parameters, buffers, args, kwargs)`` of the call, its non-tensor
    arguments as given."""
    import torch

    n_p, n_b = len(pnames), len(bnames)
    it = iter(flat[n_p + n_b :])
    call_args = tuple(next(it) if isinstance(a, torch.Tensor) else a for a in args)
    call_kwargs = {k: (next(it) if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    return dict(zip(pnames, flat[:n_p])), dict(zip(bnames, flat[n_p : n_p + n_b])), call_args, call_kwargs


#: Whether this process has run autograd (a training trace): torch refuses to run it in a child
#: forked after that ("Unable to handle autograd's threading in combination with fork-based
#: multiprocessing"), so ``deepen`` forks its check trace only before.  A module global because
#: it is a fact about the process (torch's autograd threads), not about a compilation: set by
#: the first training trace, never cleared.  It decides only where the check trace runs (a
#: forked child, or here), never what it answers: ``tests/test_deepen.py``
#: (``test_no_child_after_a_trace_here``, ``test_a_child_that_cannot_trace_leaves_the_check_here``).
_autograd_ran = False


def autograd_ran() -> bool:
    """Whether a training step was traced in this process (see ``_autograd_ran``)."""
    return _autograd_ran


def trace_model(
    spec: ModelSpec,
    micro_batch_size: int = 1,
    seq_len: int | None = None,
    training: bool = True,
    dtype: str = "float16",
    max_blocks: int | None = None,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
    *,
    shapes: SymbolicSizes | None = None,
) -> TracedGraph:
    """Trace ``spec``'s model on fake tensors: forward + loss, and with ``training`` also the
    backward (gradients of every parameter).

    ``max_blocks``: when the model has more than that many repeated blocks that run the same
    code (:func:`uniform_blocks`), trace it cut to its first ``max_blocks`` of them (the
    result's ``blocks`` says so): a step whose every block is one of first, middle or last can
    be priced from it at any depth (``phaze/search/setting.py``, docs/design.md §2).

    ``fp8_recipe``: how ``--dtype fp8``'s linears scale their casts (``float8_linear``).

    ``shapes``: the call's sizes traced as symbols (``symbolic_trace``, whose family of points
    checks each point's sequence length against the model's positions itself); None: as the
    ints they are."""
    _check_trace_options(micro_batch_size, seq_len, dtype)

    # Imported here, not first inside the fake mode below, where a module's import-time tensors
    # would be fake ones (``_step_function`` reads it).
    import torch._functorch._aot_autograd.logging_utils  # noqa: F401
    from torch._subclasses.fake_tensor import FakeTensorMode

    start = time.perf_counter()
    model = _model_on_meta(spec)
    _check_size(model, spec)
    positions = position_limit(model)
    if shapes is None:
        check_position_limit(positions, spec, seq_len if seq_len is not None else spec.seq_len)
    else:
        shapes.positions = positions
    from phaze_ir.frontend.shape import model_shape

    shape = model_shape(model)  # of the whole model: before its blocks are cut below
    blocks, block_path = _cut_blocks(model, max_blocks)
    model = _in_precision(model, dtype)
    if dtype in FP8_DTYPES:
        register_fp8_scales(model, fp8_recipe)
        if not fp8_linears(model, fp8_recipe):
            # A CNN (its GEMMs are convolutions), or linears too small for TE's FP8 GEMM: the
            # step is the bf16 one, which --dtype fp8 cannot change; said, not priced silently.
            runtime, sizes = ("Transformer Engine", "8 and 16") if fp8_recipe.runtime == "te" else ("torchao", "16")
            warnings.warn(
                f"--dtype {dtype}: the model has no linear {runtime} runs in FP8 (a torch.nn.Linear other than the "
                f"LM head, its sizes multiples of {sizes}); it is priced in bf16, as with --dtype bfloat16",
                PhazeWarning,
                stacklevel=2,
            )
    loss_fn = spec.loss_fn or _default_loss

    with FakeTensorMode(allow_non_fake_inputs=True) if shapes is None else shapes.fake_mode() as mode:
        _give_fake_storage(model)
        params = dict(model.named_parameters())
        buffers = dict(model.named_buffers())
        args, kwargs = cast_inputs(*_model_inputs(spec, micro_batch_size, seq_len), dtype)
        if shapes is not None:
            args, kwargs = shapes.symbolic(mode, args, kwargs)
        tensor_inputs = _named_tensor_inputs(model, args, kwargs)
        pnames, bnames = list(params), list(buffers)
        requires_grad = _trainable(spec, params, training)
        step, outputs_info = _step_function(
            spec, model, loss_fn, (pnames, bnames, requires_grad), (args, kwargs), training, dtype, fp8_recipe
        )
        flat_inputs = [params[n] for n in pnames] + [buffers[n] for n in bnames] + [t for _, t in tensor_inputs]
        gm = _make_fx(step, flat_inputs, spec, model, shapes)

    placeholders = (
        [("param", n) for n in pnames] + [("buffer", n) for n in bnames] + [("input", n) for n, _ in tensor_inputs]
    )
    grad_flags = outputs_info.get("grads", [])
    grad_names = [n for n, ok in zip(requires_grad, grad_flags) if ok]
    no_grad = [n for n, ok in zip(requires_grad, grad_flags) if not ok]
    if no_grad:
        warnings.warn(f"{len(no_grad)} parameter(s) receive no gradient, e.g. {no_grad[0]}", PhazeWarning, stacklevel=2)
    return TracedGraph(
        graph_module=gm,
        model_name=spec.name,
        training=training,
        micro_batch_size=micro_batch_size,
        seq_len=seq_len if seq_len is not None else spec.seq_len,
        placeholders=placeholders,
        grad_names=grad_names,
        no_grad_params=no_grad,
        seq_module=_seq_modules(gm),
        trace_seconds=time.perf_counter() - start,
        blocks=blocks,
        block_path=block_path,
        shape=shape,
    )


def _check_trace_options(micro_batch_size: int, seq_len: int | None, dtype: str) -> None:
    """Refuse bad options before the model is built: building it can take seconds."""
    if micro_batch_size < 1:
        raise PhazeError(f"--micro-batch {micro_batch_size}: expected a positive integer")
    if seq_len is not None and seq_len < 1:
        raise PhazeError(f"--seq-len {seq_len}: expected a positive integer")
    if dtype not in DTYPES:
        raise PhazeError(f"--dtype {dtype}: expected one of {', '.join(DTYPES)}")


#: The most leaf modules (``torch.nn`` modules without children: a linear, a norm, an
#: activation) a model may have. A compilation's whole-model step (its import, the pipeline,
#: the printed plan) grows with them, about 0.01 s of CPU per leaf of a transformer block on
#: the 2-core development machine (a Llama block: 10 leaves, about 270 ops, 0.1 s), on top of
#: about 14 s that any model costs (imports, the sweep's cut traces at each micro-batch): a
#: tiny Llama of 204 layers (2,044 leaves, within the bound of 2,048 before 2026-12-06) took
#: 34 s of CPU for ``--hw h100 --devices 64 --global-batch 256``, over the 20 s that issue 58
#: asks of a model at the bound (30 s on a loaded checker). The bound is the most that every
#: published model phaze prices needs: the 1T GPT of Korthikanti et al.
#: (data/published/korthikanti2022.csv, the Megatron GPT of 128 layers as
#: ``phaze.validate`` builds it: 10 leaves a layer with its dropouts) has 1,285, Llama-3.1-405B
#: (the largest of examples/) 1,264; rounded up to a multiple of 64. A model at it (134 tiny
#: Llama layers) compiles in about the CPU time of Llama-3.1-405B itself (docs/benchmarks.md,
#: "Models at the size bound"). A model beyond it is refused in one line when the compilation
#: starts (:func:`check_model_size`), before any trace; a config.json whose layers alone pass
#: it before transformers builds it (``loader._check_depth``).
MAX_LEAF_MODULES = 1_344


def _check_size(model, spec: ModelSpec) -> None:
    """A :class:`PhazeError` for a model with more than :data:`MAX_LEAF_MODULES` leaf modules."""
    leaves = 0
    for m in model.modules():
        if next(m.children(), None) is None:
            leaves += 1
            if leaves > MAX_LEAF_MODULES:
                raise ModelTooLarge(
                    f"{spec.path.name}: more than {MAX_LEAF_MODULES:,} leaf modules (linears, norms, activations), "
                    "the most phaze compiles (its compilation grows with them: about half a minute of CPU at the "
                    "bound); the largest published model phaze prices, a 1T GPT, has 1,285"
                )


def check_model_size(spec: ModelSpec) -> int | None:
    """Build ``spec``'s model on ``meta`` and refuse it, in one line, when it has more leaf
    modules than :data:`MAX_LEAF_MODULES` (or when ``get_model()`` fails): what a compilation
    checks first (``phaze.driver.start_compilation``), so that a model beyond the bound is
    refused once, before the sweep's first trace, not by each trace in turn.  Returns the
    width of the model's output projection (a transformers LM's ``get_output_embeddings()``
    linear: its vocabulary), None when it has none (the sweep's memory bound then prunes
    nothing: ``passes.algorithms.memory.logits_grad_bytes``)."""

    return check_model(spec)[0]


def check_model(spec: ModelSpec) -> tuple[int | None, tuple[int, int] | None]:
    """:func:`check_model_size`'s check and its vocabulary, with the model's attention heads
    as its transformers config states them, ``(query heads, key/value heads)`` (None for a
    model that is no transformers ``PreTrainedModel`` or whose config names no heads): what
    the TP widths are checked against before any trace (``phaze.driver.check_tp_heads``)."""
    import torch

    model = _model_on_meta(spec)
    _check_size(model, spec)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.out_features) if isinstance(head, torch.nn.Linear) else None
    return vocab, _config_heads(model)


def _config_heads(model) -> tuple[int, int] | None:
    """``(num_attention_heads, num_key_value_heads)`` of a transformers model's (text) config;
    the key/value heads default to the heads, as transformers' attention takes them."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None)
    if type(heads) is not int or heads < 1:
        return None
    return heads, kv if type(kv) is int and 1 <= kv <= heads and heads % kv == 0 else heads


def _model_on_meta(spec: ModelSpec):
    """The user's model, built on ``meta`` (no weights are ever allocated, so a 175B model
    builds in seconds); whatever its ``get_model()`` raises becomes one line naming the file."""
    import torch

    try:
        with torch.device("meta"), _meta_init_skipped(), hard_exit_refused():
            model = spec.get_model()
    except PhazeError:
        raise
    except (Exception, SystemExit) as e:  # SystemExit: a sys.exit() in the user's code
        raise PhazeError(f"{spec.path.name}: get_model() failed: {failure(e)}") from e
    if not isinstance(model, torch.nn.Module):
        raise PhazeError(f"{spec.path.name}: get_model() returned {type(model).__name__}, expected a torch.nn.Module")
    return model


def _cut_blocks(model, max_blocks: int | None) -> tuple[tuple[int, int] | None, str]:
    """``(blocks, block_path)`` of the result: the model cut in place to its first
    ``max_blocks`` repeated blocks when it has more (``(max_blocks, count)`` and the blocks'
    path), else ``(None, "")``: tracing a few blocks stands for tracing all of them."""
    import torch

    if max_blocks is None:
        return None, ""
    if max_blocks < 1:
        raise PhazeError(f"max_blocks = {max_blocks}: expected a positive integer")
    found = uniform_blocks(model)
    if found is None or found[2] <= max_blocks:
        return None, ""
    parent, attr, count = found
    owner = next(path for path, m in model.named_modules() if m is parent)
    setattr(parent, attr, torch.nn.ModuleList(list(getattr(parent, attr))[:max_blocks]))
    return (max_blocks, count), (f"{owner}.{attr}" if owner else attr)


def _in_precision(model, dtype: str):
    """The model in the training precision, in training mode (dropout traced as it runs):
    fp32 weights under mixed precision, ``dtype`` otherwise, as built for ``"model"``."""
    if dtype in AMP_DTYPES:
        model = model.float()
    elif dtype != "model":
        model = model.to(_torch_dtype(dtype))
    model.train()
    return model


def _give_fake_storage(model) -> None:
    """Fake storage for the meta model (inside a ``FakeTensorMode``): ops on meta tensors record
    nothing for make_fx, fake ones do."""
    model.to_empty(device="cpu")
    # to_empty() unties shared embeddings; re-tie them so a tied weight stays one parameter.
    tie_weights = getattr(model, "tie_weights", None)  # (a method of transformers' models)
    if tie_weights is not None:
        tie_weights()


def _model_inputs(spec: ModelSpec, micro_batch_size: int, seq_len: int | None) -> tuple[tuple, dict]:
    """The user's ``get_inputs()``, its failure one line naming the file."""
    try:
        return spec.inputs(micro_batch_size, seq_len)
    except PhazeError:
        raise
    except (Exception, SystemExit) as e:
        raise PhazeError(f"{spec.path.name}: get_inputs() failed: {failure(e)}") from e


def _named_tensor_inputs(model, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """The call's tensors with the names its ``phaze.input`` arguments get: positional ones
    after the forward's parameters where possible (``arg<i>`` else), keyword ones by keyword."""
    import torch

    try:
        fwd_params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        fwd_params = []
    tensor_inputs: list[tuple[str, Any]] = []
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor):
            tensor_inputs.append((fwd_params[i] if i < len(fwd_params) else f"arg{i}", a))
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            tensor_inputs.append((k, v))
    return tensor_inputs


def _trainable(spec: ModelSpec, params: dict[str, Any], training: bool) -> list[str]:
    """The parameters that get a gradient; a training step without any is refused here, where
    the message can say why, rather than as an empty backward."""
    n_p = len(params)
    requires_grad = [n for n in params if params[n].requires_grad]
    if training and not requires_grad:
        raise PhazeError(
            f"{spec.path.name}: the model has no trainable parameters "
            + (f"(all {n_p} have requires_grad=False)" if n_p else "(it has none)")
            + ": there is no training step to compile"
        )
    return requires_grad


def _step_function(
    spec: ModelSpec,
    model,
    loss_fn,
    names: tuple[list[str], list[str], list[str]],
    call: tuple[tuple, dict],
    training: bool,
    dtype: str,
    fp8_recipe: Fp8Recipe = Fp8Recipe.DELAYED,
):
    """The function make_fx traces, of the flat inputs (parameters, buffers, the call's
    tensors: ``names`` are the parameters', the buffers' and the trainable parameters'), and
    the dict where it records which trainable parameters got a gradient (``"grads"``, known
    only once it has run).  Forward, loss and backward in one function, so that one trace
    records autograd's real backward (what it saves, what it recomputes)."""
    import torch
    import torch.fx.traceback as fxt
    from torch._functorch._aot_autograd.logging_utils import setup_stacktrace_preservation_hooks

    pnames, bnames, requires_grad = names
    args, kwargs = call
    outputs_info: dict[str, Any] = {}
    autocast = (
        torch.autocast("cpu", dtype=_torch_dtype(AMP_DTYPES[dtype]))
        if dtype in AMP_DTYPES
        else contextlib.nullcontext()
    )
    fp8 = fp8_linears_patched(model, fp8_recipe) if dtype in FP8_DTYPES else contextlib.nullcontext()

    def step(*flat):
        p, b, call_args, call_kwargs = unflatten_step_inputs(flat, pnames, bnames, args, kwargs)
        with autocast, fp8:
            out = torch.func.functional_call(model, {**p, **b}, call_args, call_kwargs)
            loss = loss_fn(out)
        if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
            raise PhazeError("the loss must be a scalar tensor; define loss_fn(output) in the model file")
        if not training:
            return (loss,)
        if loss.grad_fn is None:
            raise PhazeError(f"{spec.path.name}: the loss does not depend on any parameter that requires a gradient")
        global _autograd_ran
        _autograd_ran = True
        fxt.current_meta["custom"] = {"phaze_phase": "bwd"}
        setup_stacktrace_preservation_hooks([loss.grad_fn])
        grads = torch.autograd.grad(loss, [p[n] for n in requires_grad], allow_unused=True)
        outputs_info["grads"] = [g is not None for g in grads]
        return (loss, *[g for g in grads if g is not None])

    return step, outputs_info


def _make_fx(step, flat_inputs: list[Any], spec: ModelSpec, model, shapes: SymbolicSizes | None = None):
    """``make_fx(step)`` with provenance recorded (module hooks, node meta) and torch's and
    transformers' noise quiet; a failure becomes one line saying where in the user's model.
    ``shapes``: symbolically (:func:`trace_model`)."""
    import torch.fx.traceback as fxt
    from torch.fx.experimental.proxy_tensor import make_fx

    modules: list[tuple[str, str]] = []
    try:
        with (
            _transformers_meta_patches(),
            as_on_cuda(),
            _bounded_calls(spec, model),
            _module_stack_hooks(model) as modules,
            fxt.preserve_node_meta(),
            _quiet_fake_tensor_log(),
            _quiet_default_loss_notice(),
            hard_exit_refused(),
            contextlib.nullcontext() if shapes is None else shapes.tracing(),
        ):
            if shapes is None:
                return make_fx(step)(*flat_inputs)
            return make_fx(step, tracing_mode="symbolic", _allow_non_fake_inputs=True)(*flat_inputs)
    except PhazeError:
        raise
    except SystemExit as e:
        raise PhazeError(f"{spec.path.name}: the model called {exit_call(e)} while being traced") from None
    except Exception as e:
        raise PhazeError(_describe_trace_failure(e, spec, modules)) from e
    finally:
        fxt.current_meta.pop("custom", None)


#: The torch calls (functions and tensor methods, as a ``TorchFunctionMode`` sees them) one
#: trace may make: :data:`CALLS_PER_LEAF` per leaf module of the model traced, at least
#: :data:`MIN_TRACED_CALLS` and at most :data:`MAX_TRACED_CALLS`. What :data:`MAX_LEAF_MODULES`
#: cannot see: a model of few modules whose forward loops (one linear applied 100,000 times)
#: traces and compiles as long as a deep one. Published models make 20-40 calls per leaf (a
#: Llama block: 309 calls for 10 leaves; GPT-3 175B's whole trace about 36,000 for 965 leaves,
#: Llama-3.1-405B's about 39,000 for 1,264), so the bound takes every one traced whole (the
#: deepened step's check, ``tests/test_deepen.py``) and a Llama at the leaf bound (127 layers: 39,000).
#: A call costs 0.4-1 ms of CPU to trace on the 2-core development machine: a loop model of one
#: linear is refused at 16,384 calls, after 21.5 s of CPU, the process included.
CALLS_PER_LEAF = 64
MIN_TRACED_CALLS = 16_384
MAX_TRACED_CALLS = 65_536


def traced_calls_bound(model) -> int:
    """The most torch calls a trace of ``model`` may make (:data:`CALLS_PER_LEAF`)."""
    leaves = sum(1 for m in model.modules() if next(m.children(), None) is None)
    return min(MAX_TRACED_CALLS, max(MIN_TRACED_CALLS, CALLS_PER_LEAF * leaves))


@contextlib.contextmanager
def _bounded_calls(spec: ModelSpec, model):
    """While active, the trace stops with one :class:`ModelTooLarge` line at the torch call past
    :func:`traced_calls_bound` (counted, never timed)."""
    from torch.overrides import TorchFunctionMode

    bound = traced_calls_bound(model)

    class _Count(TorchFunctionMode):
        calls = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            _Count.calls += 1
            if _Count.calls > bound:
                raise ModelTooLarge(
                    f"{spec.path.name}: its step makes more than {bound:,} torch calls (a loop in its forward?), the "
                    f"most phaze traces for its modules ({CALLS_PER_LEAF} a leaf module, from {MIN_TRACED_CALLS:,} "
                    f"to {MAX_TRACED_CALLS:,}); a Llama block makes about 309"
                )
            return func(*args, **(kwargs or {}))

    with _Count():
        yield


def _seq_modules(gm) -> dict[int, str]:
    """The forward module of each autograd sequence number (the first forward node that carries
    it): how a backward node, which has no module stack, is told its module (``provenance``)."""
    seq_module: dict[int, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.meta.get("custom", {}).get("phaze_phase") == "bwd":
            continue
        seq = node.meta.get("seq_nr")
        stack = node.meta.get("nn_module_stack")
        if seq is not None and seq not in seq_module and stack:
            seq_module[seq] = list(stack)[-1]
    return seq_module
