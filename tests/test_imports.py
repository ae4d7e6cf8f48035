"""The import structure: no function-local imports of the project's own modules, no import circles, and no
package reaching into another package's private names.

Read from the sources (AST), not by importing them, so a circle shows even where import order happens to
let it pass today.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# folder -> the import name it is installed under (pyproject's package-dir)
FOLDERS = {"multispec": "multispec", "vision": "multispec.vision", "image_ar": "multispec.image_ar",
           "ssm": "multispec.ssm", "reasoning": "multispec.reasoning", "demos": "demos", "benchmarks": "benchmarks"}
MODALITIES = ("vision", "image_ar", "ssm", "reasoning")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT)
    parts = [FOLDERS[rel.parts[0]], *rel.parts[1:]]
    parts[-1] = parts[-1][:-3]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module, list[str]]]:
    """module name -> (path, tree, source lines) for every project module."""
    out = {}
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(ROOT).parts):
                continue
            text = path.read_text()
            out[_module_name(path)] = (path, ast.parse(text, str(path)), text.splitlines())
    return out


SOURCES = _sources()
PACKAGES = {name for name, (path, _, _) in SOURCES.items() if path.name == "__init__.py"}


def _plugin_surface() -> dict[str, str]:
    """`multispec.plugin`'s names -> "module:attribute", read from its tables' source."""
    surface = {}
    for node in SOURCES["multispec.plugin"][1].body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and isinstance(value, ast.Constant) and ":" in value.value:
                    surface[key.value] = value.value
    return surface


def _public_api() -> set[str]:
    """`multispec.__all__`, read from its source."""
    for node in SOURCES["multispec"][1].body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("multispec/__init__.py has no __all__")


PLUGIN_SURFACE = _plugin_surface()


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[tuple[str, list[str]]]:
    """The project modules an import statement in `module` loads, each with the names it takes from it
    (`from pkg import name` resolves to `pkg.name` when that is a submodule, else to `pkg`)."""
    if isinstance(node, ast.Import):
        found = []
        for alias in node.names:
            name = alias.name
            while name and name not in SOURCES:
                name = name.rpartition(".")[0]
            if name:
                found.append((name, [alias.name]))
        return found
    if node.level:
        base = module if module in PACKAGES else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            base = base.rpartition(".")[0]
        source = f"{base}.{node.module}" if node.module else base
    else:
        source = node.module or ""
        if source.partition(".")[0] not in ("multispec", "demos", "benchmarks"):
            return []
    if source == "multispec.plugin":  # each name loads (on first use) the module the plugin's tables name
        return [("multispec.plugin", [])] + [(PLUGIN_SURFACE[a.name].partition(":")[0],
                                              [PLUGIN_SURFACE[a.name].partition(":")[2]])
                                             for a in node.names if a.name in PLUGIN_SURFACE]
    found = []
    for alias in node.names:
        sub = f"{source}.{alias.name}"
        if sub in SOURCES:
            found.append((sub, []))
        elif source in SOURCES:
            found.append((source, [alias.name]))
    return found


def _walk_module_level(body: list[ast.stmt]):
    """Import statements that run when the module is imported (not inside functions, not TYPE_CHECKING)."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from _walk_module_level(node.orelse)
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                yield from _walk_module_level(getattr(node, field, []) or [])


def _function_imports(tree: ast.Module):
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


