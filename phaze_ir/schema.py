"""The schema of phaze's TOML files, made with pydantic from the fields they are declared with.

A file's tables are frozen dataclasses whose fields carry their validation kind, documentation
and plausibility bound (:func:`phaze_ir.hardware._spec`): the hardware description's
(:class:`~phaze_ir.hardware.Accelerator` and its tables) and the architecture space's
(``phaze/search/arch_space.py``).  From that one declaration per field, a :class:`Schema`
builds

* a pydantic(-core) validator of the file's structure and types: unknown keys, missing keys and
  tables, wrong types, numbers out of range; and
* a JSON Schema (draft 2020-12, pydantic's generator) for editors: Taplo / Even Better TOML read it
  through a ``#:schema`` comment at the top of the file (README, docs/design.md §4.1).

pydantic's messages are not phaze's: of its errors, :meth:`Schema.check` takes the first in the
order in which the file is read (a table's unknown keys, then its fields in their declared order,
depth first) and has the file's own wording (``Wording``) say it, one line naming the file, the
key path, the value and what was expected, as before pydantic.  A value's refusal is worded by the
field's own check (the one the dataclass constructors run), so a chip built in Python and one read
from TOML are refused in the same words; where that check accepts what the schema refused (a
numpy scalar from Python, which TOML cannot hold), the value stands.  What needs more than one
field (a network's levels, a chip's peak FLOP/s) is checked after the schema, by the file's code.

pydantic is imported when a file is first checked, not with :mod:`phaze_ir.hardware`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

__all__ = ["Schema", "Wording", "number", "unit_of", "JSON_SCHEMA_DIALECT"]

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

#: The unit of a key, from its name's suffix (the convention of docs/design.md §4.1: every
#: quantity carries its unit in its name), longest suffix first.
_UNIT_SUFFIXES = (
    ("_kgco2e_per_mm2", "kg CO2e/mm^2"),
    ("_kgco2e_per_byte", "kg CO2e/B"),
    ("_kgco2e_per_j", "kg CO2e/J"),
    ("_usd_per_byte", "USD/B"),
    ("_j_per_byte", "J/B"),
    ("_w_per_mm2", "W/mm^2"),
    ("_w_per_device", "W"),
    ("_per_mm2", "1/mm^2"),
    ("_kgco2e", "kg CO2e"),
    ("_flops", "FLOP/s"),
    ("_bytes", "bytes"),
    ("_Bps", "bytes/s"),
    ("_hz", "Hz"),
    ("_usd", "USD"),
    ("_mm2", "mm^2"),
    ("_MiB", "MiB"),
    ("_GiB", "GiB"),
    ("_mm", "mm"),
    ("_s", "s"),
    ("_w", "W"),
    ("_j", "J"),
)


def unit_of(name: str) -> str | None:
    """The unit a key's name carries (``bandwidth_Bps``: ``bytes/s``), or None."""
    if name == "bytes":
        return "bytes"
    return next((unit for suffix, unit in _UNIT_SUFFIXES if name.endswith(suffix)), None)


def number(*, integer: bool = False, gt: float | None = None, ge: float | None = None, le: float | None = None) -> Any:
    """A TOML number's core schema: an integer or a float (never a boolean, never a string),
    finite, an integral value where ``integer`` (TOML's ``32e9`` is an integer of bytes)."""
    from pydantic_core import core_schema as cs

    return cs.float_schema(strict=True, allow_inf_nan=False, gt=gt, ge=ge, le=le, multiple_of=1 if integer else None)


@dataclasses.dataclass(frozen=True)
class Wording:
    """How a file says what is wrong (its messages predate the schema and tests pin them).

    Each returns the exception to raise.  ``path`` is the key path as the messages write it
    (``network[1].group_size``, the prefix included)."""

    #: (key, table class, the table's path prefix ``"tensor_cores."``, source)
    unknown: Callable[[Any, type, str, str], Exception]
    #: (field, path, source)
    missing: Callable[[dataclasses.Field, str, str], Exception]
    #: (table class or None for the file, path, value, source): a table that is not one
    not_table: Callable[[type, str, Any, str], Exception]
    #: (field, path, value, source): an array of tables that is not one, or is empty
    not_list: Callable[[dataclasses.Field, str, Any, str], Exception]
    #: (field, path, value, source): the field's own check; None where it accepts the value
    value: Callable[[dataclasses.Field, str, Any, str], Exception | None]


