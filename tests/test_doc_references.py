"""The code README.md and docs/ (docs/spec too) name is the code there is: every repository path, every
``tests/FILE.py::test_name`` and every backticked dotted name of sanlab's (``flex.MIN_KEYS``,
``Distributed.all_or_none``, ``sanlab.layers.mixers.MIXERS``) resolves, and a backticked bare identifier
(``stand_by``, ``use_vertical``) is a word of the code, so a rename or a removal fails here until the page
follows. results/*.md are records of their day and stay as written. tests/test_docs.py checks the backticked
paths and links of README.md, docs/*.md and results/ and the CLI's commands, tests/test_config_reference.py the
config keys; this adds docs/spec, scripts/, paths out of backticks and the code. The source is read with
``ast``, not imported, which keeps this fast and also sees a dataclass's fields and the attributes ``__init__``
sets."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sanlab"
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
# A repository path in a page, in backticks or not; `src/sanlab/attention/parts/<name>.py` is a pattern.
PATH = re.compile(r"(?<![\w/.-])((?:src|tests|bench|scripts|configs|docs|results)/[\w./-]*[\w/])(?!\.?[\w/<{*-])")
OUTPUT = re.compile(r"(?:--out |out=\")$")  # what a command shown would write, not a file there is
EXAMPLE_PATHS = {"configs/compare/x.yaml"}  # the grid of docs/compare.md's sample error message
FOREIGN_FILES = {"main.py", "ud_parallel.py"}  # the reference implementation's, in docs/spec/locality-variants.md
# A bare file name (`flex.py`, `test_banded.py`) is the name of some file under these.
CODE_DIRS = ("src", "tests", "bench", "scripts")
BARE_FILE = re.compile(r"`(\w+\.py)`")
TEST = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
SPAN = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(.*\))?")

# The first word of a backticked dotted name that is not sanlab's code.
NOT_CODE = {
    "data", "model", "train", "decode", "encoder", "decoder", "cross_attention",  # config keys
    "eval",  # a compare grid's key (`eval.average_last`)
    "rescored",  # a key of a cell's JSON record (`rescored.previous`)
    "torch", "np", "os", "dataclasses", "GradScaler",  # other libraries
    "DynamicConv1dTBC",  # fairseq's
    "ctx",  # a builder's or a part's argument (`ctx.k_pos`), named by its role, not a module
}
# Entry-point groups, and the suffixes of file names (`metrics.jsonl`, `flex.py`), that read as dotted names.
ENTRY_POINT_GROUPS = {"sanlab.mixers", "sanlab.parts", "sanlab.pre_blocks"}
FILE_SUFFIXES = {"py", "md", "yaml", "json", "jsonl", "csv", "txt", "log", "pt", "safetensors", "model", "vocab", "toml",
                 "sh", "png", "pdf"}


def _pages():
    return pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))


def _prose(page: Path) -> str:
    return page.read_text(encoding="utf-8")


@_pages()
def test_named_paths_exist(page):
    """Every path a page names, in or out of backticks, including scripts/ and the pages of docs/spec."""
    text = _prose(page)
    named = {m.group(1) for m in PATH.finditer(text) if not OUTPUT.search(text, 0, m.start())}
    missing = sorted({p for p in named if not (ROOT / p).exists()} - EXAMPLE_PATHS)
    files = {f.name for d in CODE_DIRS for f in (ROOT / d).rglob("*.py")}
    missing += sorted({f for f in BARE_FILE.findall(text) if f not in files} - FOREIGN_FILES)
    assert not missing, f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # `FILE::TestClass` names a class
    return {node.name for node in ast.walk(tree) if isinstance(node, kinds)}


@_pages()
def test_named_tests_exist(page):
    """``tests/FILE.py::test_name`` names a test defined in that file (a parametrised one by its bare name)."""
    missing = sorted(f"{file}::{name}" for file, name in TEST.findall(_prose(page))
                     if not (ROOT / file).exists() or name not in _test_names(ROOT / file))
    assert not missing, f"{page.relative_to(ROOT)} names tests that do not exist: {missing}"


class _Module:
    """The top-level names of one sanlab module and the members of each class it defines."""

    def __init__(self, path: Path):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        self.names: set[str] = set()
        self.classes: dict[str, set[str]] = {}
        self.bases: dict[str, list[str]] = {}
        for node in tree.body:
            self.names |= _bound(node)
            if isinstance(node, ast.ClassDef):
                members = set().union(*(_bound(n) for n in node.body))
                # what a method assigns to self.X: __init__'s attributes, a dataclass's __post_init__ ones
                members |= {t.attr for n in ast.walk(node) for t in _targets(n)
                            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
                self.classes[node.name] = members
                self.bases[node.name] = [b.id if isinstance(b, ast.Name) else b.attr for b in node.bases
                                         if isinstance(b, (ast.Name, ast.Attribute))]


def _targets(node: ast.AST) -> list[ast.AST]:
    if isinstance(node, ast.Assign):
        return [e for t in node.targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        return [node.target]
    return []


def _bound(node: ast.AST) -> set[str]:
    """The names a module- or class-level statement binds (an `if`/`try` block's too)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, (ast.If, ast.Try)):
        body = [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                *(n for h in getattr(node, "handlers", []) for n in h.body)]
        return set().union(set(), *(_bound(n) for n in body))
    return {t.id for t in _targets(node) if isinstance(t, ast.Name)}


@cache
def _index() -> tuple[dict[str, _Module], dict[str, list[tuple[set[str], list[str]]]]]:
    """Every sanlab module by its dotted name (and the tests' helper modules, as `tests_helpers`), and every
    class they define by its name, with its members and the names of its bases."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = _Module(path)
    for path in (ROOT / "tests").glob("*.py"):
        if not path.name.startswith(("test_", "conftest")):
            modules[path.stem] = _Module(path)
    classes: dict[str, list[tuple[set[str], list[str]]]] = {}
    for module in modules.values():
        for name, members in module.classes.items():
            classes.setdefault(name, []).append((members, module.bases[name]))
    return modules, classes


def _resolves(name: str) -> bool:
    """``name`` is a sanlab module (by any tail of its dotted name: ``flex``, ``decoding.cache``), an attribute
    of one, or a class's member; or a sanlab class (``Distributed.all_or_none``) and its member."""
    modules, classes = _index()
    words = name.split(".")
    for cut in range(len(words), 0, -1):
        head, rest = ".".join(words[:cut]), words[cut:]
        for dotted, module in modules.items():
            if dotted != head and not dotted.endswith(f".{head}"):
                continue
            if not rest:
                return True
            if rest[0] in module.names and (len(rest) == 1 or _member(rest[0], rest[1])):
                return True
    return len(words) == 2 and _member(words[0], words[1])


def _member(cls: str, attribute: str) -> bool:
    """``attribute`` is a member of a sanlab class named ``cls`` or of one of its bases that sanlab defines."""
    return any(attribute in members or any(_member(base, attribute) for base in bases if base != cls)
               for members, bases in _index()[1].get(cls, []))


def _dotted_names(page: Path) -> set[str]:
    names = set()
    for span in SPAN.findall(re.sub(r"```.*?```", "", _prose(page), flags=re.S)):
        m = DOTTED.fullmatch(span.strip())
        if m and m.group(1).split(".")[0] not in NOT_CODE and m.group(1) not in ENTRY_POINT_GROUPS \
                and m.group(1).rsplit(".", 1)[1] not in FILE_SUFFIXES:
            names.add(m.group(1))
    return names


@_pages()
def test_named_code_exists(page):
    """Every backticked dotted name (``module.name``, ``Class.method``, ``module.Class.method``, a call's name)
    that is not in NOT_CODE, an entry-point group or a file name is sanlab's code."""
    missing = sorted(n for n in _dotted_names(page) if not _resolves(n))
    assert not missing, f"{page.relative_to(ROOT)} names code that does not exist: {missing}"


def test_the_reference_check_checks_something():
    """The resolution is not vacuous: real names resolve, a misspelt one does not."""
    assert _resolves("flex.MIN_KEYS") and _resolves("sanlab.layers.mixers.MIXERS")
    assert _resolves("Distributed.all_or_none") and _resolves("training.distributed")
    assert not _resolves("flex.NO_SUCH_NAME") and not _resolves("Distributed.no_such_method")
    assert not _resolves("no_such_module.name")
    assert _resolves("SourceKV.k")  # KV's field, inherited
    assert sum(len(_dotted_names(p)) for p in PAGES) > 50


def test_the_extraction_finds_what_it_should():
    """The patterns take a whole path (not a pattern's stem or an output prefix), a test name and an identifier."""
    text = "`configs/multi30k-en-de-{muse,lightconv}.yaml`, src/sanlab/cli.py. tests/test_cli.py::test_x"
    assert PATH.findall(text) == ["src/sanlab/cli.py", "tests/test_cli.py"]
    assert TEST.findall(text) == [("tests/test_cli.py", "test_x")]
    assert OUTPUT.search("--out results/x", 0, len("--out "))
    assert IDENTIFIER.fullmatch("shared_files(config, run_dir)").group(1) == "shared_files"
    assert "use_vertical" in _code_words() and "capsule_encoder" not in _code_words()


# A backticked identifier that is no word of the code: other projects' (the reference implementations the specs
# read, fairseq's MUSE, sentencepiece's normalisation rule).
FOREIGN_WORDS = {
    "MultiHeadSelfAttentionconv", "MultiHeadSelfAttentionconv2d", "LinearOperatorCirculant", "Conv1D", "Conv2D",
    "ParallelMultiheadAttention", "MultiHead", "diag_gauss_mask_sigma", "diagonal_mask_width", "get_parameters",
    "multiplicative_attention", "weight_normalization", "encoder_attn_layer_norm", "nmt_nfkc",
}
IDENTIFIER = re.compile(r"([a-z][a-z0-9]*_\w+|[A-Z][a-z0-9]+[A-Z]\w*)(?:\(.*\))?")


@cache
def _code_words() -> frozenset[str]:
    paths = [path for d in (*CODE_DIRS, "configs") for path in (ROOT / d).rglob("*")
             if path.suffix in (".py", ".yaml", ".sh") and path.name != Path(__file__).name]  # not our lists
    return frozenset(word for path in paths for word in re.findall(r"\w+", path.read_text(encoding="utf-8")))


@_pages()
def test_named_identifiers_are_the_codes(page):
    """A backticked bare identifier, called or not (`stand_by`, `RunLayout`, `shared_files(config, run_dir)`,
    a part's setting `use_vertical`), is a word of src/, tests/, bench/, scripts/ or configs/: this is loose (any
    occurrence will do) but catches the name of a setting or function that is gone from the code entirely."""
    spans = SPAN.findall(re.sub(r"```.*?```", "", _prose(page), flags=re.S))
    named = {m.group(1) for span in spans if (m := IDENTIFIER.fullmatch(span.strip()))}
    missing = sorted(named - _code_words() - FOREIGN_WORDS)
    assert not missing, f"{page.relative_to(ROOT)} names identifiers the code does not have: {missing}"
