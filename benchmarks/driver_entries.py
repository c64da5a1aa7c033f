"""How many times ``phazec --hw``'s answer enters ``phaze/driver.py`` (issue 43, item 2: "following
the model path of ``hw_answer.answer``, the data enters ``driver.py`` N times"; target <= 3).

Every function of ``phaze.driver`` (module functions and the methods of its classes) is wrapped
before the question is asked; a call is an *entry* when no driver function is running already
(the driver calling itself is one entry).  Only the calls made while ``hw_answer.answer`` runs
are counted: what phazec itself does before and after (its flags, its messages) is not the
model's path.  Asked of an empty cache (as phazec's first question: a cached answer enters the
driver no more than to check the question), or of none (``--no-cache``).  Printed: the entries
in order, with the function entered and the module that called it; their count; and the
distinct places the path enters (function entered, calling module), the count that does not
grow with the sweep's points.

GPT-2 XL on 8 a100s (the defaults), empty cache or none: 2 entries at 2 places
(``check_question`` from ``phaze.hw_answer``: the options, the chip loaded once, the power cap;
``start_compilation`` from ``phaze.search.sweep``; the settings price every point).  A question of one
point (``--micro-batch 1 --tp 1``) is compiled through the pipeline's sweep: 3 entries
(``compile_model`` from ``phaze.search.sweep`` too).  Before the driver was split (pipeline, points
and the plan's output in their own modules), the defaults made 114 entries at 18 places (an
empty cache), 108 at 12 (none).

    python benchmarks/driver_entries.py [--model examples/gpt2_xl.py] [--hw a100] [--devices 8]
                                        [--micro-batch N] [--tp N] [--no-cache]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Entries:
    """The entries into the driver while :attr:`counting`."""

    def __init__(self) -> None:
        self.depth = 0
        self.counting = False
        self.calls: list[tuple[str, str]] = []  # (the function entered, the caller's module)

    def wrap(self, name: str, fn: Callable) -> Callable:
        @functools.wraps(fn)
        def entered(*args: Any, **kwargs: Any) -> Any:
            if self.depth == 0 and self.counting:
                caller = sys._getframe(1).f_globals.get("__name__", "?")
                self.calls.append((name, caller))
            self.depth += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.depth -= 1

        return entered


def instrument(entries: Entries) -> None:
    """Wrap every function and method defined in ``phaze.driver``."""
    from phaze import driver

    for name, value in list(vars(driver).items()):
        if inspect.isfunction(value) and value.__module__ == driver.__name__:
            setattr(driver, name, entries.wrap(name, value))
        elif inspect.isclass(value) and value.__module__ == driver.__name__:
            for attr, member in list(vars(value).items()):
                if inspect.isfunction(member) and not attr.startswith("__"):
                    setattr(value, attr, entries.wrap(f"{name}.{attr}", member))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=str(ROOT / "examples" / "gpt2_xl.py"))
    ap.add_argument("--hw", default="a100")
    ap.add_argument("--devices", type=int, default=8)
    ap.add_argument("--micro-batch", type=int, help="one micro-batch size (default: the sweep's)")
    ap.add_argument("--tp", type=int, help="one TP width (default: the sweep's)")
    ap.add_argument("--no-cache", action="store_true", help="ask without a cache")
    args = ap.parse_args(argv)

    entries = Entries()
    instrument(entries)  # before anything imports a driver function by name
    from phaze import hw_answer
    from phaze.options import Options

    answer = hw_answer.answer

    def counted(*a: Any, **k: Any) -> Any:
        entries.counting = True
        try:
            return answer(*a, **k)
        finally:
            entries.counting = False

    opts = Options(hw=args.hw, devices=args.devices)
    if args.micro_batch is not None:
        opts = replace(opts, micro_batches=(args.micro_batch,))
    if args.tp is not None:
        opts = replace(opts, tp_widths=(args.tp,))
    with tempfile.TemporaryDirectory() as cache:
        result = counted(args.model, opts, None if args.no_cache else cache, lambda msg: None)
    for k, (name, caller) in enumerate(entries.calls, 1):
        print(f"{k:3d}. driver.{name}  (from {caller})")
    sites = sorted(set(entries.calls), key=entries.calls.index)
    print(f"{len(entries.calls)} entries into phaze/driver.py, at {len(sites)} places:")
    for name, caller in sites:
        print(f"  driver.{name} from {caller} ({entries.calls.count((name, caller))}x)")
    print(f"the plan: {len(result.text)} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
