"""The search's stages in phaze's cache: a rerun skips every stage whose inputs did not change.

A search (:func:`phaze.search.run.answer`) runs in stages: the model files are imported (for
their names; torch with them), the settings are prepared, each baseline is searched, then the
co-optimized search, the winner is compiled through the IR pipeline and the output is printed.
Each stage's result is an entry of the cache's store (:class:`passes.cache_file.Store`:
``<cache>/<kind>/<key>.json``, plain JSON with its input and content hashes, checked on load:
never code, beside the schedules' ``schedule/`` entries), keyed by a SHA-256 of
:func:`~passes.cache_file.environment_digest` and everything the result depends on:

- ``model``: a model file's bytes -> its name and its *sources* (:mod:`phaze.model_key`).  Every
  other key holds the model's digest: the model file's bytes and its sources' paths and bytes;
- ``settings``: the model's digest, the micro-batch, the TP widths and what tracing reads of the
  options -> the settings prepared (:func:`phaze.search.run.prepare`);
- ``baseline``: the models' digests, the driver's options (their ``repr``), the solver limits, the
  chip searched (the TPUv4-like one; the space and pruning for ``decoupled``) -> the baseline's
  JSON record and the evaluator's counts it cost;
- ``search``: the same on the space, with pruning -> the co-optimized record, the statistics,
  the winner (chip, each model's micro-batch, TP width and throughput), the per-model detail
  and the counts;
- ``plan``: one model's digest, the options at the winner's setting and the winner chip -> its
  plan module as MLIR text;
- ``answer``: all of the above, the baselines and pruning flags and the printed form (generic
  or not) -> the output module's text and the JSON without its wall times.

A rerun with nothing changed reads one ``answer`` entry: no model imported, no worker started,
nothing parsed.  With something changed, each stage whose key did not change is read (a
``plan`` is parsed back: printing and parsing round-trip byte for byte, and its throughput is
checked against the search's again) and the others are computed and kept.  The evaluator's
counts in the JSON are those of the runs that computed each stage (a warm rerun's JSON is the
cold run's, wall times apart); ``search.wall_s`` is the rerun's own.

The environment digest makes every entry belong to the code that made it: phaze's Python
sources, the Rust extension's bytes, Python's version and those of the packages the pipeline's
numbers come from.  An entry that fails a check (its hashes, its version, what its payload must
hold: the checks below) is said in one warning line and computed again; as with the schedules,
an entry rewritten consistently by someone who knows the format is trusted as far as these
checks go.
"""

from __future__ import annotations

from typing import Any

from passes.cache_file import fields, is_int, is_number, need


def check_counts(x: Any, keys: tuple[str, ...]) -> dict[str, int]:
    """The evaluator's counts: ``keys``, each a count >= 0."""
    need(isinstance(x, dict) and list(x) == list(keys), f"the counts {', '.join(keys)}")
    need(all(is_int(v) and v >= 0 for v in x.values()), "counts >= 0")
    return x


_RECORD = (
    "name",
    "throughput_samples_per_s",
    "score",
    "accelerator",
    "dp",
    "pp",
    "tp",
    "micro_batch_size",
    "sequence_parallel",
    "virtual_stages",
    "zero",
    "note",
)


def check_record(x: Any) -> dict:
    """A baseline's record (:func:`phaze.search.run._baseline_record`), as far as the summary
    that ``phazec`` prints reads it."""
    rec = fields(x, _RECORD, "a baseline record")
    need(isinstance(rec["name"], str) and isinstance(rec["note"], str), "a baseline record's name and note")
    need(is_number(rec["throughput_samples_per_s"]) and rec["throughput_samples_per_s"] >= 0, "a throughput >= 0")
    need(is_number(rec["score"]) and rec["score"] >= 0, "a score >= 0")
    degrees = ("dp", "pp", "tp", "micro_batch_size", "virtual_stages", "zero")
    need(all(is_int(rec[k]) and rec[k] >= 0 for k in degrees), "degrees >= 0")
    need(isinstance(rec["sequence_parallel"], bool), "sequence parallelism true or false")
    acc = rec["accelerator"]
    need(acc is None or (isinstance(acc, dict) and isinstance(acc.get("name"), str)), "a chip with a name")
    sp = rec.get("speedup")
    need(sp is None or (is_number(sp) and sp > 0), "a speed-up > 0")
    return rec


def check_stats(x: Any) -> dict:
    """The JSON's ``search`` object (its wall times and counts left out), as far as ``phazec``'s
    summary and the report's statistics read it."""
    st = fields(x, ("architectures", "settings", "pruned", "evaluated", "points", "wall_s", "evaluator"), "statistics")
    need(all(is_int(st[k]) and st[k] >= 0 for k in ("architectures", "settings", "evaluated")), "counts >= 0")
    pruned = st["pruned"]
    need(isinstance(pruned, dict) and all(is_int(v) and v >= 0 for v in pruned.values()), "pruning counts")
    need(isinstance(st["points"], list) and all(isinstance(p, dict) for p in st["points"]), "the points evaluated")
    return st
