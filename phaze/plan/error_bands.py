"""How far phaze's step time has been from published runs like a plan: the error band of its
regime, which the summary states (docs/design.md §6.10).

The table is ``data/published/error_bands.json``, written by ``python
benchmarks/price_published.py --write-bands`` from the runs of
``data/published/multi_gpu_runs.csv`` priced as they ran (error = priced / measured − 1 of the
step time).  A run's regime, and a plan's, is the tuple of :class:`Regime`: the chip, the
framework style (FSDP: ZeRO-3; else Megatron-style), the precision (FP8 linears or 16-bit), the
sequence length (below 16k tokens or not), context parallelism, compiled kernels
(``--kernels inductor``) and MoE.  A plan gets the band of the runs of exactly its regime; a
regime without a priced run gets none ("no published runs of this regime"): no band is borrowed
from another regime.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path
from typing import Any

#: The table phaze reads (written by benchmarks/price_published.py --write-bands).
BANDS = Path(__file__).resolve().parents[2] / "data" / "published" / "error_bands.json"
#: From this many tokens a sequence is long (the regimes' split).
LONG_SEQUENCE = 16384


@dataclass(frozen=True, order=True)
class Regime:
    """What the error of a priced step is found to depend on."""

    chip: str  #: the accelerator's name (a100, h100)
    style: str  #: fsdp (parameters sharded over DP: ZeRO-3) or megatron
    precision: str  #: fp8 (FP8 linears) or 16-bit
    long_sequence: bool  #: at least LONG_SEQUENCE tokens per sequence
    cp: bool  #: context parallelism
    compile: bool  #: torch.compile's kernels (--kernels inductor)
    moe: bool  #: mixture of experts

    @property
    def key(self) -> str:
        """The regime as one word per dimension: ``h100/megatron/fp8/short/cp/eager/dense``."""
        return "/".join(
            (
                self.chip,
                self.style,
                self.precision,
                "long" if self.long_sequence else "short",
                "cp" if self.cp else "no-cp",
                "compiled" if self.compile else "eager",
                "moe" if self.moe else "dense",
            )
        )

    def words(self) -> str:
        """The regime in words: ``H100 Megatron-style FP8 runs with CP, below 16k tokens``."""
        style = "FSDP" if self.style == "fsdp" else "Megatron-style"
        parts = [self.chip.upper(), style, "FP8" if self.precision == "fp8" else "16-bit"]
        parts += ["compiled"] if self.compile else []
        parts += ["MoE"] if self.moe else []
        tail = [f"{'at least' if self.long_sequence else 'below'} {LONG_SEQUENCE // 1024}k tokens"]
        tail = (["with CP"] if self.cp else []) + tail
        return " ".join(parts) + " runs " + ", ".join(tail)


def regime(chip: str, zero: int, fp8: bool, seq_len: int, cp: int, kernels: str, moe: bool) -> Regime:
    """The regime of a run or plan from its settings."""
    return Regime(
        chip=chip.lower(),
        style="fsdp" if zero == 3 else "megatron",
        precision="fp8" if fp8 else "16-bit",
        long_sequence=seq_len >= LONG_SEQUENCE,
        cp=cp > 1,
        compile=kernels == "inductor",
        moe=moe,
    )


def has_fp8(module) -> bool:
    """Whether a compiled module runs FP8 GEMMs (``--dtype fp8``: the importer's ``f8E4M3FN`` /
    ``f8E5M2`` casts)."""
    from xdsl.dialects.builtin import Float8E4M3FNType, Float8E5M2Type, TensorType

    for op in module.walk():
        for r in op.results:
            t = r.type
            if isinstance(t, TensorType) and isinstance(t.element_type, (Float8E4M3FNType, Float8E5M2Type)):
                return True
    return False


def plan_regime(module, plan: Mapping[str, Any]) -> Regime:
    """The regime of a plan JSON (``plan``) of a compiled ``module``."""
    from phaze_ir import keys

    return regime(
        chip=str(plan["accelerator"]["name"]),
        zero=int(plan["zero"]),
        fp8=has_fp8(module),
        seq_len=keys.sample_seq_len(module),
        cp=int(plan.get("cp") or 1),
        kernels=keys.string_of(module, keys.KERNELS, "ops"),
        moe=int(plan.get("expert_parallel") or 1) > 1 or plan.get("capacity_factor") is not None,
    )


@cache
def _load(path: str) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def table(path: str | Path = BANDS) -> dict[str, Any] | None:
    """The band table (None when the file is absent)."""
    return _load(str(path)) if Path(path).is_file() else None


def band(r: Regime, bands: Mapping[str, Any] | None) -> dict[str, Any]:
    """The band of regime ``r`` in ``bands`` (a table as :func:`table` reads it): the regime, its
    words and, when it has priced runs, their count, p90 and median |error| and mean signed
    error (fractions); ``runs`` 0 when it has none."""
    out: dict[str, Any] = {"regime": r.key, "words": r.words(), **asdict(r)}
    found = (bands or {}).get("regimes", {}).get(r.key)
    if not found or not found.get("priced"):
        return out | {"runs": 0, "refused": int((found or {}).get("refused", 0))}
    keep = ("priced", "refused", "p90_abs_error", "median_abs_error", "mean_error")
    return out | {"runs": int(found["priced"])} | {k: found[k] for k in keep}


def line(b: Mapping[str, Any]) -> str:
    """The summary's line of a band (:func:`band`)."""
    if not b["runs"]:
        return f"expected error: no published runs of this regime ({b['words']})"
    runs = b["runs"]
    mean = b["mean_error"]
    bias = f"{'slower' if mean > 0 else 'faster'} by {abs(mean):.0%} on average"
    refused = f", {b['refused']} more refused" if b.get("refused") else ""
    return (
        f"expected error ±{b['p90_abs_error']:.0%} (p90 |error| of {runs} published {b['words']}; "
        f"median {b['median_abs_error']:.0%}, priced {bias}{refused})"
    )
