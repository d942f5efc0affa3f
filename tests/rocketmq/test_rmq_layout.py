"""The broker plugin's layout (issue #26): sub-packages mirroring RocketMQ's modules, imports only downward.

The checker is two pure functions over an import graph (``upward_imports`` here, ``circles`` of
:mod:`dledger.testing.imports`) with table tests of their own, then applied to the graph read from the
plugin's sources with ``ast`` (:mod:`dledger.testing.imports`) (every import statement,
``if TYPE_CHECKING:`` blocks and function-level imports included).  docs/rocketmq.md's layer table is the
one place the order is written; this test reads it and checks it against the files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dledger.testing import imports as graph_imports

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "plugins" / "rocketmq" / "dledger_rocketmq"
DOC = ROOT / "docs" / "rocketmq.md"
TOP = "dledger_rocketmq"
#: What the package root may hold besides the sub-packages (the entry point, on top of everything).
ROOT_MODULES = {"plugin"}


# -- the checker, pure -------------------------------------------------------------------------------------

def upward_imports(graph: dict[str, set[str]], layer_of: dict[str, int]) -> list[tuple[str, str]]:
    """Edges (importer, imported) where the imported module sits in a higher layer than its importer."""
    return sorted((a, b) for a, deps in graph.items() for b in deps if layer_of[b] > layer_of[a])


@pytest.mark.parametrize("graph, layers, expected", [
    ({"a": {"b"}, "b": set()}, {"a": 1, "b": 0}, []),
    ({"a": {"b"}, "b": set()}, {"a": 0, "b": 1}, [("a", "b")]),
    ({"a": {"b"}, "b": set()}, {"a": 1, "b": 1}, []),  # within one layer
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, {"a": 0, "b": 2, "c": 1}, [("a", "b"), ("a", "c")]),
])
def test_upward_imports_table(graph, layers, expected):
    assert upward_imports(graph, layers) == expected


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"a"}}, [["a"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}, "e": {"a", "c"}}, [["a", "b"], ["c", "d"]]),
])
def test_cycles_table(graph, expected):
    assert graph_imports.circles(graph) == expected


# -- reading the plugin ------------------------------------------------------------------------------------

def module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def plugin_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, modules: set[str], package_dir: Path = PACKAGE) -> set[str]:
    """The plugin's modules ``path`` imports anywhere in it (``from pkg import mod`` counts as ``pkg.mod``)."""
    return graph_imports.imports_of(path.read_text(encoding="utf-8"), module_name(path, package_dir),
                                    path.name == "__init__.py", modules)


def doc_layers() -> list[tuple[str, list[str]]]:
    """docs/rocketmq.md's layer table: (sub-package or "" for the root, its modules), bottom layer first."""
    rows = re.findall(r"^\| (\d+) \| (`\w+`|\(package root\)) \| (.+) \|$", DOC.read_text(encoding="utf-8"), re.M)
    assert rows, "docs/rocketmq.md has no layer table"
    out = []
    for i, (layer, sub, mods) in enumerate(rows):
        assert int(layer) == i, f"layer numbers in docs/rocketmq.md run 0, 1, ...: row {i} says {layer}"
        out.append((sub.strip("`") if sub.startswith("`") else "", re.findall(r"^`(\w+)`|, `(\w+)`", mods)))
    return [(sub, [a or b for a, b in mods]) for sub, mods in out]


def layer_map() -> dict[str, int]:
    """Every module of the plugin -> its layer, as docs/rocketmq.md says (sub-package __init__ files included)."""
    layers: dict[str, int] = {}
    rows = doc_layers()
    for i, (sub, mods) in enumerate(rows):
        prefix = f"{TOP}.{sub}" if sub else TOP
        if sub:
            layers[prefix] = i
        for mod in mods:
            layers[f"{prefix}.{mod}"] = i
    layers[TOP] = len(rows) - 1
    return layers


def plugin_graph() -> dict[str, set[str]]:
    modules = plugin_modules()
    return {name: imports_of(path, set(modules)) for name, path in modules.items()}


def test_doc_table_names_every_module_once():
    """Each module file is in exactly one row of the layer table, and each row's module exists there."""
    listed = [(sub, mod) for sub, mods in doc_layers() for mod in mods]
    assert len(listed) == len(set(listed))
    assert [sub for sub, _ in doc_layers()][:-1] == ["common", "store", "broker", "client", "namesrv", "tools"]
    assert set(layer_map()) == set(plugin_modules())


def test_only_the_entry_point_at_the_package_root():
    assert {p.stem for p in PACKAGE.glob("*.py")} == ROOT_MODULES | {"__init__"}


def test_imports_read_from_the_sources():
    """The reader sees the kinds of import the plugin uses (so an empty graph cannot pass the checks below)."""
    graph = plugin_graph()
    assert f"{TOP}.common.message" in graph[f"{TOP}.store.commitlog"]      # from pkg.mod import name
    assert f"{TOP}.common.fastjson" in graph[f"{TOP}.store.metadata"]     # from pkg import mod
    assert f"{TOP}.common.acl" in graph[f"{TOP}.store.metadata"]          # inside a function
    assert f"{TOP}.broker.broker" in graph[f"{TOP}.plugin"]


@pytest.mark.parametrize("source", [
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dledger_rocketmq.broker.port import Request\n",
    "def f():\n    from dledger_rocketmq.broker import port\n",
    "import dledger_rocketmq.broker.port as p\n",
    "from ..broker.port import Request\n",
])
def test_every_kind_of_import_is_read(tmp_path, source):
    """An import under ``if TYPE_CHECKING:``, in a function, aliased or relative is read like any other."""
    (tmp_path / TOP / "common").mkdir(parents=True)
    path = tmp_path / TOP / "common" / "x.py"
    path.write_text(source)
    modules = {f"{TOP}.common.x", f"{TOP}.broker", f"{TOP}.broker.port"}
    assert imports_of(path, modules, tmp_path / TOP) == {f"{TOP}.broker.port"}


def test_imports_only_run_downward():
    assert upward_imports(plugin_graph(), layer_map()) == []


def test_no_import_circles():
    assert graph_imports.circles(plugin_graph()) == []
