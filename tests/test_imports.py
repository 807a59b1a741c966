"""Import hygiene: no import cycle among sanlab's modules, and the config schema (with every registered part,
mixer and pre-block config) and the CLI's argument parsing load without torch.

The cycle check reads the import statements a module runs when it is imported (its top level, ``if`` and
``try`` blocks included, ``if TYPE_CHECKING`` excluded), so a cycle is found whatever order the modules are
first imported in. A deferred import inside a function runs later and cannot form an import-time cycle.
"""

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sanlab"


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_time_statements(body: list[ast.stmt]):
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and not (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            yield from _import_time_statements(node.body)
            yield from _import_time_statements(node.orelse)
        elif isinstance(node, ast.Try):
            yield from _import_time_statements(node.body)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports at import time (``from pkg import sub`` counts as ``pkg.sub``;
    a module's own parent packages are left out: they are always imported first)."""
    modules = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets = set()
        for node in _import_time_statements(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            base = ".".join(package[:len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name and not name.startswith(t + ".")}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found, state = [], {}  # state: 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                found.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_no_import_cycle():
    assert cycles(import_graph(PACKAGE)) == []


def test_the_cycle_check_sees_a_cycle_through_a_package(tmp_path):
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("def f():\n    import pkg.a\n\nfrom .. import a\n")
    (package / "c.py").write_text("if TYPE_CHECKING:\n    import pkg.a\nimport pkg\n")
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]


def _without_torch(code: str) -> None:
    check = textwrap.dedent(code) + "\nimport sys\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_the_config_schema_validates_without_torch():
    _without_torch("""
        from sanlab.attention.registry import PARTS
        from sanlab.config import validate
        from sanlab.layers.mixers import MIXERS
        from sanlab.layers.pre_blocks import PRE_BLOCKS

        for registry in (PARTS, MIXERS, PRE_BLOCKS):
            for name in registry.names():
                registry.entry(name).config.examples()
        files = {"src": "a", "tgt": "b"}
        stack = {"attention": {"parts": [{"type": "window", "size": 3}, {"type": "local_soft"}]},
                 "pre_blocks": [{"type": "conv"}], "mixer": {"type": "block"}}
        validate({"task": "translation", "data": {"train": files, "valid": files},
                  "model": {"encoder": stack, "decoder": {"mixer": {"type": "muse"}}}}, source="test")
    """)


def test_the_command_line_parser_loads_without_torch():
    _without_torch("import sanlab.cli")
