"""The layering DESIGN.md asks for, read from the source: every module's imports, at
module level and inside functions, parsed with `ast` (nothing is imported).

- what a run needs (the runtime, the ops, the user kernels' run side, check, data,
  report) never reaches the lab, the user-kernel tools or the CLI, not even through
  another module;
- check and report take only the runtime's plain records from it, and data nothing;
- nothing but `__main__` imports the CLI;
- no import cycles, between modules or between opplugin's packages.
"""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opplugin"

RUN_SIDE = ("opplugin.runtime", "opplugin.ops", "opplugin.user_kernels", "opplugin.check", "opplugin.data", "opplugin.report")
# what the run side must not reach: measurement, the tools that may use it, the command line
OFF_LIMITS = ("opplugin.lab", "opplugin.user_kernel_tools", "opplugin.cli")

# Package cycles allowed: none (the tuning cache keys on a signature string that ops/conv makes).
KNOWN_PACKAGE_CYCLES: set[frozenset[str]] = set()


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@cache
def modules() -> dict[str, Path]:
    """opplugin's modules by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _targets(name: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The opplugin modules one import statement of module `name` loads (the nearest module
    for a name that is an attribute: `from ..ops.conv.spec import ConvSpec` -> ops.conv.spec)."""
    if isinstance(node, ast.Import):
        bases = [alias.name for alias in node.names]
    else:
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[: len(package) - node.level + 1] if node.level else []
        base = ".".join(package + ([node.module] if node.module else []))
        bases = [f"{base}.{alias.name}" for alias in node.names]
    targets = []
    for dotted in bases:
        while dotted and dotted not in modules():
            dotted = dotted.rpartition(".")[0]
        if dotted:
            targets.append(dotted)
    return targets


@cache
def imports() -> dict[str, frozenset[str]]:
    """Module -> the opplugin modules it imports anywhere in its body."""
    graph = {}
    for name, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_targets(name, path.name == "__init__.py", node))
        graph[name] = frozenset(found - {name})
    return graph


def loads(name: str) -> list[str]:
    """What importing `name` runs: its packages' __init__ first, then the module."""
    parts = name.split(".")
    return [".".join(parts[:n]) for n in range(1, len(parts) + 1)]


def import_path(start: str, goal) -> list[str] | None:
    """The shortest chain of imports from `start` to a module for which goal(name) holds."""
    paths = {start: [start]}
    queue = [start]
    for current in queue:
        for target in sorted({loaded for t in imports()[current] for loaded in loads(t)}):
            if target not in paths:
                paths[target] = paths[current] + [target]
                if goal(target):
                    return paths[target]
                queue.append(target)
    return None


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while node not in component:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def package_of(name: str) -> str:
    """opplugin.ops.conv.spec -> opplugin.ops; a top-level module is a node of its own."""
    return ".".join(name.split(".")[:2])


def test_the_parser_sees_imports_inside_functions_and_relative_ones():
    assert "opplugin.runtime.runner" in modules() and "opplugin" in modules()
    assert "opplugin.nvrtc" in imports()["opplugin.user_kernels.compiler"]  # inside compile_node
    assert "opplugin.ops.conv.spec" in imports()["opplugin.ops.conv.reference"]  # under TYPE_CHECKING
    assert "opplugin.cli" in imports()["opplugin.__main__"]


@pytest.mark.parametrize("module", sorted(m for m in modules() if within(m, RUN_SIDE)))
def test_the_run_side_never_reaches_the_lab_the_tools_or_the_cli(module):
    path = import_path(module, lambda name: within(name, OFF_LIMITS))
    assert path is None, "run side reaches " + " -> ".join(path)


def test_check_report_and_data_read_no_runtime_but_its_records():
    for module in ("opplugin.check", "opplugin.report", "opplugin.data"):
        assert {t for t in imports()[module] if within(t, ("opplugin.runtime",))} <= {"opplugin.runtime.records"}, module


def test_nothing_but_main_imports_the_cli():
    importers = sorted(m for m, targets in imports().items() if "opplugin.cli" in targets)
    assert importers == ["opplugin.__main__"]


def test_no_module_imports_one_that_imports_it_back():
    # a module's import of its own package (`from . import user_registry`) reads the
    # package's names; the package importing the module back is no cycle of modules
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in imports().items()}
    assert cycles(graph) == []


def test_no_package_imports_one_that_imports_it_back():
    graph: dict[str, set[str]] = {}
    for module, targets in imports().items():
        graph.setdefault(package_of(module), set()).update(package_of(t) for t in targets if package_of(t) != package_of(module))
    found = {frozenset(c) for c in cycles(graph)}
    assert found - KNOWN_PACKAGE_CYCLES == set()
    assert KNOWN_PACKAGE_CYCLES - found == set(), "a known package cycle is gone: drop it from KNOWN_PACKAGE_CYCLES"
