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
from typing import Final

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


# ----------------------------------------------------------------------------- inside the scorer

SCORER: Final = "exporter_scheduler"
# The scorer's layers, lowest first, and which of the others each may import (besides itself):
# the pure core stands alone; the settings read the core's policy; the log below the request
# path that relies on it; the collector's pacing and the threads' CPU clocks beside it, each on
# its own; the request path reads the core and the settings (and exports the threads' CPU); the
# edges (HTTP, list + watch) drive the request path; the command line wires everything.
SCORER_LAYERS: Final[Mapping[str, frozenset[str]]] = {
    "core": frozenset(),
    "config": frozenset({"core"}),
    "logs": frozenset(),
    "heap": frozenset(),
    "threadcpu": frozenset(),
    "serving": frozenset({"core", "config", "logs", "threadcpu"}),
    "edges": frozenset({"core", "config", "logs", "threadcpu", "serving"}),
    "cli": frozenset({"core", "config", "logs", "heap", "threadcpu", "serving", "edges"}),
    "__main__": frozenset({"cli"}),
}
# Modules that only the named ones may import (besides themselves): rendering explanations is
# for the request path and the command line, not for a store that only logs.
IMPORTED_ONLY_BY: Final[Mapping[str, frozenset[str]]] = {
    f"{SCORER}.serving.explain": frozenset({f"{SCORER}.serving.app", f"{SCORER}.cli"}),
}
# Standard-library modules that only one scorer module may use: the log queue and its writer
# thread live in the log module, whatever else starts them; the collector is paced in one place.
SCORER_ONLY_IN: Final[Mapping[str, frozenset[str]]] = {
    "gc": frozenset({f"{SCORER}.heap"}),
    "logging.handlers": frozenset({f"{SCORER}.logs"}),
    "queue": frozenset({f"{SCORER}.logs"}),
}


def layer_of(module: str) -> str | None:
    """The scorer layer `module` belongs to (None: not a scorer module, or the package)."""
    parts = module.split(".")
    if parts[0] != SCORER or len(parts) < 2:
        return None
    return parts[1]


def layer_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """`module imports target` for each import across scorer layers that the layers forbid."""
    wrong = []
    for module, targets in graph.items():
        layer = layer_of(module)
        if layer is None:
            continue
        allowed = SCORER_LAYERS.get(layer)
        for target in targets:
            other = layer_of(target)
            if other is None or other == layer:
                continue
            if allowed is None or other not in allowed:
                wrong.append(f"{module} imports {target}")
    return sorted(wrong)


def test_every_scorer_module_is_in_a_layer() -> None:
    unplaced = {
        name
        for name in MODULES
        if layer_of(name) is not None and layer_of(name) not in SCORER_LAYERS
    }
    assert unplaced == set()


def test_the_scorer_layers_import_only_the_layers_below_them() -> None:
    assert layer_violations(_graph(MODULES)) == []


@pytest.mark.parametrize(
    ("importer", "target"),
    [
        pytest.param(f"{SCORER}.core.judge", f"{SCORER}.serving.wire", id="core reads serving"),
        pytest.param(f"{SCORER}.core.judge", f"{SCORER}.config.settings", id="core reads config"),
        pytest.param(
            f"{SCORER}.config.settings", f"{SCORER}.serving.app", id="settings read a constant up"
        ),
        pytest.param(
            f"{SCORER}.config.settings", f"{SCORER}.edges.server", id="settings read the server"
        ),
        pytest.param(f"{SCORER}.serving.app", f"{SCORER}.cli", id="request path reads the cli"),
        pytest.param(f"{SCORER}.serving.app", f"{SCORER}.edges.server", id="serving reads edges"),
        pytest.param(f"{SCORER}.logs", f"{SCORER}.serving.app", id="the log reads serving"),
    ],
)
def test_an_import_up_the_layers_is_found(importer: str, target: str) -> None:
    assert layer_violations({importer: {target}}) == [f"{importer} imports {target}"]


def test_imports_down_the_layers_pass() -> None:
    graph = {
        f"{SCORER}.edges.server": {f"{SCORER}.serving.app", f"{SCORER}.config.serving"},
        f"{SCORER}.serving.app": {f"{SCORER}.core.judge", f"{SCORER}.logs"},
        f"{SCORER}.cli": {f"{SCORER}.edges.server"},
    }
    assert layer_violations(graph) == []


def only_by_violations(graph: Mapping[str, Iterable[str]]) -> list[str]:
    return sorted(
        f"{module} imports {target}"
        for module, targets in graph.items()
        for target in targets
        if target in IMPORTED_ONLY_BY
        and module != target
        and module not in IMPORTED_ONLY_BY[target]
    )


def test_explanations_are_imported_only_where_they_are_rendered() -> None:
    assert only_by_violations(_graph(MODULES)) == []
    # The class of leak it catches: a store importing the explanation to log.
    store = f"{SCORER}.serving.nodestore"
    assert only_by_violations({store: {f"{SCORER}.serving.explain"}}) == [
        f"{store} imports {SCORER}.serving.explain"
    ]


@pytest.mark.parametrize("stdlib", sorted(SCORER_ONLY_IN))
def test_a_reserved_standard_module_is_used_in_its_module_alone(stdlib: str) -> None:
    importers = {
        name
        for name, path in MODULES.items()
        if layer_of(name) is not None and stdlib in imports_of(path.read_text(), name)
    }
    assert importers == SCORER_ONLY_IN[stdlib]


def untyped_attributes(source: str) -> list[str]:
    """`self.x` attributes annotated with `object` as a type argument (`dict[bytes, object]`):
    a value stored for another module to read back, whose type only that module knows."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Attribute)):
            continue
        for part in ast.walk(node.annotation):
            if isinstance(part, ast.Subscript) and any(
                isinstance(arg, ast.Name) and arg.id == "object" for arg in ast.walk(part.slice)
            ):
                found.append(node.target.attr)
                break
    return found


def test_no_scorer_attribute_is_typed_object() -> None:
    found = {
        f"{name}.{attribute}"
        for name, path in MODULES.items()
        if layer_of(name) is not None
        for attribute in untyped_attributes(path.read_text())
    }
    assert found == set()
    assert untyped_attributes(
        "class T:\n    def f(self):\n        self.views: dict[bytes, object] = {}\n"
    ) == ["views"]
