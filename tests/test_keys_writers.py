"""``phaze_ir/keys.py``'s one-writer rule (issue 56 item 4), read from the passes' source: each
``phaze.*`` key is set by the one writer ``keys.py`` declares for it, and by no other pass.

Which pass sets which key is read from the AST of ``passes/*.py``: an assignment
``X.attributes[keys.NAME] = ...`` or a call ``keys.put(X, keys.NAME, ...)`` (or through a loop
variable over ``keys.NAME``s), directly
or through a helper of ``passes/cost_view.py``, ``graph_view.py`` or ``how_ops_run.py`` that the pass
calls.
A removal (``attributes.pop``) is not a write: a pass that invalidates another's key drops it,
and the pipeline runs its writer again."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from phaze_ir import keys

PASSES = Path(__file__).resolve().parent.parent / "passes"
#: Modules of passes/ that are not passes: views shared by the passes, and the cache they keep schedules in.
HELPERS = ("cost_view.py", "graph_view.py", "how_ops_run.py", "cache_file.py", "recompute_view.py")

#: keys.py's tuples of keys, by name: the names of their keys.
_TUPLES = {
    n: [next(m for m, k in vars(keys).items() if k is v) for v in t]
    for n, t in vars(keys).items()
    if isinstance(t, tuple) and t and all(isinstance(v, keys.Key) for v in t) and n != "ALL_KEYS"
}


def _key_of(node: ast.AST, loops: dict[str, list[str]]) -> list[str]:
    """The key names a subscript's index stands for: ``keys.NAME``, or a loop variable over them."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "keys":
        return [node.attr]
    if isinstance(node, ast.Name) and node.id in loops:
        return loops[node.id]
    return ["?" + ast.unparse(node)]


def _writes(tree: ast.AST) -> dict[str, set[str]]:
    """Per function (and ``<module>``), the names of the keys it sets."""
    out: dict[str, set[str]] = {}
    for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        loops: dict[str, list[str]] = {}
        for n in ast.walk(fn):
            if isinstance(n, (ast.For, ast.comprehension)) and isinstance(n.target, ast.Name):
                if isinstance(n.iter, (ast.Tuple, ast.List)):
                    names = [k for e in n.iter.elts for k in _key_of(e, {})]
                    if all(not k.startswith("?") for k in names):
                        loops[n.target.id] = names
                elif _key_of(n.iter, {})[0] in _TUPLES:  # a tuple of keys.py (keys.PROVENANCE)
                    loops[n.target.id] = _TUPLES[_key_of(n.iter, {})[0]]
        got = out.setdefault(fn.name, set())
        for n in ast.walk(fn):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target] if isinstance(n, ast.AugAssign) else []
            for t in targets:
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Attribute) and t.value.attr == "attributes":
                    got.update(_key_of(t.slice, loops))
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "keys.put" and len(n.args) >= 2:
                got.update(_key_of(n.args[1], loops))  # keys.put(op, keys.NAME, value): a write
    return out


def _calls(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else "")
    return names


def _pass_name(tree: ast.AST) -> str | None:
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef):
            for s in n.body:
                if (
                    isinstance(s, ast.Assign)
                    and [ast.unparse(t) for t in s.targets] == ["name"]
                    and isinstance(s.value, ast.Constant)
                ):
                    return str(s.value.value)
    return None


def writers() -> dict[str, set[str]]:
    """Each key's name (``keys.NAME``) -> the passes that set it."""
    helper_writes: dict[str, set[str]] = {}
    for h in HELPERS:
        for fn, ks in _writes(ast.parse((PASSES / h).read_text())).items():
            if ks:
                helper_writes[fn] = ks
    out: dict[str, set[str]] = {}
    for path in sorted(PASSES.glob("*.py")):
        if path.name in HELPERS or path.name in ("__init__.py", "solver_options.py"):
            continue
        tree = ast.parse(path.read_text())
        name = _pass_name(tree)
        assert name is not None, f"{path.name}: no pass (a class with name = 'phaze-...')"
        written = set().union(*_writes(tree).values())
        for fn in _calls(tree) & helper_writes.keys():
            written |= helper_writes[fn]
        for k in written:
            out.setdefault(k, set()).add(name)
    return out


