"""``phaze-opt --help``: phaze's passes first, each with its one-line description and options,
xDSL's after by name; ``--help-pass NAME`` and ``--list-passes`` (all in-process: argparse's
help exits with SystemExit, nothing is spawned)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from xdsl.passes import ModulePass
from xdsl.utils.arg_spec import parse_spec

from passes import ALL_PASSES
from phaze.tools.phaze_opt import main, pass_help, pass_options, pass_summary


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    """phaze-opt's exit status, stdout and stderr for ``argv``."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's --help and the listing actions exit
        code = e.code or 0
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_help_lists_phaze_passes_first_with_descriptions_and_options(capsys):
    code, out, err = _run(capsys, "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: phaze-opt ")
    # xDSL's -p help named every pass in one paragraph: the listing says them now, once each.
    assert "Available passes are" not in out
    phaze_at = out.index("phaze's passes (")
    others_at = out.index("other passes (xDSL's")
    assert phaze_at < others_at
    phaze_part, others_part = out[phaze_at:others_at], out[others_at:]
    for name, factory in ALL_PASSES.items():
        assert f"\n  {name}\n" in phaze_part, name
        assert name not in others_part
        # Its description (wrapped to the terminal's width) follows its name.
        summary = pass_summary(factory())
        assert summary and " ".join(summary.split()[:4]) in " ".join(phaze_part.split())
    # The options, wrapped to the terminal's width too.
    flat = " ".join(phaze_part.split())
    assert 'options: optimizer: str = "adam"' in flat
    assert "devices: int = 1024, global_batch: int = 4096," in flat
    assert "width: int = 1, vocab_multiple: int = 128, sequence_parallel: bool = false" in flat
    # xDSL's passes, by name only, after phaze's.
    assert re.search(r"\bcanonicalize\b", others_part) and re.search(r"\bcse\b", others_part)


def test_list_passes_is_the_help_listing_alone(capsys):
    code, listing, err = _run(capsys, "--list-passes")
    assert code == 0 and err == ""
    _, help_text, _ = _run(capsys, "--help")
    assert listing.startswith("phaze's passes (") and help_text.endswith(listing)


def test_help_pass_prints_the_whole_docstring_and_the_options(capsys):
    code, out, err = _run(capsys, "--help-pass", "phaze-insert-optimizer")
    assert code == 0 and err == ""
    assert out.startswith("phaze-insert-optimizer\n")
    # The docstring's later paragraphs too (the listing gives only the first sentence).
    assert "Requires the gradients of `phazec --emit training`" in " ".join(out.split())
    assert out.endswith('options:\n  optimizer: str = "adam"\n')
    # Any pass, xDSL's too.
    code, out, _ = _run(capsys, "--help-pass", "canonicalize")
    assert code == 0 and "Applies all canonicalization patterns." in out


def test_help_pass_of_no_such_pass_is_one_line_with_the_nearest(capsys):
    code, out, err = _run(capsys, "--help-pass", "phaze-place-device")
    assert code == 1 and out == ""
    assert err == (
        "phaze-opt: error: --help-pass phaze-place-device: no such pass (did you mean phaze-place-devices?); "
        "phaze-opt --list-passes lists them\n"
    )


def test_every_listed_option_default_is_a_spec_the_pass_takes():
    """The listing's ``name: type = default`` are what ``-p 'pass{name=default}'`` accepts, and
    give the pass its defaults back: the listing cannot drift from the passes' fields."""
    for name, factory in ALL_PASSES.items():
        cls = factory()
        options = pass_options(cls)
        if not options:
            continue
        spec = name + "{" + " ".join(o.split(": ", 1)[0] + "=" + o.split(" = ", 1)[1] for o in options) + "}"
        assert cls.from_spec(parse_spec(spec)) == cls(), spec
        listed = {o.split(":", 1)[0] for o in options}
        # Every field is listed but those a command line cannot set (a Python object).
        hidden = {f.name for f in dataclasses.fields(cls) if f.name not in listed and f.init and f.name != "name"}
        assert hidden <= {"cache"}, (name, hidden)


@dataclasses.dataclass(frozen=True)
class _Documented(ModulePass):
    """Give every op a ``phaze.thing`` record (what it holds; see ``a (nested) file``) on the
    module's accelerator: the long details of it, which go on and on about what the record holds
    and why, long enough that the summary is cut at the colon.  A second sentence.

    Options: the rest.
    """

    name = "test-documented"
    must: int
    mode: str = "fast"
    depth: int = 2
    strict: bool = True
    limit: float | int = 1.5
    factory: str = dataclasses.field(default_factory=lambda: "made")
    obj: dict | None = None  # not a spec's type: not listed


@dataclasses.dataclass(frozen=True)
class _Undocumented(ModulePass):
    name = "test-undocumented"


def test_the_summary_is_the_first_sentence_without_asides():
    assert pass_summary(_Documented) == "Give every op a `phaze.thing` record on the module's accelerator."
    # Not ModulePass's docstring, nor the signature dataclasses write for a class without one.
    assert pass_summary(_Undocumented) == ""


def test_options_have_types_and_defaults_as_a_spec_writes_them():
    assert pass_options(_Documented) == [
        "must: int (required)",
        'mode: str = "fast"',
        "depth: int = 2",
        "strict: bool = true",
        "limit: float | int = 1.5",
        'factory: str = "made"',
    ]
    available = {"test-documented": lambda: _Documented, "test-undocumented": lambda: _Undocumented}
    text = pass_help("test-undocumented", available)
    assert text == "test-undocumented\n\n  (no description)\n\nno options\n"
    text = pass_help("test-documented", available)
    assert "  Options: the rest.\n" in text and "  depth: int = 2\n" in text


@pytest.mark.parametrize("flag", ["--version", "-v"])
def test_version(capsys, flag):
    code, out, _ = _run(capsys, flag)
    assert code == 0 and out.startswith("phaze-opt (xdsl ")
