"""``liger_core.startup_hook``: the post-import finder the plugins' start-up hooks register with (each
plugin's own tests check its table of watched modules, as installed)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from liger_core import startup_hook

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def registry(monkeypatch, tmp_path):
    """An empty registry, a finder list restored afterwards, and a package ``probe_pkg`` with modules ``a``
    and ``b`` on sys.path (each records in ``executed`` that its code ran)."""
    monkeypatch.setattr(startup_hook, "_callbacks", {})
    monkeypatch.setattr(startup_hook, "_prefix_callbacks", {})
    monkeypatch.setattr(
        sys, "meta_path", [f for f in sys.meta_path if type(f).__name__ != "PostImportFinder"]
    )
    package = tmp_path / "probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("a", "b"):
        (package / f"{name}.py").write_text(f"executed = True\nNAME = {name!r}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    for name in ("probe_pkg", "probe_pkg.a", "probe_pkg.b"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("probe_pkg", "probe_pkg.a", "probe_pkg.b"):
        sys.modules.pop(name, None)


def test_callback_runs_after_the_module_code_and_the_module_keeps_its_loader(registry):
    seen = []
    startup_hook.when_imported("probe_pkg.a", lambda m: seen.append((m.__name__, m.executed)))
    assert (
        seen == [] and startup_hook.is_watched("probe_pkg.a") and not startup_hook.is_watched("probe_pkg.b")
    )
    module = importlib.import_module("probe_pkg.a")
    assert seen == [("probe_pkg.a", True)]
    assert type(module.__loader__).__name__ == "SourceFileLoader"
    assert module.__spec__.loader is module.__loader__
    importlib.import_module("probe_pkg.b")  # not watched
    assert seen == [("probe_pkg.a", True)]
    assert sum(isinstance(f, startup_hook.PostImportFinder) for f in sys.meta_path) == 1


def test_already_imported_module_gets_its_callback_at_once(registry):
    importlib.import_module("probe_pkg.b")
    seen = []
    startup_hook.when_imported("probe_pkg.b", lambda m: seen.append(m.NAME))
    assert seen == ["b"]


def test_prefix_watches_every_module_under_it_and_registering_twice_is_one_callback(registry):
    seen = []

    def callback(module):
        seen.append(module.__name__)

    importlib.import_module("probe_pkg")
    startup_hook.when_imported("probe_pkg.", callback)
    startup_hook.when_imported("probe_pkg.", callback)
    assert seen == []  # the package itself does not start with "probe_pkg."
    importlib.import_module("probe_pkg.a")
    importlib.import_module("probe_pkg.b")
    assert seen == ["probe_pkg.a", "probe_pkg.b"]
    assert startup_hook.watched() == ["probe_pkg."]
    assert startup_hook.is_watched("probe_pkg.anything") and not startup_hook.is_watched("probe_pkg")


def test_a_module_imported_again_gets_its_callback_again(registry):
    seen = []
    startup_hook.when_imported("probe_pkg.a", lambda m: seen.append(id(m)))
    first = importlib.import_module("probe_pkg.a")
    del sys.modules["probe_pkg.a"]
    second = importlib.import_module("probe_pkg.a")
    assert first is not second and seen == [id(first), id(second)]


def test_a_missing_module_is_left_to_the_other_finders(registry):
    startup_hook.when_imported("probe_pkg.missing", lambda m: pytest.fail("no module, no callback"))
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("probe_pkg.missing")


def test_register_a_table_unless_the_hooks_are_off(registry, monkeypatch):
    seen = []

    def a(module):
        seen.append(module.NAME)

    table = {"probe_pkg.a": a, "probe_pkg.b": lambda m: seen.append(m.NAME * 2)}
    monkeypatch.setenv(startup_hook.ENV_DISABLE, "1")
    assert startup_hook.register(table) is False and not startup_hook.is_registered(table)
    importlib.import_module("probe_pkg.a")
    assert seen == []
    assert startup_hook.register(table, force=True) is True  # probe_pkg.a is imported: its callback now
    assert startup_hook.register(table, force=True) is True  # idempotent
    assert startup_hook.is_registered(table) and not startup_hook.is_registered({"probe_pkg.a": print})
    importlib.import_module("probe_pkg.b")
    assert seen == ["a", "bb"]


@pytest.mark.parametrize(
    "value, off",
    [
        ("", False),
        ("0", False),
        ("false", False),
        (" No ", False),
        ("off", False),
        ("1", True),
        ("yes", True),
    ],
)
def test_disabled_by_the_environment(monkeypatch, value, off):
    monkeypatch.setenv(startup_hook.ENV_DISABLE, value)
    assert startup_hook.disabled() is off


def test_disabled_when_unset(monkeypatch):
    monkeypatch.delenv(startup_hook.ENV_DISABLE, raising=False)
    assert startup_hook.disabled() is False


def test_import_needs_nothing_outside_the_standard_library():
    """It runs at every interpreter start: without site-packages (``-S``) it imports, and loads no torch,
    Triton, transformers, nor any other module of liger_core."""
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); import liger_core.startup_hook; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'transformers') "
        "or m.startswith('liger_core.') and m != 'liger_core.startup_hook'))"
    )
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