def _declared(key: keys.Key) -> list[str]:
    """The writers ``keys.py`` names for the key (a pass, the importer, phazec), first the one."""
    return [w.strip() for w in key.writer.split(" and ")]


def test_every_key_set_by_a_pass_is_a_declared_key():
    names = {n for n, v in vars(keys).items() if isinstance(v, keys.Key)}
    unknown = sorted(k for k in writers() if k not in names)
    assert not unknown, f"passes set attributes not declared in phaze_ir/keys.py: {unknown}"


def test_one_writer_per_key():
    """Each key is set by its declared writer and no other pass (provenance keys aside: a pass
    that creates an op gives it those of the op it stands for)."""
    found = writers()
    problems = []
    for name, passes in sorted(found.items()):
        key = getattr(keys, name)
        if key in keys.PROVENANCE:
            continue
        declared = _declared(key)
        extra = passes - set(declared)
        if extra:
            problems.append(f"{key}: written by {sorted(extra)}, declared {key.writer!r}")
    for key in keys.ALL_KEYS:
        if key not in keys.PROVENANCE and len(_declared(key)) > 1:
            problems.append(f"{key}: declares {len(_declared(key))} writers ({key.writer!r})")
    assert not problems, "\n".join(problems)


def test_the_keys_of_issue_56_have_one_writer():
    """Issue 56 item 4: the keys that had a second writer each have their declared one alone."""
    found = writers()
    for name in ("SEQ_LEN", "MODEL_FLOPS", "WARNINGS", "ATTENTION_FLOPS", "CAUSAL_ATTENTION_FLOPS"):
        assert name not in found, name  # the importer's alone (no pass)
    assert found["LAYERS"] == {"phaze-group-layers"} and found["PLAN"] == {"phaze-place-devices"}
    assert found["TP_REPLICATED"] == {"phaze-shard-tensor-parallel"}
    assert found["LAYER_FLOPS"] == {"phaze-estimate-latency"}


def test_the_latency_keys_have_one_writer():
    """Issue 56: phaze.latency was rescaled by phaze-context-parallel and
    phaze-overlap-tensor-parallel; now phaze-estimate-latency prices how each op runs."""
    found = writers()
    for key in (keys.LATENCY, keys.LAYER_LATENCY, keys.CP_RING):
        assert found[_name(key)] == {"phaze-estimate-latency"}, key


def test_a_second_writer_is_found(tmp_path, monkeypatch):
    """The scan finds a write through a helper and through a loop over keys (it can fail)."""
    source = (PASSES / "overlap_tensor_parallel.py").read_text()
    patched = source.replace(
        "        op.attributes[keys.TP_OVERLAP] = UnitAttr()",
        "        op.attributes[keys.TP_OVERLAP] = UnitAttr()\n        sum_layer_latencies(op)\n"
        "        for k in (keys.PLAN, keys.STAGES):\n            op.attributes[k] = UnitAttr()",
    )
    assert patched != source
    fake = tmp_path / "passes"
    fake.mkdir()
    for p in PASSES.glob("*.py"):
        (fake / p.name).write_text(patched if p.name == "overlap_tensor_parallel.py" else p.read_text())
    monkeypatch.setattr(sys.modules[__name__], "PASSES", fake)
    found = writers()
    for name in ("LAYER_LATENCY", "PLAN", "STAGES"):
        assert "phaze-overlap-tensor-parallel" in found[name]
    with pytest.raises(AssertionError, match="phaze.layer_latency: written by"):
        test_one_writer_per_key()


def _name(key: keys.Key) -> str:
    return next(n for n, v in vars(keys).items() if v is key)
