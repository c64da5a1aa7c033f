"""Make tests/data/megatron_training_flags.txt: the Megatron-LM flags ``phazec --export megatron``
writes, as Megatron-LM's own argument parser defines them.

Megatron-LM's training package (``megatron/training/arguments.py``) is not on PyPI (the
``megatron-core`` wheel ships ``megatron.core`` only), so the test reads this file instead of the
parser. Run against a checkout of https://github.com/NVIDIA/Megatron-LM::

    python tests/data/megatron_training_flags.py PATH/TO/Megatron-LM > tests/data/megatron_training_flags.txt
    python tests/data/megatron_training_flags.py PATH/TO/Megatron-LM --check FILE... --world-size N

``--check`` parses each export file (one argument per line), plus the model flags it lacks
(``--hidden-size``, ``--num-attention-heads``, ``--max-position-embeddings``; ``--num-experts`` and
``--disable-bias-linear`` with expert parallelism or a capacity factor), with Megatron-LM's
parser and runs its ``validate_args`` for ``N`` GPUs (the plan's ``devices_used``) on this machine:
the GPU's architecture is taken as Ampere (``validate_args`` asks the GPU) and
``CUDA_DEVICE_MAX_CONNECTIONS`` is set as Megatron-LM asks a launch to (1 with TP, unset with
Megatron-FSDP).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def megatron_parser(checkout: Path) -> argparse.ArgumentParser:
    sys.path.insert(0, str(checkout))
    if not hasattr(typing, "override"):  # Megatron-LM's training package needs Python 3.12's typing.override
        import typing_extensions

        typing.override = typing_extensions.override  # type: ignore[attr-defined]
    from megatron.training.arguments import add_megatron_arguments

    return add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))


def check(parser: argparse.ArgumentParser, path: Path, world_size: int) -> str:
    """Parse an export file as Megatron-LM does and run its ``validate_args``."""
    import os

    import megatron.training.arguments as arguments

    arguments.get_device_arch_version = lambda: 8  # no GPU here: as on an A100
    lines = path.read_text().splitlines()
    if "--use-megatron-fsdp" in lines:
        os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    else:
        os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    # The model flags an export lacks (one from a model phaze could not read): made-up ones.
    given = {line.partition("=")[0] for line in lines}
    model = [
        flag
        for flag in ("--hidden-size=64", "--num-attention-heads=4", "--max-position-embeddings=4096")
        if flag.partition("=")[0] not in given
    ]
    moe = any(line.startswith(("--expert-model-parallel-size", "--moe-expert-capacity-factor")) for line in lines)
    if moe and "--num-experts" not in given:
        model += ["--num-experts=16", "--disable-bias-linear"]
    ns = parser.parse_args(lines + model)
    ns._is_global_batch_size_explicitly_specified = True
    ns.rank, ns.world_size = 0, world_size
    arguments.validate_args(ns)
    return (
        f"dp {ns.data_parallel_size} tp {ns.tensor_model_parallel_size} pp {ns.pipeline_model_parallel_size} "
        f"vpp {ns.virtual_pipeline_model_parallel_size} sp {ns.sequence_parallel} "
        f"recompute {ns.recompute_granularity}/{ns.recompute_method} dist-opt {ns.use_distributed_optimizer} "
        f"fsdp {ns.use_megatron_fsdp}/{ns.data_parallel_sharding_strategy if ns.use_megatron_fsdp else '-'}"
    )


def describe(action: argparse.Action) -> str:
    kind = type(action).__name__.removeprefix("_").removesuffix("Action").lower()  # store, storetrue, ...
    kind = {"storetrue": "store_true", "storefalse": "store_false"}.get(kind, kind)
    words = [action.dest, kind]
    if kind == "store" and action.type is not None:
        words.append(f"type={getattr(action.type, '__name__', action.type)}")
    if action.choices:
        words.append("choices=" + ",".join(str(c) for c in action.choices))
    return " ".join(words)


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    from phaze.plan.export import MEGATRON_FLAGS

    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("checkout", type=Path)
    cli.add_argument("--check", nargs="+", type=Path, metavar="FILE")
    cli.add_argument("--world-size", type=int, default=1, metavar="N")
    a = cli.parse_args(argv)
    commit = subprocess.run(
        ["git", "-C", str(a.checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    ).stdout.strip()
    parser = megatron_parser(a.checkout)
    if a.check:
        for path in a.check:
            print(f"{path}: validated by Megatron-LM {commit[:12]}: {check(parser, path, a.world_size)}")
        return 0
    actions = parser._option_string_actions
    print("# The Megatron-LM flags `phazec --export megatron` writes, as Megatron-LM's own parser defines")
    print("# them (megatron.training.arguments.add_megatron_arguments): FLAG DEST ACTION [type=T] [choices=A,B].")
    print(f"# source: https://github.com/NVIDIA/Megatron-LM/blob/{commit}/megatron/training/arguments.py")
    print("# made by: python tests/data/megatron_training_flags.py CHECKOUT > tests/data/megatron_training_flags.txt")
    missing = [f for f in MEGATRON_FLAGS if f not in actions]
    for flag in MEGATRON_FLAGS:
        if flag in actions:
            print(f"{flag} {describe(actions[flag])}")
    if missing:
        print(f"Megatron-LM {commit[:12]} has no {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
