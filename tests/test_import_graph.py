"""The import graph of ``dledger/``, ``plugins/`` and ``spark/``: no circles, no upward imports (issue #26 item 2).

The layers are data in docs/architecture.md ("Layers": one row per layer, top first, each naming
packages and modules in backticks; the most specific name places a module).  This test reads that
table, so the picture and the check cannot drift apart, and walks every import statement of every
module with the AST: module level, inside functions and under ``if TYPE_CHECKING:`` alike (a
circle only typing sees today is a real one the day somebody moves the import).  It fails on

* a circle between modules (``a`` imports ``b`` imports ... imports ``a``);
* an import from a lower layer into a higher one;
* a module of ``dledger/`` that the table does not place, or a name in the table that is no module;
* a plugin or the Spark ingest using a ``dledger`` module docs/api.md does not list.

The broker plugin's own sub-packages have their own direction test (tests/rocketmq).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

from dledger.testing.imports import circles, imported_names, imports_of, shortest_cycle

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
API = ROOT / "docs" / "api.md"

#: The distributions whose imports are walked: (directory, its top-level package).  Files of the
#: directory outside the package (a plugin's tests, twisted drop-ins, setup.py) belong to the
#: package's layer.
DISTRIBUTIONS = (
    ("dledger", "dledger"),
    ("plugins/rocketmq", "dledger_rocketmq"),
    ("plugins/example", "dledger_example"),
    ("spark", "dledger_spark"),
)
#: Packages that may use only dledger's public API (docs/api.md).
API_USERS = ("dledger_rocketmq", "dledger_example", "dledger_spark")


# -- reading the docs -----------------------------------------------------------------------------


def read_layers(text: str) -> list[list[str]]:
    """The "Layers" table of architecture.md: one list of names per layer, top layer first."""
    part = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in part.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[1].startswith("`"):
            continue
        layers.append(re.findall(r"`([\w.]+)`", cells[1]))
    return layers


def read_public_api(text: str) -> dict[str, str]:
    """docs/api.md's table: module name -> the row's text (which names the public submodules)."""
    rows = {}
    for line in text.splitlines():
        m = re.match(r"\| `(dledger[\w.]*)` \|(.*)", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def is_public(module: str, rows: Mapping[str, str]) -> bool:
    """A module is public if docs/api.md lists it, or lists its package and names it in that row."""
    if module in rows:
        return True
    parent, _, name = module.rpartition(".")
    return parent in rows and re.search(rf"`{re.escape(name)}[.`(]", rows[parent]) is not None


# -- walking the code -----------------------------------------------------------------------------


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every Python file walked: dotted module name (or, outside a package, its path) -> file."""
    found: dict[str, Path] = {}
    for directory, package in DISTRIBUTIONS:
        base = root / directory
        pkg_dir = base / package if (base / package).is_dir() else base
        for path in sorted(base.rglob("*.py")):
            if ".venv" in path.parts or "node_modules" in path.parts or "build" in path.parts:
                continue
            if path.is_relative_to(pkg_dir):
                parts = list(path.relative_to(pkg_dir.parent).with_suffix("").parts)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
            else:
                found[path.relative_to(root).as_posix()] = path
    return found


def distribution_package(name: str) -> str:
    """The top-level package whose layer a walked file belongs to (a loose file: its directory's)."""
    if "/" not in name:
        return name.split(".")[0]
    for directory, package in DISTRIBUTIONS:
        if name.startswith(directory + "/"):
            return package
    raise AssertionError(name)


def import_graph(files: Mapping[str, Path]) -> dict[str, set[str]]:
    """module -> the walked modules it imports."""
    dotted = {m for m in files if "/" not in m}
    return {module: imports_of(path.read_text(encoding="utf-8"), module if "/" not in module else "",
                               path.name == "__init__.py", dotted) - {module}
            for module, path in files.items()}


# -- the checks, as pure functions (tested on small graphs below) ---------------------------------


def place(module: str, layers: list[list[str]]) -> tuple[int, str] | None:
    """(height, name) of the most specific table name covering ``module``: height 0 is the bottom layer."""
    best: tuple[int, str] | None = None
    for i, names in enumerate(layers):
        for name in names:
            covers = module == name or ("." in name or name != "dledger") and module.startswith(name + ".")
            if covers and (best is None or len(name) > len(best[1])):
                best = (len(layers) - 1 - i, name)
    return best


def upward_imports(graph: Mapping[str, Iterable[str]], layers: list[list[str]]) -> list[str]:
    """Every import from a module into a module of a higher layer, as a readable line."""
    lines = []
    for module in sorted(graph):
        own = place(distribution_package(module) if "/" in module else module, layers)
        for target in sorted(graph[module]):
            theirs = place(target, layers)
            if own and theirs and theirs[0] > own[0]:
                lines.append(f"{module} ({own[1]}) imports {target} ({theirs[1]}), a higher layer")
    return lines


