"""The package's structure: every import points one way (no cycle between t5nb's modules,
counting imports inside functions), each import left inside a function says why, and every
name the code uses resolves."""
import ast
import pathlib
import subprocess
import sys

import t5nb

PACKAGE = pathlib.Path(t5nb.__file__).parent


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported(node, module: str, is_package: bool) -> list[str]:
    """The t5nb modules an `import` or `from` statement loads (a name it takes from a package
    counts as that submodule when it is one)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name in MODULES]
    package = module if is_package else module.rpartition(".")[0]
    base = node.module or ""
    if node.level:
        anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
    submodules = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in MODULES]
    return submodules or ([base] if base in MODULES else [])


def _imports(module: str) -> list[tuple[ast.stmt, list[str], bool]]:
    """Every import statement of `module`: (node, t5nb modules it loads, whether inside a function)."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    nested = {id(node) for function in ast.walk(tree) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
              for node in ast.walk(function)}
    return [(node, _imported(node, module, path.name == "__init__.py"), id(node) in nested)
            for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _cycles(graph: dict) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
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
            while not component or component[-1] != node:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found


def test_the_walk_sees_the_imports_it_must():
    """The walk is not vacuous: it finds known edges, top level and nested, and a planted cycle."""
    graph = {module: {target for _, targets, _ in _imports(module) for target in targets} for module in MODULES}
    assert "t5nb.trainer" in graph["t5nb.train"] and "t5nb.tasks.world" in graph["t5nb.tasks.offline"]
    assert "t5nb.course" in graph["t5nb.cli"]  # an import inside a function
    assert _cycles({**graph, "t5nb.config": graph["t5nb.config"] | {"t5nb.train"}})


def test_no_import_cycle_between_t5nb_modules():
    graph = {module: {target for _, targets, _ in _imports(module) for target in targets if target != "t5nb"}
             for module in MODULES}
    assert _cycles(graph) == []


def test_every_import_inside_a_function_says_why():
    """An import left inside a function loads something optional or heavy only when used; a
    comment on its line, or on the first line of its group of imports, says so."""
    silent = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        for node, _, nested in _imports(module):
            first = node.lineno
            while first > 1 and lines[first - 2].strip().startswith(("import ", "from ")):
                first -= 1
            if nested and "#" not in lines[node.lineno - 1] and "#" not in lines[first - 1]:
                silent.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert silent == [], "imports inside functions without a reason:\n" + "\n".join(silent)


def test_every_name_used_resolves_and_every_import_is_used():
    """pyflakes' checks (ruff's F rules: undefined names, unused imports and variables) over the
    library, the benchmarks, scripts, examples, tests and notebooks: code that no test runs, as
    `bench/run.py`'s comparison, still fails here on a name it never imports."""
    root = PACKAGE.parent
    ruff = pathlib.Path(sys.executable).with_name("ruff")
    result = subprocess.run([str(ruff), "check", "--select", "F", "--no-cache", "--output-format", "concise",
                             "t5nb", "bench", "scripts", "examples", "tests", "notebooks", "conftest.py"],
                            cwd=root, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
