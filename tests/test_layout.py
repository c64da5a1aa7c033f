"""The layout's contracts (``[tool.importlinter]`` in pyproject.toml), checked by import-linter
on the real tree: the compiler (``phaze``) imports the passes, the passes import the IR, never
the other way; ``passes/algorithms`` and the cache (``passes/cache_file.py``) import no xDSL; no
pass imports another pass (and that contract names every pass).  A deliberate violation must be
caught, so the check is known to bite."""

from __future__ import annotations

import shutil
import subprocess
import sys

from conftest import ROOT


def _lint_imports(cwd) -> subprocess.CompletedProcess:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_tree_keeps_its_contracts():
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.count("KEPT") == 3 and "BROKEN" not in r.stdout


def test_an_import_against_the_direction_is_caught(tmp_path):
    # A copy of the three packages, with the IR importing a pass: the layers contract breaks.
    for package in ("phaze_ir", "passes", "phaze"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "phaze_ir" / "sneaky.py").write_text("from passes import mark_saved\n")
    (tmp_path / "passes" / "algorithms" / "sneaky.py").write_text("import xdsl.ir\n")
    with open(tmp_path / "passes" / "group_layers.py", "a") as f:
        f.write("from passes.mark_saved import MarkSavedPass\n")
    r = _lint_imports(tmp_path)
    assert r.returncode != 0
    assert "phaze_ir.sneaky -> passes.mark_saved" in r.stdout
    assert "passes.algorithms.sneaky -> xdsl (l.1)" in r.stdout
    assert "passes.group_layers is not allowed to import passes.mark_saved" in r.stdout


#: The modules of passes/ that are not passes: helpers the passes share (they import no pass).
PASS_HELPERS = {
    "passes.cache_file",
    "passes.cost_view",
    "passes.graph_view",
    "passes.how_ops_run",
    "passes.recompute_view",
    "passes.solver_options",
}


def test_every_pass_is_in_the_independence_contract():
    """The "no pass imports another pass" contract names every registered pass, and passes/
    holds nothing else but the registry and the shared helpers (a new pass file must be
    registered, and then the contract must name it)."""
    import tomllib

    from passes import ALL_PASSES

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    (independence,) = [c for c in contracts if c["type"] == "independence"]
    registered = {factory().__module__ for factory in ALL_PASSES.values()}
    files = {f"passes.{p.stem}" for p in (ROOT / "passes").glob("*.py") if p.stem != "__init__"}
    assert sorted(independence["modules"]) == sorted(registered)
    assert files - registered == PASS_HELPERS
    assert registered <= files


def test_every_phaze_key_is_named_through_phaze_ir_keys():
    """No ``phaze.*`` attribute key is spelled out as a string where attributes are read or
    written: each goes through its declaration in phaze_ir/keys.py (one meaning, one writer)."""
    import re

    from phaze_ir import keys

    spelled = re.compile(r"""attributes(?:\.get|\.pop)?[\[(]\s*["']phaze\.|["']phaze\.[a-z_]+["']\s*:""")
    found = []
    for package in ("phaze_ir", "passes", "phaze"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.name == "keys.py":
                continue
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if spelled.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert found == []
    assert len({str(k) for k in keys.ALL_KEYS}) == len(keys.ALL_KEYS)  # no key declared twice


#: Folders that go first on ``sys.path`` while their code runs: a script's own folder (``python
#: benchmarks/gpu/price_train_step.py``), tests/ under pytest, the model folders the tests and
#: phazec's loader put there for a moment.  A module there named like an installed package hides
#: that package from everything imported meanwhile.
SCRIPT_FOLDERS = ("tests", "tests/models", "benchmarks", "benchmarks/gpu", "benchmarks/models", "examples")


def _shadowing(folder, installed: set[str]) -> list[str]:
    """The modules and regular packages of ``folder`` named like one of ``installed`` (a folder
    without ``__init__.py`` is a namespace portion, which an installed package of its name beats)."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.suffix == ".py" and path.stem != "__init__":
            name = path.stem
        elif path.is_dir() and (path / "__init__.py").exists():
            name = path.name
        else:
            continue
        if name in installed:
            found.append(path.name)
    return found


def _installed_top_level() -> set[str]:
    import importlib.metadata

    return set(importlib.metadata.packages_distributions()) | set(sys.stdlib_module_names)


def test_no_script_folder_shadows_an_installed_package():
    # benchmarks/gpu/kernels.py hid Hugging Face's `kernels` (a dependency of transformers 5.25)
    # from transformers wherever that folder was first on sys.path.
    installed = _installed_top_level()
    clashes = {f: _shadowing(ROOT / f, installed) for f in SCRIPT_FOLDERS}
    assert not any(clashes.values()), clashes


def test_the_shadowing_check_bites(tmp_path):
    (tmp_path / "kernels.py").write_text("")
    (tmp_path / "json.py").write_text("")
    (tmp_path / "namespace_only").mkdir()
    (tmp_path / "regular").mkdir()
    (tmp_path / "regular" / "__init__.py").write_text("")
    assert _shadowing(tmp_path, {"kernels", "json", "namespace_only", "regular"}) == [
        "json.py",
        "kernels.py",
        "regular",
    ]
