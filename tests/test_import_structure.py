"""The package is layered and has no import cycles: every module imports on its own in a fresh
interpreter; the graph of its relative imports (those inside functions included) has no cycle; and
no module imports from a layer above its own (README, "How the code is arranged")."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "robust_stan"


def module_names() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def import_graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports (``from . import x`` imports the package too)."""
    modules = module_names()
    graph = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                for candidate in [target] + [f"{target}.{alias.name}" for alias in node.names]:
                    if candidate in modules and candidate != name:
                        graph[name].add(candidate)
            elif isinstance(node, ast.Import):
                graph[name] |= {alias.name for alias in node.names if alias.name in modules and alias.name != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on_stack.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_imports_inside_functions():
    graph = import_graph()
    assert "robust_stan.engines.bridgestan_oracle" in graph["robust_stan.engines.cmdstan_engine"]  # a lazy import
    assert "robust_stan.methods.rob_ula.estimators" in graph["robust_stan.methods.rob_ula.sampler"]


#: The layers from the bottom up; a module may import from its own layer and the ones below.
LAYERS = ["common", "building", "engines", "gradients", "methods", "results", "api"]


def layer(module: str) -> int:
    """A module's layer; the package root and its modules (the public namespace, cli, demo) are on top."""
    parts = module.split(".")
    if module == "robust_stan._version":
        return 0
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else len(LAYERS)


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_the_layer_check_finds_an_upward_import():
    graph = {"robust_stan.results.fit": {"robust_stan.api.model"}, "robust_stan.api.model": set()}
    assert upward_imports(graph) == [("robust_stan.results.fit", "robust_stan.api.model")]


def test_every_module_belongs_to_a_layer_or_the_top():
    stray = [m for m in module_names() if layer(m) == len(LAYERS) and m.count(".") > 1]
    assert stray == []  # a new folder needs a place in LAYERS (and a line in the README)


def test_no_module_imports_from_a_layer_above_its_own():
    assert upward_imports(import_graph()) == []


#: The method families, one folder each under methods/; the modules at methods/ level are generic
#: (they serve several families) and sit below every family.
METHOD_FAMILIES = ["rob_ula", "coresets", "dpvi", "variational", "selection"]


def method_family(module: str) -> str | None:
    """The family folder of a module under methods/ (None: a generic methods module, or another layer)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 3 and parts[1] == "methods" and parts[2] in METHOD_FAMILIES else None


def cross_family_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Imports of a family's module from another family, or from a generic methods module (the layers
    above, results and api, may import any family)."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if a.startswith("robust_stan.methods.")
                  and method_family(b) is not None and method_family(a) != method_family(b))


def test_the_family_check_finds_an_import_across_families():
    graph = {"robust_stan.methods.dpvi.mechanism": {"robust_stan.methods.rob_ula.estimators"},
             "robust_stan.methods.nuts": {"robust_stan.methods.coresets.targets"},
             "robust_stan.methods.rob_ula.partitioned": {"robust_stan.methods.rob_ula.sampler",
                                                          "robust_stan.methods.partition_placement"}}
    assert cross_family_imports(graph) == [
        ("robust_stan.methods.dpvi.mechanism", "robust_stan.methods.rob_ula.estimators"),
        ("robust_stan.methods.nuts", "robust_stan.methods.coresets.targets")]


def test_every_methods_folder_is_a_family():
    folders = {m.split(".")[2] for m, path in module_names().items()
               if m.startswith("robust_stan.methods.") and path.name == "__init__.py"}
    assert folders == set(METHOD_FAMILIES)  # a new family needs a place here (and a line in the README)


def test_a_method_family_imports_no_other_family():
    """A family uses only its own folder and the generic methods modules, and no generic methods
    module uses a family."""
    assert cross_family_imports(import_graph()) == []


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_every_module_imports_in_a_fresh_interpreter():
    """Every module imports, each in turn, in one fresh interpreter. Importing any module runs the
    package's ``__init__`` first, which imports the whole public API in its own order, so a fresh
    interpreter per module would repeat the same imports; the modules ``__init__`` does not reach
    are imported here after it, and the cycle test above covers the order of the rest."""
    code = "\n".join([
        "import importlib, traceback",
        "failed = []",
        f"for name in {sorted(module_names())!r}:",
        "    try:",
        "        importlib.import_module(name)",
        "    except Exception:",
        "        failed.append(name + ': ' + traceback.format_exc(limit=3))",
        "print('\\n'.join(failed))",
        "raise SystemExit(1 if failed else 0)",
    ])
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]


def test_every_example_and_benchmark_script_imports():
    """The scripts under examples/ and benchmarks/ import (their names from one another and from the
    package exist), in one fresh interpreter; none runs its main() on import."""
    root = PACKAGE.parent
    scripts = sorted(root.glob("examples/*.py")) + sorted(root.glob("benchmarks/*.py"))
    code = "\n".join([
        "import importlib.util, sys",
        f"sys.path[:0] = [{str(root / 'examples')!r}, {str(root / 'benchmarks')!r}]",
        f"for path in {[str(p) for p in scripts]!r}:",
        "    spec = importlib.util.spec_from_file_location('script_' + path.split('/')[-1][:-3], path)",
        "    module = importlib.util.module_from_spec(spec)",
        "    try:",
        "        spec.loader.exec_module(module)",
        "    except BaseException as exc:",
        "        sys.exit(f'{path}: {type(exc).__name__}: {exc}')",
    ])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert len(scripts) > 20
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_call_walk_counts_climbs_and_re_entries():
    """tools/call_walk.py's counts on a hand-made walk: api -> methods -> engines -> methods (a climb)
    -> engines again (a re-entry: it was left upward) -> results (a climb) -> common (neither)."""
    from tools.call_walk import LAYERS as WALK_LAYERS, Walk

    assert WALK_LAYERS == LAYERS
    walk = Walk(["api/a.py", "methods/m.py", "engines/e.py", "methods/m.py", "engines/e.py", "results/r.py",
                 "common/c.py"])
    assert (walk.files, walk.climbs, walk.reentries) == (5, 2, 1)
