"""Load a user's ``MODEL.py``, or a Hugging Face ``config.json`` (:func:`load_hf_config`).

The contract of a model file:

- ``get_model()`` returns a ``torch.nn.Module`` (build it on the ``meta`` device or from a
  config: phaze never needs weights);
- ``get_inputs(micro_batch_size)`` (optionally ``get_inputs(micro_batch_size, seq_len)``)
  returns the example inputs of one micro-batch, as a tuple of positional arguments or a dict
  of keyword arguments;
- optional ``NAME`` (str) and ``SEQ_LEN`` (int);
- optional ``loss_fn(output)`` mapping the model's output to a scalar loss (by default the
  output's ``.loss``, else the output itself when it is a scalar, else its sum).

A model file may import helpers that sit beside it (or any module of the user's). The files of
those modules are the model's *sources* (:attr:`ModelSpec.sources`): what a cached answer about
the model must be keyed on besides the model file itself (:mod:`phaze.search.warm`).

A ``.json`` path is a Hugging Face ``config.json`` instead: the model is what transformers' auto
classes build from it (:func:`load_hf_config`), with the inputs every example file gives a
language model (``input_ids`` and the same ids as ``labels``), so that a config.json and the
example file that spells out the same config give the same IR.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import functools
import importlib.util
import inspect
import json
import math
import os
import sys
import sysconfig
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from phaze_ir.errors import ModelTooLarge, PhazeError, PhazeWarning
from phaze_ir.files import RefusedFile, printable, read_regular, shorten
from phaze_ir.warning import keep_route, routed_for_the_process


@dataclass
class ModelSpec:
    """What a model file provides (see the module docstring)."""

    path: Path
    name: str
    get_model: Callable[[], Any]
    get_inputs: Callable[..., Any]
    seq_len: int | None
    loss_fn: Callable[[Any], Any] | None
    takes_seq_len: bool
    #: The other Python files of the user's that importing the model file loaded, sorted (see
    #: :func:`user_sources`).
    sources: tuple[Path, ...] = ()
    #: Why the model has no sequence length of its own (a config.json that leaves it to
    #: transformers' default), said before any trace when no ``--seq-len`` is given; None: it has one.
    no_seq_len: str | None = None

    def inputs(self, micro_batch_size: int, seq_len: int | None = None) -> tuple[tuple, dict]:
        """The example inputs as ``(args, kwargs)``."""
        if seq_len is not None and not self.takes_seq_len:
            raise PhazeError(f"{self.path.name}: --seq-len was given but get_inputs() takes no seq_len argument")
        with hard_exit_refused():
            if self.takes_seq_len:
                out = self.get_inputs(micro_batch_size, seq_len if seq_len is not None else self.seq_len)
            else:
                out = self.get_inputs(micro_batch_size)
        if isinstance(out, dict):
            return (), dict(out)
        if isinstance(out, (tuple, list)):
            return tuple(out), {}
        return (out,), {}


def with_fused_attention(spec: ModelSpec) -> ModelSpec:
    """``spec`` whose model runs its attention fused, as SDPA (a transformers model built with
    ``attn_implementation="eager"`` is switched by its ``set_attn_implementation``); any other
    model as it is. Context parallelism's runtimes run ring flash attention, never attention
    with its scores in memory."""
    return _switched_attention(spec, "eager", "sdpa")


def with_eager_attention(spec: ModelSpec) -> ModelSpec:
    """``spec`` whose model runs its attention as its matmuls and softmax (a transformers model
    built with ``attn_implementation="sdpa"`` is switched by its ``set_attn_implementation``
    to ``"eager"``); any other model as it is. The paper's runtime (``--kernels ops``: every
    op its own kernel, no fused attention) prices attention so."""
    return _switched_attention(spec, "sdpa", "eager")


def with_kernel_attention(spec: ModelSpec, seq_len: int | None = None) -> ModelSpec:
    """``spec`` whose transformers model, when its attention has a sliding window shorter than
    ``seq_len`` or attention sinks, runs it as the one fused kernel GPUs run for it
    (``kernel_attention``: FlashAttention's or cuDNN's window, the sinks' extra column); any
    other model as it is."""
    from dataclasses import replace

    from phaze_ir.frontend import kernel_attention

    build = spec.get_model

    def get_model():
        return kernel_attention.switch(build(), seq_len)

    return replace(spec, get_model=get_model)


def _switched_attention(spec: ModelSpec, implementation: str, to: str) -> ModelSpec:
    """``spec`` whose transformers model, built with ``attn_implementation=implementation``, is
    switched to ``to`` by its ``set_attn_implementation``; any other model as it is."""
    from dataclasses import replace

    build = spec.get_model

    def get_model():
        model = build()
        config = getattr(model, "config", None)
        if getattr(config, "_attn_implementation", None) == implementation and hasattr(
            model, "set_attn_implementation"
        ):
            model.set_attn_implementation(to)
        return model

    return replace(spec, get_model=get_model)


def _user_frame(exc: BaseException, path: Path) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    if frames:
        return f"{path.name}:{frames[-1].lineno}: "
    return f"{path.name}: "


def _quoted_error(e: BaseException) -> str:
    """``Type: message`` of an exception the model file raised, its message as a message quotes
    the input (:func:`shorten`: a word of 2 MB is cut)."""
    return f"{type(e).__name__}: {shorten(str(e))}"


def _syntax_error(e: SyntaxError, path: Path) -> str:
    """``FILE:LINE:COL: syntax error: MESSAGE`` for a syntax error met importing the model file
    ``path``: in the file it is in (the model file, or a module it imports, named as its path
    relative to the model's directory), at the line and column Python gives.  Python gives
    neither file nor line for a file holding a NUL byte ("source code string cannot contain null
    bytes"): the model file's first NUL then, or the model's line that imported the module that
    holds one.  Code the model compiles itself (``exec``, ``compile``) has no file: the model
    file's line that ran it, with the line in the code."""
    msg = e.msg or "invalid syntax"
    line, col = e.lineno, e.offset
    if e.filename is None and "null bytes" in msg:  # Python names neither the file nor the line
        line, col = _first_nul(path)
        if line is None:  # not the model file: a module it imports, at the model's import line
            return f"{_user_frame(e, path)}syntax error in a module the model file imports: {msg}"
        return f"{path.name}:{line}:{col}: syntax error: {msg}"
    if not e.filename or e.filename.startswith("<"):  # exec("..."), compile(...): where the model ran it
        at = f" (at line {line} of the code it compiles)" if line else ""
        return f"{_user_frame(e, path)}syntax error in code the model file compiles: {msg}{at}"
    file = Path(e.filename).resolve()
    name = file.relative_to(path.parent) if file.is_relative_to(path.parent) else file
    imported = "" if file == path else f" (imported by {path.name})"
    if line is None:
        return f"{name}: syntax error: {msg}{imported} (Python gives no line for it)"
    return f"{name}:{line}{f':{col}' if col else ''}: syntax error: {msg}{imported}"


def _first_nul(file: Path) -> tuple[int | None, int | None]:
    """Line and column (from 1) of the first NUL byte of ``file`` (None, None: none, or unread)."""
    try:
        data = file.read_bytes()
    except OSError:
        return None, None
    at = data.find(b"\0")
    if at < 0:
        return None, None
    start = data.rfind(b"\n", 0, at) + 1
    return data.count(b"\n", 0, at) + 1, at - start + 1


def load_model_file(path: str | os.PathLike | ModelSpec) -> ModelSpec:
    """Import ``path`` as a module and check that it follows the model-file contract (a
    ``.json`` path: a Hugging Face config, :func:`load_hf_config`); a :class:`ModelSpec`
    already (``phaze.api``'s of a model factory) is itself."""
    if isinstance(path, ModelSpec):
        return path
    with _offline_environment():
        return _load_model_file(path)


#: Set while a model file is imported, where the caller's environment says nothing: no hub traffic,
#: ever (models are built from configs in code; huggingface_hub and transformers read these when
#: first imported, which is usually here), and no info-level chatter from transformers (e.g.
#: about the default loss) on phazec's stderr.
_OFFLINE_DEFAULTS = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error"}


@contextlib.contextmanager
def _offline_environment():
    """:data:`_OFFLINE_DEFAULTS` for the duration of a load, then the environment as it was: a
    program that loads a model through ``phaze.api`` keeps its own environment."""
    added = [k for k in _OFFLINE_DEFAULTS if k not in os.environ]
    os.environ.update({k: _OFFLINE_DEFAULTS[k] for k in added})
    try:
        if routed_for_the_process() and "transformers" in sys.modules:  # a tool's: said as phaze's, once
            keep_route()
        yield
    finally:
        if routed_for_the_process() and "transformers" in sys.modules:  # its log handler, made by the model's import
            keep_route()
        for k in added:
            os.environ.pop(k, None)


def _load_model_file(path: str | os.PathLike) -> ModelSpec:
    p = Path(path)
    if p.suffix.lower() == ".json":
        return load_hf_config(p)
    if not p.exists():
        raise PhazeError(f"{path}: no such file")
    if p.is_dir():
        raise PhazeError(f"{path}: is a directory, expected a MODEL.py file")
    if not p.is_file():  # a FIFO (its import would wait for a writer), a device, a socket
        raise PhazeError(f"{path}: is not a regular file, expected a MODEL.py file")
    p = p.resolve()
    module_name = f"phaze_model_{p.stem}_{abs(hash(str(p)))}"
    spec = importlib.util.spec_from_file_location(module_name, p)
    if spec is None or spec.loader is None:
        raise PhazeError(f"{path}: cannot be imported as a Python file")
    module: ModuleType = importlib.util.module_from_spec(spec)
    try:
        with _importing_beside(p.parent), hard_exit_refused():
            spec.loader.exec_module(module)
    except SyntaxError as e:
        raise PhazeError(_syntax_error(e, p)) from e
    except Exception as e:  # the user's module raised while importing
        raise PhazeError(f"{_user_frame(e, p)}error while importing the model file: {_quoted_error(e)}") from e
    except SystemExit as e:  # phaze would exit with the model's status and say nothing
        where = _user_frame(e, p)
        raise PhazeError(f"{where}the model file called {exit_call(e)} while being imported") from None
    except KeyboardInterrupt:  # the user's Ctrl-C stays one
        raise
    except BaseException as e:  # a BaseException subclass of the model's own: one line, not a traceback
        where = _user_frame(e, p)
        raise PhazeError(f"{where}error while importing the model file: {_quoted_error(e)}") from None
    get_model = getattr(module, "get_model", None)
    get_inputs = getattr(module, "get_inputs", None)
    if not callable(get_model):
        raise PhazeError(f"{p.name}: defines no get_model() function (it must return a torch.nn.Module)")
    if not callable(get_inputs):
        raise PhazeError(f"{p.name}: defines no get_inputs(micro_batch_size) function")
    seq_len = getattr(module, "SEQ_LEN", None)
    if seq_len is not None and (not isinstance(seq_len, int) or seq_len <= 0):
        raise PhazeError(f"{p.name}: SEQ_LEN = {seq_len!r}: expected a positive integer")
    name = getattr(module, "NAME", p.stem)
    params = list(inspect.signature(get_inputs).parameters)
    return ModelSpec(
        path=p,
        name=printable(str(name)),
        get_model=get_model,
        get_inputs=get_inputs,
        seq_len=seq_len,
        loss_fn=getattr(module, "loss_fn", None),
        takes_seq_len=len(params) >= 2,
        sources=tuple(f for f in user_sources() if f != p),
    )


# --- Hugging Face config.json ---------------------------------------------------------------

#: The most bytes a config.json may hold.  Published ones are a few KB (Qwen2-7B's: 0.7 KB; the
#: largest multimodal ones some tens of KB): a larger file is not one, and is refused unread.
CONFIG_JSON_LIMIT = 1 << 20

#: Bounds of the size fields of a config (under each name transformers' configs give them).  Far
#: beyond any published model (Llama-3.1-405B: 126 layers, hidden 16384, 128 heads; Llama-4
#: Scout: 10M positions), and below what would make the build or the trace itself the problem:
#: the layers are Python modules built one by one, and the default sequence length is
#: max_position_embeddings, whose eager attention scores are heads x seq^2 elements per sequence
#: (2^60 at these bounds: still an int64).
_SIZE_LIMITS = {
    "num_hidden_layers": 10_000,
    "n_layer": 10_000,
    "num_layers": 10_000,
    "hidden_size": 1 << 20,
    "n_embd": 1 << 20,
    "d_model": 1 << 20,
    "intermediate_size": 1 << 22,
    "n_inner": 1 << 22,
    "d_ff": 1 << 22,
    "ffn_dim": 1 << 22,
    "moe_intermediate_size": 1 << 22,
    "num_attention_heads": 1 << 12,
    "n_head": 1 << 12,
    "num_heads": 1 << 12,
    "num_key_value_heads": 1 << 12,
    "head_dim": 1 << 16,
    "vocab_size": 1 << 26,
    "max_position_embeddings": 1 << 24,
    "n_positions": 1 << 24,
    "n_ctx": 1 << 24,
    "num_local_experts": 1 << 14,
    "num_experts": 1 << 14,
    "n_routed_experts": 1 << 14,
    "num_experts_per_tok": 1 << 14,
}

#: The fields without which transformers would build its default shape (a config class's
#: defaults are some published model's: LlamaConfig's are Llama-2-7B's) and not the user's: each
#: must be in the file, under its own name or an alias of the config class's ``attribute_map``.
_REQUIRED_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")

#: The heads phaze builds from a config, in the order it picks one when the config's
#: ``architectures`` names none: a masked LM (only encoders have one: BERT is in the causal-LM
#: mapping too, as ``BertLMHeadModel``, but is pre-trained masked), else a causal LM, else a
#: seq2seq LM.  Every one trains on ``input_ids`` with the same ids as ``labels``, as the
#: example files do.
_HEADS = (
    ("masked LM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("causal LM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("seq2seq LM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
)


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _read_config_json(p: Path) -> dict:
    """The JSON object of the config file ``p``, each problem one :class:`PhazeError` line."""
    try:
        data = read_regular(p, CONFIG_JSON_LIMIT, "Hugging Face config.json")
    except FileNotFoundError:
        raise PhazeError(f"{p}: no such file") from None
    except RefusedFile as e:
        raise PhazeError(f"{p}: {e.strerror}") from None
    except OSError as e:
        raise PhazeError(f"{p}: cannot be read ({e.strerror or e})") from None
    try:
        text = data.decode("utf-8-sig")  # some editors write a BOM; JSON readers accept one
    except UnicodeDecodeError as e:
        raise PhazeError(f"{p.name}: invalid JSON: not UTF-8 text (byte {e.start})") from None
    try:
        raw = json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as e:
        raise PhazeError(f"{p.name}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None
    except RecursionError:
        raise PhazeError(f"{p.name}: invalid JSON: nested too deeply") from None
    except ValueError as e:  # NaN/Infinity, an integer of more digits than Python converts
        if "integer string conversion" in str(e):  # Python's words name its own setting
            raise PhazeError(
                f"{p.name}: invalid JSON: an integer of more than {sys.get_int_max_str_digits()} digits"
            ) from None
        raise PhazeError(f"{p.name}: invalid JSON: {shorten(str(e))}") from None
    if not isinstance(raw, dict):
        raise PhazeError(f"{p.name}: expected a JSON object (a Hugging Face config), found a {type(raw).__name__}")
    return raw


def _check_sizes(raw: dict, name: str) -> None:
    """Every size field (also in a nested config, e.g. ``text_config``) a positive integer
    within :data:`_SIZE_LIMITS`, before transformers builds anything from it."""
    for key, value in raw.items():
        if isinstance(value, dict):
            _check_sizes(value, f"{name}: {key}")
            continue
        limit = _SIZE_LIMITS.get(key)
        if limit is None or value is None:  # None: the config class's rule (n_inner: 4 x hidden)
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise PhazeError(f"{name}: {key} = {_excerpt_json(value)}: expected a positive integer")
        if not 1 <= value <= limit:
            raise PhazeError(f"{name}: {key} = {value}: expected a positive integer of at most {limit}")


def _excerpt_json(value: Any) -> str:
    """``value`` as the file wrote it, cut as a message quotes the input."""
    return shorten(json.dumps(value))


def _config_class(raw: dict, name: str):
    """The transformers config class of ``raw``'s ``model_type`` (refusing remote code)."""
    from transformers import __version__ as version
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES

    model_type = raw.get("model_type")
    if model_type is None:
        raise PhazeError(f'{name}: no "model_type": not a Hugging Face model config (e.g. "model_type": "llama")')
    if not isinstance(model_type, str):
        raise PhazeError(f'{name}: model_type = {_excerpt_json(model_type)}: expected a string such as "llama"')
    if model_type not in CONFIG_MAPPING_NAMES:
        if "auto_map" in raw:  # its own code on the hub: transformers would need trust_remote_code
            raise PhazeError(
                f"{name}: model_type {_excerpt_json(model_type)} is defined by the model's own code (auto_map), "
                "which needs trust_remote_code: phaze runs no downloaded code; write a MODEL.py for it"
            )
        near = difflib.get_close_matches(model_type, list(CONFIG_MAPPING_NAMES), n=1)
        hint = f" (did you mean {near[0]!r}?)" if near else ""
        raise PhazeError(
            f"{name}: unknown model_type {_excerpt_json(model_type)}: transformers {version} has no such model{hint}"
        )
    return model_type, CONFIG_MAPPING[model_type]


def _check_required(raw: dict, config_class, name: str) -> None:
    """The :data:`_REQUIRED_FIELDS` the config class has, each given in the file (top level or
    a nested config's)."""
    given = set(raw) | {k for v in raw.values() if isinstance(v, dict) for k in v}
    default = config_class()
    aliases = getattr(config_class, "attribute_map", {}) or {}
    missing = []
    for field in _REQUIRED_FIELDS:
        if not hasattr(default, field):
            continue
        names = {field, aliases.get(field, field)} | {k for k, v in aliases.items() if v == field}
        if not names & given:
            missing.append(field)
    if missing:
        raise PhazeError(
            f"{name}: missing {', '.join(missing)} (without {'them' if len(missing) > 1 else 'it'} transformers "
            f"would build its default {config_class.__name__} shape, not this model's)"
        )


#: The size fields that are the sequence length a config.json is traced at (under each name
#: transformers' configs give it): left to the config class's default, the run needs --seq-len.
_SEQUENCE_FIELDS = ("max_position_embeddings", "n_positions", "n_ctx")


def _defaulted_sizes(raw: dict, config_class) -> dict[str, int]:
    """The size fields (:data:`_SIZE_LIMITS`) the file leaves to a default of ``config_class``
    that is a number (LlamaConfig's ``max_position_embeddings=2048``, ``intermediate_size=11008``,
    MixtralConfig's ``num_key_value_heads=8``: some published model's), with that number; not
    those whose default is ``None``, a rule the class applies to the sizes given (GPT-2's
    ``n_inner``: 4 x hidden; Llama's ``num_key_value_heads``: the heads), nor those it does
    not have."""
    import inspect

    given = set(raw) | {k for v in raw.values() if isinstance(v, dict) for k in v}
    aliases = getattr(config_class, "attribute_map", {}) or {}
    try:
        parameters = inspect.signature(config_class.__init__).parameters
    except (TypeError, ValueError):
        return {}
    out = {}
    for field, parameter in parameters.items():
        default = parameter.default
        if field not in _SIZE_LIMITS or isinstance(default, bool) or not isinstance(default, int):
            continue
        names = {field, aliases.get(field, field)} | {k for k, v in aliases.items() if v == field}
        if not names & given:
            out[field] = default
    return out


def _model_class(raw: dict, model_type: str, name: str):
    """The class to build: the head ``architectures`` names (a causal, masked or seq2seq LM), as
    transformers' auto class of that head maps ``model_type``; without ``architectures``, the
    first head of :data:`_HEADS` the model type has."""
    import transformers
    from transformers.models.auto import modeling_auto

    heads = [(what, getattr(modeling_auto, mapping)) for what, mapping in _HEADS]
    archs = raw.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise PhazeError(f"{name}: architectures = {_excerpt_json(archs)}: expected a list of class names")
    if archs:
        arch = archs[0]
        shown = printable(shorten(arch))  # a class name from the file: its control characters escaped
        head = next(((what, m) for what, m in heads if arch in m.values()), None)
        if head is None:
            if getattr(transformers, arch, None) is None and "auto_map" in raw:
                raise PhazeError(
                    f"{name}: architectures names {shown}, the model's own code (auto_map), which needs "
                    "trust_remote_code: phaze runs no downloaded code; write a MODEL.py for it"
                )
            raise PhazeError(
                f"{name}: architectures names {shown}, not a causal, masked or seq2seq language model "
                'that phaze builds from a config.json (remove "architectures" to get the model type\'s LM, '
                "or write a MODEL.py)"
            )
        what, mapping = head
        if model_type not in mapping:
            raise PhazeError(
                f"{name}: model_type {model_type!r} has no {what} class in transformers (architectures names {shown})"
            )
    else:
        found = next(((what, m) for what, m in heads if model_type in m), None)
        if found is None:
            raise PhazeError(
                f"{name}: model_type {model_type!r} has no language-model class in transformers "
                "(causal, masked or seq2seq LM)"
            )
        what, mapping = found
    # By model_type, as transformers' Auto classes pick (an architectures entry of another
    # model type's class would be built on a config it was not written for).
    return getattr(transformers, mapping[model_type])


def _model_name(p: Path) -> str:
    """The model's name: the file's stem, or its directory's name for a file named config.json
    (as a model's checkpoint directory holds it)."""
    if p.stem.lower() == "config" and p.parent.name:
        return printable(p.parent.name)
    return printable(p.stem)


def _check_depth(config, name: str) -> None:
    """A config whose layers alone make more leaf modules than phaze traces
    (:data:`~phaze_ir.frontend.trace.MAX_LEAF_MODULES`; each layer has at least two, its
    attention's and its MLP's linears) is refused before transformers builds it: building
    10,000 layers, even on ``meta``, takes half a minute.  One within it is built and its
    leaves counted exactly when the compilation starts (``trace.check_model_size``)."""
    from phaze_ir.frontend.trace import MAX_LEAF_MODULES

    for field in ("num_hidden_layers", "n_layer", "num_layers"):
        layers = getattr(config, field, None)
        if isinstance(layers, int) and 2 * layers > MAX_LEAF_MODULES:
            raise ModelTooLarge(
                f"{name}: {field} = {layers:,}: at least {2 * layers:,} leaf modules (two linears a layer), more than "
                f"phaze compiles ({MAX_LEAF_MODULES:,}; its compilation grows with them: about half a minute of CPU at "
                "the bound)"
            )


def load_hf_config(path: str | os.PathLike) -> ModelSpec:
    """A Hugging Face ``config.json`` as a model: built by transformers on the meta device with
    SDPA attention where its architecture has it (as the example files build theirs), no
    weights, no downloads, no code of the model's own (``auto_map``).  Sequence length: the
    config's ``max_position_embeddings`` (or ``n_positions``), unless ``--seq-len`` is given.
    Every problem of the file (invalid JSON, an unknown ``model_type``, a missing or absurd
    size) is one line, before transformers builds anything."""
    p = Path(path)
    raw = _read_config_json(p)
    name = p.name
    _check_sizes(raw, name)
    model_type, config_class = _config_class(raw, name)
    model_class = _model_class(raw, model_type, name)  # (no model to build: what is missing is moot)
    _check_required(raw, config_class, name)
    _check_values(raw, name)
    defaulted = _defaulted_sizes(raw, config_class)
    sizes = {f: v for f, v in defaulted.items() if f not in _SEQUENCE_FIELDS}
    if sizes:  # one line for the file, naming every size it leaves to a default
        many = len(sizes) > 1
        warnings.warn(
            f"{name}: no {', '.join(sizes)}: priced at transformers' {config_class.__name__} "
            f"default{'s' if many else ''} {', '.join(f'{v:,}' for v in sizes.values())} (another model's "
            f"size{'s' if many else ''}; give {'them' if many else 'it'} in the file)",
            PhazeWarning,
            stacklevel=2,
        )
    # The sequence length left to a default is no length of this model's: --seq-len gives it.
    unsized = next((f for f in _SEQUENCE_FIELDS if f in defaulted), None)

    # SDPA attention where the architecture has it (transformers' ``_supports_sdpa``), as every
    # example file asks for and PyTorch runs it (flash attention on a GPU); eager otherwise.
    attention = "sdpa" if getattr(model_class, "_supports_sdpa", False) else "eager"

    def config():
        # A new config per model (as an example's config() is): a model may write to its config.
        return config_class.from_dict(copy.deepcopy(raw), attn_implementation=attention)

    try:
        checked = config()
    except Exception as e:  # transformers' own checks of the values (types, rope settings...)
        # Its validators' messages span lines (the validator's name, then the error): one line.
        said = " ".join(_quoted_error(e).split())
        raise PhazeError(f"{name}: transformers refuses the config: {said}") from None
    _check_heads(checked, name)
    _check_rope(raw, checked, name)
    _check_decoder_start(checked, model_class, name)
    seq_len = next(
        (
            v
            for f in ("max_position_embeddings", "n_positions")
            if isinstance(v := getattr(checked, f, None), int) and v > 0
        ),
        None,
    )
    if unsized is not None:
        seq_len = None
        no_length = (
            f"{name}: the config gives no {unsized} (transformers' {config_class.__name__} default would be "
            f"{defaulted[unsized]:,}): give it in the file, or --seq-len"
        )
    else:
        no_length = f"{name}: the config gives no max_position_embeddings: give --seq-len"

    def get_model():
        _check_depth(checked, name)
        return model_class(config())

    def get_inputs(micro_batch_size: int, seq_len: int | None = seq_len):
        import torch

        if seq_len is None:
            raise PhazeError(no_length)
        ids = torch.zeros(micro_batch_size, seq_len, dtype=torch.long)
        return {"input_ids": ids, "labels": ids}

    return ModelSpec(
        path=p.resolve(),
        name=_model_name(p.resolve()),
        get_model=get_model,
        get_inputs=get_inputs,
        seq_len=seq_len,
        loss_fn=None,
        takes_seq_len=True,
        no_seq_len=no_length if seq_len is None else None,
    )


def _check_heads(config, name: str) -> None:
    """Heads that split the hidden size and key/value heads that split the heads (the model
    would fail, or silently round, deep in the trace otherwise)."""
    hidden = getattr(config, "hidden_size", None)
    heads = getattr(config, "num_attention_heads", None)
    kv = getattr(config, "num_key_value_heads", None)
    if not isinstance(hidden, int) or not isinstance(heads, int) or heads <= 0:
        return
    if getattr(config, "head_dim", None) is None and hidden % heads:
        raise PhazeError(f"{name}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if isinstance(kv, int) and kv > 0 and heads % kv:
        raise PhazeError(f"{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")


def _check_decoder_start(config, model_class, name: str) -> None:
    """A seq2seq LM whose code begins its decoder's inputs with ``self.config.decoder_start_token_id``
    (the labels shifted right: transformers 5.x ``models/t5/modeling_t5.py`` ``_shift_right``,
    ``models/bart/modeling_bart.py`` ``shift_tokens_right``) on a config that gives none is refused,
    naming the key, before the trace: transformers' T5Config has no such default, so the model
    fails only inside the trace (an ``AttributeError``, or ``ValueError: ... has to be defined``)."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES

    if model_class.__name__ not in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.values():
        return
    start, vocab = getattr(config, "decoder_start_token_id", None), getattr(config, "vocab_size", None)
    module = sys.modules.get(model_class.__module__)
    try:
        source = inspect.getsource(module) if module is not None else ""
    except (OSError, TypeError):
        return  # no source to read: the trace says what it finds
    if "self.config.decoder_start_token_id" not in source:
        return
    if start is None:
        raise PhazeError(
            f"{name}: no decoder_start_token_id: {model_class.__name__} begins its decoder's inputs (the labels "
            "shifted right) with it; give it in the file (T5's published configs give 0, their pad token)"
        )
    if isinstance(vocab, int) and (not isinstance(start, int) or isinstance(start, bool) or not 0 <= start < vocab):
        raise PhazeError(
            f"{name}: decoder_start_token_id = {_excerpt_json(start)}: expected a token of the vocabulary "
            f"(0 to {vocab - 1}), which {model_class.__name__} begins its decoder's inputs with"
        )


def _check_rope(raw: dict, config, name: str) -> None:
    """A RoPE scaling type transformers has no function for (``rope_scaling`` or
    ``rope_parameters``: ``{"rope_type": "x"}``) is refused, naming the key: transformers takes
    the config and fails only when it builds the model (a ``KeyError`` deep in the rotary
    embedding, after the sweep has started)."""
    from transformers import __version__ as version
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for key in ("rope_scaling", "rope_parameters"):
        rope = getattr(config, key, None)
        if not isinstance(rope, dict):
            continue
        kind = rope.get("rope_type", rope.get("type"))
        if kind is None or kind == "default" or kind in ROPE_INIT_FUNCTIONS:
            continue
        given = key if key in raw else next((k for k in ("rope_scaling", "rope_parameters") if k in raw), key)
        known = ", ".join(["default", *sorted(ROPE_INIT_FUNCTIONS)])
        raise PhazeError(
            f"{name}: {given}: rope_type {_excerpt_json(kind)}: transformers {version} has no such RoPE scaling "
            f"(it knows {known})"
        )


#: Fields that are a positive number: a norm's epsilon (a negative one takes the root of a
#: negative variance), RoPE's base (a zero or negative one gives NaN frequencies).
_POSITIVE_NUMBERS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_eps", "rope_theta")
#: Fields that name an activation (transformers' ``ACT2FN``, transformers/activations.py).
_ACTIVATIONS = ("hidden_act", "activation_function", "hidden_activation")


def _check_values(raw: dict, name: str) -> None:
    """Values transformers takes but cannot build a model from, or builds a different one with,
    refused naming the key (also in a nested config such as ``text_config``): a norm epsilon or a
    RoPE base that is not a positive number (a string fails deep in the rotary embedding), a RoPE
    scaling ``factor`` below 1 (transformers' own rule, which it only logs,
    modeling_rope_utils.py), an activation it has no function for (a ``KeyError`` at build), a
    ``pad_token_id`` outside the vocabulary (an ``AssertionError`` in ``nn.Embedding``)."""
    from transformers.activations import ACT2FN

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)

    for key, value in raw.items():
        if isinstance(value, dict):
            if key in ("rope_scaling", "rope_parameters"):
                factor = value.get("factor")
                if factor is not None and not (number(factor) and factor >= 1):
                    raise PhazeError(f"{name}: {key}: factor = {_excerpt_json(factor)}: expected a number >= 1")
                _check_values({k: v for k, v in value.items() if k == "rope_theta"}, f"{name}: {key}")
            else:
                _check_values(value, f"{name}: {key}")
        elif key in _POSITIVE_NUMBERS and value is not None and not (number(value) and value > 0):
            raise PhazeError(f"{name}: {key} = {_excerpt_json(value)}: expected a positive number")
        elif key in _ACTIVATIONS and isinstance(value, str) and value not in ACT2FN:
            near = difflib.get_close_matches(value, list(ACT2FN), n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise PhazeError(f"{name}: {key} = {_excerpt_json(value)}: transformers has no such activation{hint}")
    experts = next((raw[k] for k in ("num_local_experts", "num_experts", "n_routed_experts") if k in raw), None)
    top_k = raw.get("num_experts_per_tok")
    if isinstance(experts, int) and isinstance(top_k, int) and not 1 <= top_k <= experts:
        raise PhazeError(f"{name}: num_experts_per_tok = {top_k}: expected 1 to the {experts} experts")
    window = raw.get("sliding_window")
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise PhazeError(f"{name}: sliding_window = {_excerpt_json(window)}: expected a positive integer or null")
    pad, vocab = raw.get("pad_token_id"), raw.get("vocab_size")
    if isinstance(pad, int) and not isinstance(pad, bool) and isinstance(vocab, int) and not 0 <= pad < vocab:
        raise PhazeError(f"{name}: pad_token_id = {pad}: expected a token of the vocabulary (0 to {vocab - 1}) or null")


@functools.cache
def _resolved(file: str) -> Path:
    """``Path(file).resolve()``, once per file name: both scans below resolve every module of
    ``sys.modules`` (thousands with torch): 0.21 s of every model load, 0.07 s with this."""
    return Path(file).resolve()


@functools.cache
def _installed_roots() -> tuple[Path, ...]:
    """Where code that is not the user's lives: the standard library, the installed packages
    and phaze's own packages (the cache keys on those by version and source digest); once per
    process (the interpreter's paths and phaze's place do not move while it runs)."""
    paths = sysconfig.get_paths()
    kinds = ("stdlib", "platstdlib", "purelib", "platlib", "scripts")
    roots = {Path(paths[k]).resolve() for k in kinds if k in paths}
    phaze_root = Path(__file__).resolve().parents[2]
    roots |= {phaze_root / pkg for pkg in ("phaze_ir", "passes", "phaze")}
    return tuple(sorted(roots))


@functools.cache
def _installed(path: Path) -> bool:
    """Whether the resolved ``path`` lies under one of :func:`_installed_roots`, once per path:
    both scans below ask it of every module of ``sys.modules`` (thousands with torch) at every
    model load, and the search's settings load the model file once per micro-batch and
    context-parallel degree (pathlib's ``is_relative_to`` was two thirds of a load)."""
    return any(_within(path, r) for r in _installed_roots())


def _within(path: Path, directory: Path) -> bool:
    """``path.is_relative_to(directory)`` for two resolved absolute paths, by their text (what
    pathlib parses again at every call)."""
    p, d = str(path), str(directory)
    return p == d or p.startswith(d if d.endswith(os.sep) else d + os.sep)


class HardExit(SystemExit):
    """``os._exit(status)`` called by the user's code while phaze runs it: raised in its place
    (:func:`hard_exit_refused`), so that it is said as a ``sys.exit`` is."""

    def __str__(self) -> str:
        return f"os._exit({self.code!r})"


def exit_call(e: SystemExit) -> str:
    """The user's call that raised ``e``, as they wrote it: ``sys.exit(3)``, ``os._exit(0)``."""
    return f"{'os._exit' if isinstance(e, HardExit) else 'sys.exit'}({e.code!r})"


def failure(e: BaseException) -> str:
    """What the user's function raised, for a one-line error: ``ValueError: bad``, or the
    ``os._exit(0)`` it called."""
    return exit_call(e) if isinstance(e, HardExit) else f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def hard_exit_refused() -> Iterator[None]:
    """While the block runs the user's code (the model file's import, ``get_model``,
    ``get_inputs``): ``os._exit`` raises :class:`HardExit` instead of ending the process.  The
    real one ends it at once, without output, cleanup or phaze's exit status: a tool that loads
    such a file would exit 0 having written nothing.  ``os._exit`` is looked up on the module at
    each call, so replacing the attribute for the block covers the user's ``os._exit(n)``; it is
    put back after (phaze's own exits and its worker processes' are untouched outside it)."""

    def refused(status: int) -> None:
        raise HardExit(status)

    real = os._exit
    os._exit = refused  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit = real


@contextlib.contextmanager
def _importing_beside(directory: Path) -> Iterator[None]:
    """While the block imports a model file from ``directory``: its helpers beside it are found
    (``directory`` first on ``sys.path``) and read as they are on disk now, not as an earlier
    model file of this process imported them (those under ``directory`` are dropped from
    ``sys.modules`` first, :func:`_forget_modules_under`).  The entry it put on ``sys.path`` is
    taken off after it (one the model file added itself stays: its functions may need it).

    What it changes for good, and why: Python's imports are the process's (``sys.modules``),
    and the helpers the model file imported stay there, as any import's do: the model's
    classes live in them, and its functions may import them again when called (``get_model``
    after the directory has left ``sys.path``).  So loading a model never changes the answer
    about another: a helper is always the file on disk now (``tests/test_no_hidden_channels.py``)."""
    _forget_modules_under(directory)
    sys.path.insert(0, str(directory))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):  # the model file took it off itself
            sys.path.remove(str(directory))


def _forget_modules_under(directory: Path) -> None:
    """Drop the user's modules loaded from ``directory`` (or below) from ``sys.modules``, so that a
    model file importing them gets them as they are now (phaze's own modules are never dropped)."""
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and file:
            path = _resolved(file)
            if _within(path, directory) and not _installed(path):
                del sys.modules[name]


def user_sources() -> list[Path]:
    """The files of the modules loaded in this process that are the user's: neither the standard
    library, nor an installed package, nor phaze.  After a model file is imported, these include
    every helper it imported at module level (directly or not, loaded now or before); a superset
    at worst (another model file's helpers), which only makes a cached answer recomputed more
    often.  Modules imported inside a function (``get_model``) are not loaded yet and not seen."""
    out = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not isinstance(file, str) or not file:
            continue
        path = _resolved(file)
        if not _installed(path) and path.is_file():
            out.add(path)
    return sorted(out)
