"""Another git revision's copy of one source file, loaded as a module of its own beside the current package
(for the ``*_versions.py`` benches, which compare this checkout's code with an earlier revision's)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType


def module_at_revision(rev: str, path: str, name: str) -> ModuleType:
    """``path`` (e.g. ``src/sanlab/decoding/search.py``) as it is at ``rev``, imported as module ``name``; its own
    imports of the package resolve to the package as it is now."""
    source = subprocess.run(["git", "show", f"{rev}:{path}"], check=True, capture_output=True, text=True).stdout
    file = Path(tempfile.mkdtemp()) / f"{name}.py"
    file.write_text(source)
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module
