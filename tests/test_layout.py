"""tests/ mirrors qsync_opt/: every package folder has a test folder of the same relative path, holding
its tests, and every test folder is either such a mirror or one of the suites that cut across packages.
Tests of the package's top-level modules sit in tests/ itself, or in a folder named after the module when they
need several files (tests/jobs/: the kinds registry and the golden plans of every example)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "qsync_opt"
TESTS = ROOT / "tests"
CROSS_CUTTING = {"e2e", "faults", "benchmarks"}
"""Test folders that check several packages together (whole runs, injected faults, the benchmark scripts)."""


def package_folders() -> list[Path]:
    """Every folder under qsync_opt/ that is a Python package, relative to qsync_opt/ (data folders excluded)."""
    return sorted(p.parent.relative_to(PACKAGE) for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def test_every_package_folder_has_a_test_folder_of_the_same_path():
    missing = [str(rel) for rel in package_folders() if not any((TESTS / rel).glob("test_*.py"))]
    assert not missing, f"package folders without tests/<same path>/test_*.py: {missing}"


def test_every_test_folder_mirrors_a_package_folder_or_cuts_across():
    mirrors = {str(rel) for rel in package_folders()} | {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    stray = sorted(
        str(rel)
        for d in TESTS.rglob("*")
        if d.is_dir() and any(d.glob("*.py"))
        for rel in [d.relative_to(TESTS)]
        if rel.parts[0] not in CROSS_CUTTING and str(rel) not in mirrors
    )
    assert not stray, f"test folders that mirror no package folder of qsync_opt/: {stray}"