class Schema:
    """The schema of one kind of file, built from its root dataclass.

    ``kind_schema(field)``: the core schema of a field that is a value (not a table);
    ``nested(field)``: ``("table", cls)``, ``("list", cls)`` (an array of tables, at least one),
    ``("open", cls)`` (a table whose keys beyond its declared fields are checked elsewhere) or
    ``None`` (a value)."""

    def __init__(
        self,
        root: type,
        *,
        kind_schema: Callable[[dataclasses.Field], Any],
        nested: Callable[[dataclasses.Field], tuple[str, type] | None],
        wording: Wording,
        title: str,
        description: str,
        extend: Callable[[dict[str, Any]], None] | None = None,
    ):
        self.root = root
        self.kind_schema = kind_schema
        self.nested = nested
        self.wording = wording
        self.title = title
        self.description = description
        self.extend = extend
        self._validator: Any = None

    # -- the core schema ------------------------------------------------------------------------

    def core_schema(self, *, partial: bool = False) -> Any:
        """The pydantic-core schema of the file (``partial``: every key optional, the tables too:
        what overrides a description written elsewhere)."""
        from pydantic_core import core_schema as cs

        defs: dict[str, Any] = {}
        suffix = "Override" if partial else ""

        def table(cls: type, open_: bool = False) -> Any:
            ref = cls.__name__.lstrip("_") + suffix
            if ref not in defs:
                defs[ref] = None  # (a table met again while being built: no table nests itself)
                fields: dict[str, Any] = {}
                for f in dataclasses.fields(cls):
                    sub = self.nested(f)
                    if sub is None:
                        schema = self.kind_schema(f)
                    elif sub[0] == "list":
                        schema = cs.list_schema(table(sub[1]), min_length=1)
                    else:
                        schema = table(sub[1], open_=sub[0] == "open")
                    required = not partial and f.default is dataclasses.MISSING
                    fields[f.name] = cs.typed_dict_field(
                        schema, required=required, metadata={"pydantic_js_updates": _field_json(f)}
                    )
                doc = (cls.__doc__ or "").strip().split("\n\n")[0]
                defs[ref] = cs.typed_dict_schema(
                    fields,
                    extra_behavior="allow" if open_ else "forbid",
                    ref=ref,
                    metadata={"pydantic_js_updates": {"title": ref, "description": " ".join(doc.split())}},
                )
            return cs.definition_reference_schema(ref)

        root = table(self.root)
        return cs.definitions_schema(root, [d for d in defs.values() if d is not None])

    # -- validation -----------------------------------------------------------------------------

    def check(self, data: Any, source: str, prefix: str = "") -> None:
        """Validate ``data`` (the file as a plain dict); raise the first refusal in the file's
        words.  ``prefix``: prepended to key paths (a description nested in a larger file)."""
        if self._validator is None:
            from pydantic_core import SchemaValidator

            self._validator = SchemaValidator(self.core_schema())
        from pydantic_core import ValidationError

        try:
            self._validator.validate_python(data)
        except ValidationError as exc:
            located = sorted((self._locate(data, err["loc"], prefix) for err in exc.errors()), key=lambda x: x[0])
            for _, refuse in located:
                error = refuse(source)
                if error is not None:
                    raise error from None

    def _locate(self, data: Any, loc: tuple[Any, ...], prefix: str) -> tuple[list[tuple[int, int]], Callable]:
        """Where an error of pydantic's lies in the order the file is read (its sort key), and
        what words its refusal: the innermost table, array or value of ``loc`` in the file."""
        w = self.wording
        order: list[tuple[int, int]] = []
        node: Any = self.root  # a table class, ("list", field, class), or a value's field
        value = data
        path = prefix.rstrip(".")
        for part in loc:
            if isinstance(node, type):
                if not isinstance(value, dict):
                    break
                names = [f.name for f in dataclasses.fields(node)]
                if part not in names:  # an unknown key: a table's are refused before its fields
                    keys = list(value)
                    order.append((0, keys.index(part) if part in keys else len(keys)))
                    return order, _bind(w.unknown, part, node, (path + ".") if path else "")
                f = dataclasses.fields(node)[names.index(part)]
                order.append((1, names.index(part)))
                path = f"{path}.{part}" if path else part
                if part not in value:
                    return order, _bind(w.missing, f, path)
                value = value[part]
                sub = self.nested(f)
                node = f if sub is None else (sub[1] if sub[0] != "list" else ("list", f, sub[1]))
            elif isinstance(node, tuple):  # an array of tables
                if not isinstance(value, (list, tuple)) or not value or not isinstance(part, int):
                    break
                order.append((1, part))
                path = f"{path}[{part}]"
                value = value[part]
                node = node[2]
            else:  # a value: what pydantic adds below it (a union's member, an array index)
                break
        if isinstance(node, type):
            return order, _bind(w.not_table, node if node is not self.root else None, path, value)
        if isinstance(node, tuple):
            return order, _bind(w.not_list, node[1], path, value)
        return order, _bind(w.value, node, path, value)

    # -- JSON Schema ----------------------------------------------------------------------------

    def json_schema(self) -> dict[str, Any]:
        """The JSON Schema of the file, for editors (pydantic's generator, draft 2020-12)."""
        from pydantic.json_schema import GenerateJsonSchema

        schema = GenerateJsonSchema().generate(self.core_schema())
        out = {"$schema": JSON_SCHEMA_DIALECT, "title": self.title, "description": self.description}
        out |= {k: v for k, v in schema.items() if k not in ("title", "description")}
        if self.extend is not None:
            self.extend(out)
        return out

    def json_schema_text(self) -> str:
        """:meth:`json_schema` as the committed ``docs/schema/*.schema.json`` files hold it."""
        return json.dumps(self.json_schema(), indent=2, ensure_ascii=False) + "\n"


def _bind(fn: Callable, *args: Any) -> Callable[[str], Exception | None]:
    return lambda source: fn(*args, source)


def _field_json(f: dataclasses.Field) -> dict[str, Any]:
    """What the JSON Schema says of a field beyond its type: its meaning, unit and bound."""
    doc = f.metadata.get("doc", "")
    bound = f.metadata.get("at_most")
    out: dict[str, Any] = {"title": f.name}
    if bound is not None:
        out["description"] = f"{doc}; at most {bound.text()} ({bound.why})"
        out["x-bound"] = bound.why
    else:
        out["description"] = doc
    unit = unit_of(f.name)
    if unit is not None:
        out["x-unit"] = unit
    if f.default is not dataclasses.MISSING and f.default is not None:
        out["default"] = f.default
    return out
