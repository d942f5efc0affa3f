"""Import graphs of Python sources, read with ``ast``: for tests that keep a code base's layers (issue #26).

dledger's own tests hold ``dledger/``, ``plugins/`` and ``spark/`` to the layers of docs/architecture.md
(tests/test_import_graph.py) and the broker plugin's sub-packages to docs/rocketmq.md's order
(tests/rocketmq/test_rmq_layout.py) with these functions; a plugin author can hold a package to the same
rules.  Every import statement counts -- module level, inside functions, under ``if TYPE_CHECKING:``,
relative ones resolved -- because a circle only typing sees today is a real one the day somebody moves
the import.  Pure functions over source text and ``{module: {imported modules}}`` graphs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping


def imported_names(source: str, module: str, is_package: bool) -> list[tuple[str, ...]]:
    """What each import statement anywhere in ``source`` names, as candidates, most specific first.

    ``import a.b`` gives ``("a.b",)``; ``from a import b`` gives ``("a.b", "a")``: b is the submodule
    if there is one, else a name of ``a``.  Relative imports are resolved against ``module``.
    """
    names: list[tuple[str, ...]] = []
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend((alias.name,) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names.extend((f"{target}.{alias.name}", target) for alias in node.names)
    return names


def resolve(name: str, modules: set[str]) -> str | None:
    """The walked module ``name`` refers to: itself, else its nearest walked package (None: not ours)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(source: str, module: str, is_package: bool, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` (module ``module``) imports anywhere in it, itself aside.

    ``from pkg import name`` counts as ``pkg.name`` when that is a module, else as ``pkg``; a name inside
    a module counts as the module that holds it.
    """
    targets: set[str] = set()
    for candidates in imported_names(source, module, is_package):
        found = next((c for c in candidates if c in modules), None) or resolve(candidates[-1], modules)
        if found is not None:
            targets.add(found)
    targets.discard(module)
    return targets


def circles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module importing itself (Tarjan's,
    iterative: a deep graph does not hit the recursion limit), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1 or node in graph.get(node, ()):
                        found.append(sorted(component))
    return found


def shortest_cycle(graph: Mapping[str, Iterable[str]], component: list[str]) -> list[str]:
    """One shortest circle through the component's first module, ``[a, b, ..., a]``: what to read first."""
    start, members = component[0], set(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph.get(node, ())):
                if child == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if child in members and child not in previous:
                    previous[child] = node
                    following.append(child)
        frontier = following
    raise AssertionError(f"no circle through {start}")
