"""The floors of docs/architecture.md: every sanlab module imports only the floors below its own.

Every import statement counts, also one inside a function (a deferred import is still a dependency).
A new edge changes ALLOWED, docs/architecture.md and the code together.
"""

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sanlab"

KERNEL = {"errors", "files", "invocation", "registry", "compile_limits", "traceable", "torch_release"}
ALLOWED = {
    "errors": set(), "files": {"errors"}, "invocation": set(), "registry": {"errors"}, "compile_limits": set(),
    "traceable": set(), "torch_release": set(),
    "attention": KERNEL,
    "layers": KERNEL | {"attention"},
    "config_yaml": {"errors"},
    "config": KERNEL | {"attention", "layers", "config_yaml"},
    "models": KERNEL | {"attention", "layers", "config"},
    "decoding": set(),
    "data": {"errors", "files"},
    "evaluation": {"errors"},
    "training": {"errors", "files", "compile_limits", "torch_release", "config"},
}
ALLOWED["tasks"] = set(ALLOWED)
ALLOWED["runs"] = ALLOWED["tasks"] | {"tasks"}
ALLOWED["demo"] = ALLOWED["runs"] | {"runs"}
ALLOWED["experiments"] = ALLOWED["demo"] | {"demo"}
TOP = {"cli", "__main__", "__init__"}


def floor_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return parts[0]


def imported_floors(path: Path) -> set[str]:
    floors = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if node.module != "sanlab" else [f"sanlab.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        floors |= {name.split(".")[1] for name in names if name.startswith("sanlab.")}
    return floors


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if floor_of(p) not in TOP)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_imports_only_lower_floors(path):
    floor = floor_of(path)
    assert floor in ALLOWED, f"{path.relative_to(PACKAGE)}: floor {floor!r} is not in docs/architecture.md"
    extra = imported_floors(path) - ALLOWED[floor] - {floor}
    assert not extra, f"{path.relative_to(PACKAGE)} ({floor}) imports {sorted(extra)}, above its floor"


def test_floors_cover_the_package():
    """Every top-level module or package of sanlab has a floor (or is the CLI), so none escapes the check."""
    tops = {floor_of(p) for p in PACKAGE.rglob("*.py")}
    assert tops - TOP <= set(ALLOWED), sorted(tops - TOP - set(ALLOWED))


def test_checker_sees_deferred_imports(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from sanlab.runs import train_run\n    import sanlab.cli\n", encoding="utf-8")
    assert imported_floors(module) == {"runs", "cli"}


MODEL_CODE = ("attention", "layers", "models")  # what torch.compile traces (the training forward)


def test_model_code_copies_dataclasses_with_the_traceable_replace():
    """torch 2.5 and 2.6's dynamo break the graph at ``dataclasses.replace`` (results/torch-versions.md); the model code
    uses ``sanlab.traceable.replace``. A plain one would only show in the graph-break test on those releases."""
    found = [f"{path.relative_to(PACKAGE)}:{number}"
             for floor in MODEL_CODE for path in sorted((PACKAGE / floor).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if re.search(r"dataclasses\.replace\b|from dataclasses import .*\breplace\b", line)]
    assert not found, found