def _top_package(module: str) -> str:
    parts = module.split(".")
    if parts[0] == "multispec":
        return parts[1] if len(parts) > 1 and parts[1] in MODALITIES else "core"
    return parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_function_local_imports_of_project_modules():
    bad = []
    for module, (path, tree, lines) in SOURCES.items():
        seen = set()
        for node in _function_imports(tree):
            if node.lineno in seen or not _targets(module, node):
                continue
            seen.add(node.lineno)
            near = " ".join(lines[max(0, node.lineno - 2): node.end_lineno])
            if "optional" not in near.lower():
                bad.append(f"{_rel(path)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    assert not bad, ("imports of project modules inside functions (move them to the module's top; an optional "
                     "dependency's import says so in a comment containing 'optional'):\n" + "\n".join(bad))


def _graph() -> dict[str, set[str]]:
    """module -> the project modules its module-level imports load. Importing `a.b.c` also runs the
    `__init__` of `a` and `a.b`, so those are edges too, except for the importer's own ancestor packages
    (already running when it is imported; counting them would make every package a circle with its
    submodules). An explicit import of an ancestor package's own names (`from . import name`) is an edge."""
    graph: dict[str, set[str]] = {m: set() for m in SOURCES}
    for module, (_, tree, _) in SOURCES.items():
        own = {module.rsplit(".", i)[0] for i in range(module.count(".") + 1)}
        for node in _walk_module_level(tree.body):
            for target, _ in _targets(module, node):
                if target != module:
                    graph[module].add(target)
                parts = target.split(".")
                for i in range(1, len(parts)):
                    step = ".".join(parts[:i])
                    if step in SOURCES and step not in own:
                        graph[module].add(step)
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = _find_cycle(_graph())
    assert cycle is None, "an import circle between project modules: " + " -> ".join(cycle)


def test_the_cycle_check_finds_a_planted_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _test_sources() -> dict[str, tuple[Path, ast.Module, list[str]]]:
    out = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        out["tests." + ".".join(path.relative_to(ROOT / "tests").with_suffix("").parts)] = (
            path, ast.parse(text, str(path)), text.splitlines())
    return out


def _private_imports(sources: dict) -> list[str]:
    """Imports of another module's private names: `from m import _x`, `import m._x`, `from m._x import y`."""
    bad = []
    for module, (path, tree, lines) in sources.items():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target, names in _targets(module, node):
                if target == module:
                    continue
                private = [n for n in names if _private(n.rpartition(".")[2])]
                private += [p for p in target.split(".") if _private(p)]
                if private:
                    bad.append(f"{_rel(path)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return bad


def test_no_module_imports_another_modules_private_names():
    """A name another module needs is public (no leading underscore); tests included."""
    bad = _private_imports(SOURCES | _test_sources())
    assert not bad, "private names imported from another module:\n" + "\n".join(bad)


def test_the_private_import_check_finds_a_planted_one():
    planted = {"multispec.bench.text": (ROOT / "multispec/bench/text.py",
                                        ast.parse("from ..zoo.data import _hidden\nfrom .rows import Row"),
                                        ["from ..zoo.data import _hidden", "from .rows import Row"])}
    assert _private_imports(planted) == ["multispec/bench/text.py:1: from ..zoo.data import _hidden"]


def _imported_modules(sources: dict) -> set[str]:
    found = set()
    for module, (_, tree, _) in sources.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found |= {t for t, _ in _targets(module, node) if t != module}
    return found


def test_every_package_module_is_imported_by_something():
    """No dead file: every module of the package is imported by another module, a test, a demo or a benchmark
    (or is a package `__init__`, `__main__`, or a modality package or command module the entry points load)."""
    imported = _imported_modules(SOURCES | _test_sources())
    entry_points = {f"multispec.{m}" for m in MODALITIES} | {f"multispec.{m}.cli" for m in MODALITIES}
    entry_points.add("multispec.cli_commands")  # loaded by name once a command needs it (`multispec.cli`)
    dead = sorted(m for m in SOURCES if m.startswith("multispec") and m not in imported and m not in PACKAGES
                  and not m.endswith("__main__") and m not in entry_points)
    assert not dead, f"modules nothing imports: {dead}"


def _long_functions(sources: dict, limit: int = 80) -> list[str]:
    return [f"{_rel(path)}:{node.lineno}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for path, tree, _ in sources.values() for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= limit]


def test_no_function_outside_the_tests_is_over_80_lines():
    """A longer function is a table or a sequence of named steps waiting to be written as such."""
    long = _long_functions(SOURCES)
    assert not long, "functions over 80 lines:\n" + "\n".join(long)
    planted = ast.parse("def f():\n" + "    x = 1\n" * 80)
    assert _long_functions({"m": (ROOT / "m.py", planted, [])}) == ["m.py:1: f (81 lines)"]


# the core's layers, lowest first: a module imports its own layer and those below, never one above (a back arrow
# makes the lower layer carry the upper one: training would load the benchmarks, the zoo the bench's rows)
LAYERS = ("core", "training", "zoo", "testing", "bench", "cli")
CLI_MODULES = {"multispec.__main__", "multispec.cli", "multispec.cli_commands", "multispec.cli_types",
               "multispec.generate_args", "multispec.generate_cli", "multispec.bench.chat_cli", "multispec.training.cli"}


def _layer(module: str) -> str:
    if module in CLI_MODULES:
        return "cli"
    part = module.split(".")[1] if module.count(".") else ""
    return part if part in LAYERS else "core"


def _back_arrows(graph: dict[str, set[str]]) -> list[str]:
    core = lambda m: m.startswith("multispec") and _top_package(m) == "core"  # noqa: E731
    return sorted(f"{a} ({_layer(a)}) -> {b} ({_layer(b)})" for a, targets in graph.items() if core(a)
                  for b in targets if core(b) and LAYERS.index(_layer(b)) > LAYERS.index(_layer(a)))


def test_no_import_runs_back_up_the_cores_layers():
    """core < training < zoo < testing < bench < cli (the commands' modules): `zoo tune` is a benchmark (in
    bench), data sharding is the core's (`multispec.shards`), used by training and the benchmarks alike."""
    bad = _back_arrows(_graph())
    assert not bad, "imports that run back up the layers " + " < ".join(LAYERS) + ":\n" + "\n".join(bad)
    planted = {"multispec.zoo.tune": {"multispec.bench.text"}, "multispec.bench.text": {"multispec.zoo.data"},
               "multispec.training.loop": {"multispec.bench.shards"}}
    assert _back_arrows(planted) == ["multispec.training.loop (training) -> multispec.bench.shards (bench)",
                                     "multispec.zoo.tune (zoo) -> multispec.bench.text (bench)"]


def _closure(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        module = todo.pop()
        if module not in seen:
            seen.add(module)
            todo.extend(graph.get(module, ()))
    return seen


def _command_modules(graph: dict[str, set[str]], package: str) -> list[str]:
    """The command-line modules importing `package` loads: the core's CLI and any modality's commands."""
    commands = CLI_MODULES | {f"multispec.{m}.{c}" for m in MODALITIES for c in ("cli", "generate_mode")}
    return sorted(_closure(graph, package) & commands)


def test_importing_a_modality_never_loads_the_command_line():
    """A modality registers its adapters, engines and zoo pairs on import (`multispec.adapters`); its commands are
    registered only by the command line, through the `multispec.commands` entry points. So a plain
    `speculative_generate` on a model that an adapter serves loads no CLI, bench or argparse code of any modality."""
    graph = _graph()
    for modality in MODALITIES:
        assert _command_modules(graph, f"multispec.{modality}") == [], modality
    planted = {"multispec.vision": {"multispec.vision.cli"}, "multispec.vision.cli": {"multispec.cli"}}
    assert _command_modules(planted, "multispec.vision") == ["multispec.cli", "multispec.vision.cli"]


def test_the_command_entry_points_name_each_modalitys_register():
    """pyproject's `multispec.commands` group: one `register` per modality, each a function of its cli module."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    commands = project["multispec.commands"]
    assert commands == {m: f"multispec.{m}.cli:register" for m in MODALITIES}
    for modality in MODALITIES:
        _, tree, _ = SOURCES[f"multispec.{modality}.cli"]
        assert any(isinstance(n, ast.FunctionDef) and n.name == "register" for n in tree.body), modality


def _outside_the_surface(sources: dict) -> list[str]:
    """Imports of the core by a modality other than `multispec`'s public API (and its `zoo`), `multispec.plugin`'s
    listed names, and the modality packages themselves."""
    api = _public_api() | {"zoo"}
    bad = []
    for module, (path, tree, lines) in sources.items():
        if _top_package(module) not in MODALITIES:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names if a.name.startswith("multispec.")]
                wrong = [n for n in names if _top_package(n) == "core"]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("multispec"):
                given = [a.name for a in node.names]
                if node.module == "multispec.plugin":
                    wrong = [n for n in given if n not in PLUGIN_SURFACE]
                elif node.module == "multispec":
                    wrong = [n for n in given if n not in api and n not in MODALITIES]
                else:
                    wrong = given if _top_package(node.module) == "core" else []
            else:
                continue
            if wrong:
                bad.append(f"{_rel(path)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return bad


def test_modalities_import_only_the_plugin_surface():
    """A modality takes from the core only `multispec`'s public API and the names `multispec.plugin` lists, so the
    list is the whole contract a new modality reads (and the core may move anything else)."""
    bad = _outside_the_surface(SOURCES)
    assert not bad, ("core imports outside multispec.plugin's list (add the name to a table there, or use "
                     "multispec's API):\n" + "\n".join(bad))
    text = "from multispec.targets.hf import HFCausalLM\nfrom multispec.plugin import Nope, Target\n" \
           "from multispec import speculative_generate, generate\nimport multispec.tree\nfrom . import targets"
    planted = {"multispec.vision.x": (ROOT / "vision/x.py", ast.parse(text), text.splitlines())}
    assert _outside_the_surface(planted) == [
        "vision/x.py:1: from multispec.targets.hf import HFCausalLM",
        "vision/x.py:2: from multispec.plugin import Nope, Target",
        "vision/x.py:3: from multispec import speculative_generate, generate",
        "vision/x.py:4: import multispec.tree"]


def test_the_plugin_surface_names_what_exists():
    """Every name `multispec.plugin` lists loads (a renamed core function shows here, not in a modality's import)."""
    import importlib

    import multispec.plugin

    assert multispec.plugin.SURFACE == PLUGIN_SURFACE
    for name, where in PLUGIN_SURFACE.items():
        module, _, attribute = where.partition(":")
        assert getattr(multispec.plugin, name) is getattr(importlib.import_module(module), attribute), name
    try:
        multispec.plugin.not_listed
    except AttributeError as error:
        assert "multispec.plugin.SURFACE" in str(error)
    else:
        raise AssertionError("an unlisted name loaded")


def _wide_functions(sources: dict, limit: int = 10) -> list[str]:
    """Public functions and methods with more than `limit` parameters (`self` / `cls`, `*args` and `**kwargs`
    not counted). Triton kernels (`@triton.jit`) are exempt: a kernel's parameters are its pointers, strides and
    compile-time constants, fixed by the launch."""
    wide = []
    for path, tree, _ in sources.values():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or _private(node.name):
                continue
            if any("jit" in ast.unparse(d) for d in node.decorator_list):
                continue
            a = node.args
            names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs) if p.arg not in ("self", "cls")]
            if len(names) > limit:
                wide.append(f"{_rel(path)}:{node.lineno}: {node.name} ({len(names)} parameters)")
    return wide


def test_no_public_function_takes_over_10_parameters():
    """A longer list is settings waiting for their object (`BenchOptions`, `SamplingConfig`, `EngineConfig`, a
    recipe): the package, the modalities, the demos and the benchmark scripts alike."""
    wide = _wide_functions(SOURCES)
    assert not wide, "public functions over 10 parameters:\n" + "\n".join(wide)
    text = ("def run(a, b, c, d, e, f, g, h, i, j, *, k=1, **kw): pass\n"
            "def _run(a, b, c, d, e, f, g, h, i, j, k): pass\n"
            "class C:\n    def m(self, a, b, c, d, e, f, g, h, i, j): pass\n"
            "@triton.jit\ndef kernel(a, b, c, d, e, f, g, h, i, j, k): pass\n")
    planted = {"m": (ROOT / "m.py", ast.parse(text), [])}
    assert _wide_functions(planted) == ["m.py:1: run (11 parameters)"]