# -- the tests ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def layers() -> list[list[str]]:
    return read_layers(ARCHITECTURE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def files() -> dict[str, Path]:
    return module_files()


@pytest.fixture(scope="module")
def graph(files) -> dict[str, set[str]]:
    return import_graph(files)


def test_the_layer_table_names_real_modules_once(layers, files):
    names = [name for layer in layers for name in layer]
    assert len(layers) >= 10 and "dledger.codes" in layers[-1] and "dledger.server" in names
    assert len(names) == len(set(names)), "a name appears in two layers of docs/architecture.md"
    missing = [name for name in names if name not in files]
    assert not missing, f"docs/architecture.md's layer table names what is no module: {missing}"


def test_every_dledger_module_has_a_layer(layers, files):
    unplaced = [m for m in files if m.startswith("dledger.") and place(m, layers) is None]
    assert not unplaced, f"place these in docs/architecture.md's layer table: {unplaced}"


def test_no_import_circles(graph):
    assert len(graph) > 200  # the walk found the code
    found = circles(graph)
    assert not found, "import circles (move the piece both need down into its own module):\n" + "\n".join(
        f"{' -> '.join(shortest_cycle(graph, c))} (one of {len(c)} modules in a circle)" for c in found)


def test_no_upward_imports(graph, layers):
    lines = upward_imports(graph, layers)
    assert not lines, "imports against docs/architecture.md's layers:\n" + "\n".join(lines)


def test_plugins_and_spark_use_only_the_public_api(graph):
    rows = read_public_api(API.read_text(encoding="utf-8"))
    assert "dledger.client" in rows and "dledger.interfaces" in rows
    private = sorted(
        f"{module} imports {target}"
        for module, targets in graph.items() if "/" not in module and module.split(".")[0] in API_USERS
        for target in targets if target.split(".")[0] == "dledger" and not is_public(target, rows))
    assert not private, "plugins/spark use modules docs/api.md does not list (document them, or use public ones):\n" + \
        "\n".join(private)


# -- the checks can fail: small graphs with known answers -----------------------------------------


SAMPLE = '''
from __future__ import annotations
from typing import TYPE_CHECKING
import pkg.low
from . import sibling
from .sub import thing
if TYPE_CHECKING:
    from pkg.high import Type

def later():
    from pkg import lazy
'''


def test_the_walk_sees_typing_function_level_and_relative_imports():
    names = {c[0] for c in imported_names(SAMPLE, "pkg.mod", is_package=False)}
    assert {"pkg.low", "pkg.sibling", "pkg.sub.thing", "pkg.high.Type", "pkg.lazy"} <= names


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_circles(graph, expected):
    assert sorted(circles(graph)) == expected


@pytest.mark.parametrize("graph, component, cycle", [
    ({"a": {"b"}, "b": {"a"}}, ["a", "b"], ["a", "b", "a"]),
    ({"a": {"b", "c"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c"], ["a", "c", "a"]),  # the shortest
    ({"a": {"b"}, "b": {"c", "x"}, "c": {"a"}, "x": set()}, ["a", "b", "c"], ["a", "b", "c", "a"]),
])
def test_shortest_cycle(graph, component, cycle):
    assert shortest_cycle(graph, component) == cycle


TOY_LAYERS = [["dledger.top"], ["dledger.mid", "dledger.top.low_part"], ["dledger", "dledger.base"]]


@pytest.mark.parametrize("module, expected", [
    ("dledger.top.x", "dledger.top"),
    ("dledger.top.low_part", "dledger.top.low_part"),
    ("dledger.top.low_part.y", "dledger.top.low_part"),
    ("dledger", "dledger"),
    ("dledger.unknown", None),  # "dledger" places only the package itself
])
def test_place(module, expected):
    found = place(module, TOY_LAYERS)
    assert (found[1] if found else None) == expected


@pytest.mark.parametrize("graph, bad", [
    ({"dledger.top.x": {"dledger.mid.y", "dledger.base"}}, []),
    ({"dledger.mid.y": {"dledger.top.x"}}, ["dledger.mid.y"]),
    ({"dledger.mid.y": {"dledger.top.low_part"}}, []),  # same layer
    ({"dledger.base": {"dledger.mid.y"}}, ["dledger.base"]),
])
def test_upward_imports(graph, bad):
    assert [line.split()[0] for line in upward_imports(graph, TOY_LAYERS)] == bad


def test_is_public():
    rows = {"dledger.election": "`rules` (...), `state.MemberState`", "dledger.client": "..."}
    assert is_public("dledger.client", rows)
    assert is_public("dledger.election.state", rows) and is_public("dledger.election.rules", rows)
    assert not is_public("dledger.election.elector", rows)
    assert not is_public("dledger.ratelog", rows)
