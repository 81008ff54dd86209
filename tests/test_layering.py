"""The import rules the code keeps, read from the source with `ast` (no module is imported).

The product is three packages (the contract, the agent, the scorer); the tooling around it is four
more (the loopback control plane, the Kubernetes stand-ins, the fleet simulations, the demo), plus
the benchmarks. Every `import` counts wherever it stands: at module level, inside a function (a lazy
import is still an edge) and under `TYPE_CHECKING` (a circle that only the type checker walks is
still a circle to whoever reads or moves the code).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PRODUCT = ("gpu_contract", "agent", "exporter_scheduler")
TOOLING = ("loopback_cluster", "kube_standins", "fleet_sim", "demo", "benchmarks")

# Which project packages each package may import (besides its own modules).
MAY_IMPORT: Mapping[str, frozenset[str]] = {
    "gpu_contract": frozenset(),
    # The two binaries share only the contract, so neither image path loads the other.
    "agent": frozenset({"gpu_contract"}),
    "exporter_scheduler": frozenset({"gpu_contract"}),
    # The real control plane stands on its own: nothing of it is a stand-in or a simulation.
    "loopback_cluster": frozenset({"gpu_contract"}),
    # The stand-ins speak the product's own wire codecs and hint names.
    "kube_standins": frozenset({"gpu_contract", "agent", "exporter_scheduler"}),
    "fleet_sim": frozenset({"gpu_contract", "agent", "exporter_scheduler"}),
    "demo": frozenset(
        {"gpu_contract", "agent", "exporter_scheduler", "loopback_cluster", "kube_standins"}
    ),
    "benchmarks": frozenset(
        {"gpu_contract", "agent", "exporter_scheduler", "loopback_cluster", "kube_standins"}
        | {"fleet_sim"}
    ),
}

# Third-party clients that only named modules may import (the edges of the design).
ONLY_IN: Mapping[str, frozenset[str]] = {
    "pynvml": frozenset({"agent.nvml"}),
    # The scorer's caches (nodes, pods, namespaces) share one list + watch loop, which alone
    # builds the client.
    "kubernetes": frozenset({"agent.kube", "exporter_scheduler.edges.listwatch"}),
    "grpc": frozenset({"agent.podresources", "kube_standins.kubelet"}),
}

_STDLIB = frozenset(sys.stdlib_module_names)


def imports_of(source: str, module: str) -> set[str]:
    """Every module name `source` (the text of `module`) imports, dotted, absolute."""
    found: set[str] = set()
    package = module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            if base == "__future__":
                continue
            found.add(base)
            # `from pkg import mod` imports the module pkg.mod when there is one.
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in (*PRODUCT, *TOOLING):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


MODULES = _modules()


def _graph(modules: Mapping[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (names that are not modules are dropped)."""
    return {
        name: {i for i in imports_of(path.read_text(), name) if i in modules and i != name}
        for name, path in modules.items()
    }


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

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
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_project_has_no_import_circle() -> None:
    assert cycles(_graph(MODULES)) == []


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_package_imports_only_the_layers_below_it(package: str) -> None:
    known = set(MAY_IMPORT)
    wrong = sorted(
        f"{name} imports {target}"
        for name, path in MODULES.items()
        if name.split(".")[0] == package
        for target in imports_of(path.read_text(), name)
        if target.split(".")[0] in known - {package} - MAY_IMPORT[package]
    )
    assert wrong == []


@pytest.mark.parametrize("client", sorted(ONLY_IN))
def test_third_party_clients_enter_through_their_one_module(client: str) -> None:
    importers = {
        name
        for name, path in MODULES.items()
        if any(i.split(".")[0] == client for i in imports_of(path.read_text(), name))
    }
    assert importers == ONLY_IN[client]


def _runtime_distributions() -> set[str]:
    lines = (ROOT / "docker" / "constraints.txt").read_text().splitlines()
    return {ln.split("==")[0] for ln in lines if ln and not ln.startswith("#")}


def _canonical(name: str) -> str:
    return name.replace("_", "-").replace(".", "-").lower()


def test_the_product_imports_only_its_runtime_dependencies() -> None:
    """What the image installs (docker/constraints.txt) is enough for every product import."""
    own = set(MAY_IMPORT)
    distributions = metadata.packages_distributions()
    runtime = _runtime_distributions()
    missing: list[str] = []
    for name, path in MODULES.items():
        if name.split(".")[0] not in PRODUCT:
            continue
        for target in imports_of(path.read_text(), name):
            top = target.split(".")[0]
            if top in own or not top or top in _STDLIB:
                continue
            providers = {_canonical(d) for d in distributions.get(top, [])}
            if not providers & runtime:
                missing.append(f"{name} imports {top} ({', '.join(sorted(providers)) or '?'})")
    assert sorted(missing) == []


def test_the_project_config_names_every_package() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert set(config["tool"]["mypy"]["packages"]) == set(MAY_IMPORT) - {"benchmarks"}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        pytest.param("import a.b\n", {"a.b"}, id="import"),
        pytest.param("from a import b, c\n", {"a", "a.b", "a.c"}, id="from-import"),
        pytest.param("def f():\n    import lazy\n", {"lazy"}, id="lazy"),
        pytest.param(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p.q import T\n",
            {"typing", "typing.TYPE_CHECKING", "p.q", "p.q.T"},
            id="type-checking",
        ),
        pytest.param("from . import sibling\n", {"pkg", "pkg.sibling"}, id="relative"),
        pytest.param("from __future__ import annotations\n", set(), id="future"),
    ],
)
def test_imports_are_read_wherever_they_stand(source: str, expected: set[str]) -> None:
    assert imports_of(source, "pkg.mod") == expected


def test_a_circle_is_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
