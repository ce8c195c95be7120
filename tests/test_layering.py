"""The layering DESIGN.md asks for, read from the source: every module's imports, at
module level and inside functions, parsed with `ast` (nothing is imported).

- every module sits on one layer of LAYERS and imports only from its own layer or those
  below; the packages that share a layer are side by side and import nothing of each other;
- check and report take only the runtime's plain records from it;
- no import cycles: between modules, between opplugin's packages, or between the ops;
- argparse, and the Namespace it makes, stay in cli/.
"""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "opplugin"

# Lowest first. A module belongs to the layer of the longest prefix that names it.
LAYERS = (
    ("errors", ("opplugin", "opplugin.errors")),  # `opplugin` alone: the package's version
    ("core", ("opplugin.core",)),
    ("toolchains", ("opplugin.gpu", "opplugin.ort")),
    ("registry", ("opplugin.registry",)),
    ("graph", ("opplugin.graph",)),
    ("ops, plan, inputs", ("opplugin.ops", "opplugin.plan", "opplugin.inputs")),
    ("user kernels", ("opplugin.user_kernels",)),
    ("custom ops", ("opplugin.custom",)),  # a custom op's CUDA C kernel is compiled as a user kernel is
    ("runtime", ("opplugin.runtime",)),
    ("report", ("opplugin.report",)),
    ("verify", ("opplugin.verify",)),
    ("front ends", ("opplugin.lab", "opplugin.ray")),
    ("cli", ("opplugin.cli",)),
    ("main", ("opplugin.__main__",)),
)

# the runtime modules that check and report may read: plain records, no runner
RECORDS = {"opplugin.runtime.records", "opplugin.runtime.timeline"}


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
def trees() -> dict[str, ast.Module]:
    return {name: ast.parse(path.read_text(), str(path)) for name, path in modules().items()}


@cache
def imports() -> dict[str, frozenset[str]]:
    """Module -> the opplugin modules it imports anywhere in its body."""
    graph = {}
    for name, tree in trees().items():
        found = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_targets(name, modules()[name].name == "__init__.py", node))
        graph[name] = frozenset(found - {name})
    return graph


def external_imports(name: str) -> set[str]:
    """The top-level names of what module `name` imports from outside opplugin."""
    found = set()
    for node in ast.walk(trees()[name]):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {"opplugin"}


def layer_of(name: str) -> tuple[int, str]:
    """(the layer's place in LAYERS, the prefix that put the module there)."""
    best = None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if within(name, (prefix,)) and (best is None or len(prefix) > len(best[1])):
                best = (index, prefix)
    assert best is not None, f"{name} is on no layer: add its package to LAYERS"
    return best


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


def collapsed(group) -> dict[str, set[str]]:
    """The import graph between groups of modules (group(name): the group's name, or None to leave it out)."""
    graph: dict[str, set[str]] = {}
    for module, targets in imports().items():
        source = group(module)
        if source is None:
            continue
        graph.setdefault(source, set()).update(t for t in map(group, targets) if t is not None and t != source)
    return graph


def package_of(name: str) -> str:
    """opplugin.ops.conv.spec -> opplugin.ops; a top-level module is a node of its own."""
    return ".".join(name.split(".")[:2])


def op_of(name: str) -> str | None:
    """opplugin.ops.conv.families.base -> opplugin.ops.conv; None outside an op's folder."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[1] == "ops" and (PACKAGE / "ops" / parts[2]).is_dir():
        return ".".join(parts[:3])
    return None


def test_the_parser_sees_imports_inside_functions_and_relative_ones():
    assert "opplugin.runtime.runner" in modules() and "opplugin" in modules()
    assert "opplugin.gpu.nvrtc" in imports()["opplugin.user_kernels.compiler"]  # inside compile_node
    assert "opplugin.ops.conv.spec" in imports()["opplugin.ops.conv.reference"]  # under TYPE_CHECKING
    assert "opplugin.cli" in imports()["opplugin.__main__"]
    assert op_of("opplugin.ops.conv.families.base") == "opplugin.ops.conv" and op_of("opplugin.ops.activation") is None


def test_every_layer_is_a_package_that_exists():
    for _, prefixes in LAYERS:
        for prefix in prefixes:
            assert prefix in modules(), f"LAYERS names {prefix}, which is no module"


@pytest.mark.parametrize("module", sorted(modules()))
def test_a_module_imports_only_its_own_layer_and_those_below(module):
    place, prefix = layer_of(module)
    for target in imports()[module]:
        if module.startswith(target + "."):
            continue  # a module reading its own package's names: `from . import user_registry`
        target_place, target_prefix = layer_of(target)
        assert target_place <= place, f"{module} ({LAYERS[place][0]}) imports {target}, of the higher layer {LAYERS[target_place][0]}"
        if target_place == place:
            assert target_prefix == prefix, f"{module} imports {target}: {prefix} and {target_prefix} are side by side on one layer"


@pytest.mark.parametrize("module", ["opplugin.verify.check", "opplugin.verify.first_bad", *sorted(m for m in modules() if within(m, ("opplugin.report",)))])
def test_check_and_report_read_no_runtime_but_its_records(module):
    assert {t for t in imports()[module] if within(t, ("opplugin.runtime",))} <= RECORDS, module


def test_no_module_imports_one_that_imports_it_back():
    # a module's import of its own package (`from . import user_registry`) reads the
    # package's names; the package importing the module back is no cycle of modules
    graph = {m: {t for t in targets if not m.startswith(t + ".")} for m, targets in imports().items()}
    assert cycles(graph) == []


def test_no_package_imports_one_that_imports_it_back():
    assert cycles(collapsed(package_of)) == []


def test_no_op_imports_one_that_imports_it_back():
    assert cycles(collapsed(op_of)) == []


def test_argparse_and_its_namespace_stay_in_the_cli():
    outside = [m for m in modules() if not within(m, ("opplugin.cli",))]
    assert [m for m in outside if "argparse" in external_imports(m)] == []
    readers = []
    for module in modules():
        for node in ast.walk(trees()[module]):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("from_args") and module in outside:
                readers.append(f"{module}.{node.name}")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
                    node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
                readers.append(f"{module}:{node.lineno} getattr(args, ...)")
    assert readers == [], "a parsed Namespace read outside cli/, or by getattr"
