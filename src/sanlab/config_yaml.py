"""Reading config YAML: the loader (each key once per mapping, ``1e-3`` a float as in YAML 1.2, a key that
reads as a number kept as written), a file that must hold a mapping, the ``base:`` chain of a run config (a file
relative to it or ``preset:NAME``, its keys merged over the base's), dotted ``a.b.c=value`` assignments to a raw
config dict, the values YAML makes that a config does not take (dates, ``!!binary``, ``!!set``, keys that are not
names), and the dumper whose files this loader reads back. Nothing here knows the schema: ``sanlab.config``
validates what these return, and re-exports every public name.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from pathlib import Path

import yaml

from sanlab.errors import ConfigError

PRESETS = Path(__file__).parent / "presets"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML silently keeps the last one,
    so a second ``train:`` block would drop every key of the first)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    first_line: dict = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":  # "<<: *base" merges a mapping; SafeLoader handles it
            continue
        if key_node.tag in (_INT, _FLOAT):  # a key is a name: `2016:` is the test set "2016", `0x10:` "0x10"
            key_node.tag = _STR
        key = loader.construct_object(key_node, deep=True)
        try:
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice (first on line {first_line[key] + 1})",
                    key_node.start_mark)
            first_line[key] = key_node.start_mark.line
        except TypeError:  # an unhashable key: the base constructor reports it
            pass
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)

# Numbers as YAML 1.2 reads them, not PyYAML's YAML 1.1: there 0123 is octal (83), 1:30 base 60 (90), and 1e-3
# (no dot) a string. Anyone writing a seed or a learning rate means 123, "1:30" and 0.001; the config is then
# validated strictly, so what is not a number arrives as a string and is refused by name.
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_STR = "tag:yaml.org,2002:str"
_UniqueKeyLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag not in (_INT, _FLOAT)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_NUMBERS = [(_INT, re.compile(r"^(?:[-+]?[0-9][0-9_]*|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
            (_FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+0123456789."))]
for _tag, _regexp, _first in _NUMBERS:
    _UniqueKeyLoader.add_implicit_resolver(_tag, _regexp, _first)


def _construct_int(loader: _UniqueKeyLoader, node: yaml.ScalarNode) -> int:
    text = loader.construct_scalar(node).replace("_", "")
    if text.startswith(("0x", "0o")):
        return int(text[2:], 16 if text[1] == "x" else 8)
    return int(text, 10)  # leading zeros are decimal


_UniqueKeyLoader.add_constructor(_INT, _construct_int)


def _naming_the_line(construct):
    """``construct`` with its failure on a value an explicit tag forces (``!!int x``, ``!!float abc``, ``!!bool
    maybe``, ``!!timestamp x``: the implicit rules only ever tag what parses) as a YAML error naming the line, not a
    ValueError, KeyError or AttributeError traceback."""
    def checked(loader, node):
        try:
            return construct(loader, node)
        except (ValueError, KeyError, AttributeError, TypeError):
            kind = node.tag.rsplit(":", 1)[-1]
            raise yaml.constructor.ConstructorError(None, None, f"{node.value!r} is not a valid {kind}",
                                                    node.start_mark) from None
    return checked


for _tag in (_INT, _FLOAT, "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp"):
    _UniqueKeyLoader.add_constructor(_tag, _naming_the_line(_UniqueKeyLoader.yaml_constructors[_tag]))

if yaml.__with_libyaml__:
    class _FastUniqueKeyLoader(yaml.CSafeLoader):
        """The same rules over libyaml's C parser (several times faster; a run reads its config.yaml and its base
        chain's presets many times). Only resolving and constructing are Python's, and those are the ones above."""
        yaml_constructors = _UniqueKeyLoader.yaml_constructors
        yaml_implicit_resolvers = _UniqueKeyLoader.yaml_implicit_resolvers
else:  # a PyYAML built without libyaml
    _FastUniqueKeyLoader = None


# What libyaml reads otherwise than PyYAML (found by fuzzing the shipped configs): it accepts a tab after `key:` or
# inside a plain value, a `?` inside a flow collection and a block scalar's header followed by `#` (`|# why`), which
# PyYAML refuses (and its refusal names the line); it reads a bare `!` tag as '' (PyYAML: None, or an error), and it
# skips a byte-order mark at the start of any line, which PyYAML keeps as part of the key. Text with any of these is
# PyYAML's alone; no shipped config has one.
_PYYAML_ONLY = re.compile("[\t?!]|.\ufeff|[|>][-+0-9]*#", re.DOTALL)


def _load_file_text(text: str) -> object:
    if _FastUniqueKeyLoader is not None and not _PYYAML_ONLY.search(text):
        try:
            return yaml.load(text, Loader=_FastUniqueKeyLoader)
        except yaml.YAMLError:
            pass  # read again by PyYAML's parser: its message and position are the ones errors have always given
    return yaml.load(text, Loader=_UniqueKeyLoader)


class ConfigDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string this module's loader would read as something else (``1e5``, ``0o17``
    and ``1_000`` are numbers here, not in PyYAML's YAML 1.1), so that a run's ``config.yaml`` reads back as
    it was; and, keeping YAML 1.1's rules too, every string PyYAML's own loader would (``1:30``, base 60 there)."""


for _tag, _regexp, _first in _NUMBERS:  # besides SafeDumper's (YAML 1.1) resolvers: a string either reads
    ConfigDumper.add_implicit_resolver(_tag, _regexp, _first)  # as a number is quoted


def dump_yaml(data: dict) -> str:
    """``data`` as YAML that ``read_yaml_mapping`` reads back equal (keys in their order)."""
    return yaml.dump(data, Dumper=ConfigDumper, sort_keys=False)


def format_value(value: object) -> str:
    """One value as ``--set`` takes it back (``false``, ``[1, 2]``, ``{size: 3}``): YAML's spelling, not Python's."""
    text = yaml.dump(value, Dumper=ConfigDumper, default_flow_style=True, sort_keys=False, width=float("inf"))
    return text.removesuffix("...\n").strip()


def parse_value(text: str) -> object:
    """One YAML value as a config file reads it (``--set`` values)."""
    return yaml.load(text, Loader=_UniqueKeyLoader)


def read_yaml_mapping(path: Path, *, what: str = "config file") -> dict:
    """A YAML file that must hold a mapping (each key once); errors name the file and line."""
    try:
        data = _load_file_text(Path(path).read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a {what}") from None
    except OSError as err:  # unreadable (permissions), an I/O error
        raise ConfigError(f"{path}: cannot read this {what}: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        line = Path(path).read_bytes()[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}, line {line}: not valid UTF-8 (byte {err.object[err.start]:#04x} at offset "
                          f"{err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}{_yaml_where(err)}: not valid YAML: {_yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a {what} must be a mapping of keys, got {type(data).__name__}")
    return data


def _yaml_where(err: yaml.YAMLError) -> str:
    mark = getattr(err, "problem_mark", None)
    return f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""


def _yaml_problem(err: yaml.YAMLError) -> str:
    """PyYAML's message without its own position lines (they name "<unicode string>", not the file)."""
    if isinstance(err, yaml.MarkedYAMLError):
        parts = [err.context, err.problem]
        context = err.context_mark
        if err.context and context is not None and err.problem_mark is not None and \
                context.line != err.problem_mark.line:
            parts[0] = f"{err.context} (line {context.line + 1})"
        if err.problem and "'\\t'" in err.problem:  # PyYAML's words for a tab: "found character '\t' that ..."
            parts.append("YAML indents with spaces, not tabs")
        return "; ".join(p for p in parts if p) or str(err)
    return str(err)


def _replaces(old: dict, new: dict, *, empty_replaces: bool) -> bool:
    """Whether the mapping ``new`` replaces the mapping ``old`` instead of merging into it: when it switches a
    component's ``type`` (the old type's own keys, a muse mixer's ``kernel_sizes``, would be refused by the new
    one), and with ``empty_replaces`` when it is ``{}`` (how ``--set`` empties a section, e.g. a recipe's test
    sets; in a file, ``model: {}`` over a base adds nothing, as it always did)."""
    if empty_replaces and new == {}:
        return True
    return "type" in new and "type" in old and new["type"] != old["type"]


# Whether the mapping at a key path (``("data", "test")``) holds named entries, the config's own names (a test
# set's), not the schema's keys: a ``null`` given for such an entry removes it (``sanlab.config.named_entries``).
Named = Callable[[tuple[str, ...]], bool]


class NothingToRemove(ConfigError):
    """A ``null`` for a named entry (``Named``) that the mapping does not hold: ``key`` is its dotted key."""

    def __init__(self, key: str, entries: list) -> None:
        section, name = key.rsplit(".", 1)
        held = f"its entries: {', '.join(map(str, entries))}" if entries else "it has none"
        super().__init__(f"{key}: null removes the entry {name!r} of {section}, which has none of that name ({held})")
        self.key = key


def _remove(mapping: dict, name: str, at: tuple[str, ...]) -> None:
    """Remove the named entry ``name`` from ``mapping`` (the one at the key path ``at``), or ``NothingToRemove``."""
    if name not in mapping:
        raise NothingToRemove(".".join((*at, name)), list(mapping))
    del mapping[name]


def merge_mapping(base: dict, over: dict, *, empty_replaces: bool = False, named: Named | None = None,
                  at: tuple[str, ...] = ()) -> dict:
    """``over``'s keys merged over ``base``'s, section by section (a copy): how a file is merged over its
    ``base:`` and, ``empty_replaces``, a mapping given to ``--set`` (or a grid's ``set:``) over its section. A
    mapping that ``_replaces`` the one there, and any other value (a list, a number), replaces it whole. With
    ``named``, a ``null`` for an entry of a mapping of names removes it (``NothingToRemove`` if it is not there);
    ``at`` is the key path of ``base``."""
    out = dict(base)
    for key, value in over.items():
        if value is None and named is not None and named(at):
            _remove(out, key, at)
            continue
        old = out.get(key)
        merges = isinstance(value, dict) and isinstance(old, dict) and \
            not _replaces(old, value, empty_replaces=empty_replaces)
        if isinstance(value, dict) and named is not None:  # (merged over nothing, to find nulls with nothing to remove)
            value = merge_mapping(old if merges else {}, value, empty_replaces=empty_replaces, named=named,
                                  at=(*at, str(key)))
        elif merges:
            value = merge_mapping(old, value, empty_replaces=empty_replaces)
        out[key] = value
    return out


def load_raw(path: str | Path, _seen: tuple = ()) -> dict:
    """Read a YAML config, resolving its ``base:`` chain (each file's keys merged over its base's)."""
    return merge_chain(load_chain(path, _seen))


def merge_chain(chain: list[tuple[Path, dict]], *, named: Named | None = None) -> dict:
    """The config a ``load_chain`` describes: each file's keys merged over its base's (``named``: as
    ``merge_mapping``; a null with nothing to remove is named with its file and line)."""
    merged: dict = {}
    for path, own in reversed(chain):
        try:
            merged = merge_mapping(merged, own, named=named)
        except NothingToRemove as err:
            line = key_line(path, err.key)
            raise ConfigError(f"{path}" + (f", line {line}" if line is not None else "") + f": {err}") from None
    return merged


def load_chain(path: str | Path, _seen: tuple = ()) -> list[tuple[Path, dict]]:
    """``[(path, its own keys), (its base, the base's own keys), ...]``: the ``base:`` chain, the file itself
    first, so that a key can be traced to the file that sets it (``key_origin``)."""
    path = Path(path)
    data = read_yaml_mapping(path)
    base = data.pop("base", None)
    if base is None:
        return [(path, data)]
    base_path, seen = base_file(path, base), _seen + (path.resolve(),)
    if base_path.resolve() in seen:  # named at the `base:` that closes the loop, with the file it leads back to
        raise ConfigError(f"{_base_line(path)}: base {base!r} loops back to {base_path.resolve()}, which is already "
                          "in the 'base' chain")
    return [(path, data), *load_chain(base_path, seen)]


def _base_line(path: Path) -> str:
    line = key_line(path, "base")
    return f"{path}" + (f", line {line}" if line is not None else "")


def base_file(path: Path, base: object) -> Path:
    """The file that ``base: BASE`` in the file ``path`` (a config or a grid) names: relative to ``path``, or
    ``preset:NAME``; a ConfigError naming ``path`` and the line of its ``base:`` if there is none."""
    if not isinstance(base, str) or not base.strip():
        raise ConfigError(f"{_base_line(path)}: base must be a file name (relative to this file) or preset:NAME, "
                          f"got {base!r}")
    base_path = PRESETS / f"{base[7:]}.yaml" if base.startswith("preset:") else Path(path).parent / base
    if base.startswith("preset:") and not base_path.exists():
        known = ", ".join(sorted(p.stem for p in PRESETS.glob("*.yaml")))
        raise ConfigError(f"{_base_line(path)}: unknown preset {base!r}; known presets: {known}")
    if not base_path.is_file():
        problem = "is a directory, not a config file" if base_path.is_dir() else "config file not found"
        raise ConfigError(f"{_base_line(path)}: base {base!r}: {base_path}: {problem}")
    return base_path


def key_origin(chain: list[tuple[Path, dict]], dotted: str) -> Path | None:
    """The file of a ``load_chain`` whose value of the key ``a.b.c`` the merged config holds: the first, from
    the file itself down its bases, that sets it."""
    def has(data: dict, parts: list[str]) -> bool:
        for part in parts:
            if isinstance(data, list) and part.isdigit() and int(part) < len(data):  # list items: name.0
                data = data[int(part)]
            elif isinstance(data, dict) and part in (names := {str(k): k for k in data}):
                data = data[names[part]]  # (a key that is not a name, ``no:``, is named "False" in the path)
            else:
                return False
        return True

    parts = dotted.split(".")
    return next((p for p, own in chain if has(own, parts)), None)


def sets_key(names, key: str) -> bool:
    """Whether assigning the dotted ``names`` set the key ``key``: itself, a mapping or list that holds it,
    or a key inside it (which made the mapping ``key`` names). For tracing an invalid key to its setter."""
    return any(key == name or key.startswith(name + ".") or name.startswith(key + ".") for name in names)


def assigned_keys(overrides: list[str] | dict) -> list[str]:
    """The dotted keys that ``overrides`` (``k=v`` strings, or a mapping of dotted keys to values) set, for
    ``sets_key``. A mapping value merges into its section key by key (``set_key``), so ``train={lr: 0.5}`` sets
    train.lr, not every key of train; an empty mapping, or one naming a component ``type``, may replace its
    section whole and counts as setting all of it."""
    pairs = ([(a.split("=", 1)[0].strip(), parse_value(a.split("=", 1)[1])) for a in overrides if "=" in a]
             if isinstance(overrides, list) else [(str(k), v) for k, v in overrides.items()])

    def leaves(key: str, value: object) -> list[str]:
        if isinstance(value, dict) and value and "type" not in value:
            return [name for k, v in value.items() for name in leaves(f"{key}.{k}", v)]
        return [key]

    return [name for key, value in pairs for name in leaves(key, value)]


def key_line(path: Path, dotted: str) -> int | None:
    """The line (1-based) of ``path`` that sets the key ``a.b.c``, or of the nearest enclosing key it sets
    (a schema's location may end in names the file does not spell, e.g. a variant's type tag; list items count
    as ``name.0``; a key YAML reads as a bool, null or date is named as the value it reads as, ``False``);
    None if the file sets none of it. The file is parsed again: this is for error messages."""
    try:
        loader = _UniqueKeyLoader(Path(path).read_text(encoding="utf-8"))
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None

    def named(key: yaml.Node, part: str) -> bool:
        if not isinstance(key, yaml.ScalarNode) or key.tag == "tag:yaml.org,2002:merge":
            return False
        if key.value == part:
            return True
        try:  # `no:` read as False, `2016-01-01:` as a date: the name the dotted path gives them
            return key.tag not in (_STR, _INT, _FLOAT) and str(loader.construct_object(key)) == part
        except yaml.YAMLError:
            return False

    found = None
    for part in dotted.split("."):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if named(k, part)), None)
            if match is None:
                continue  # a name the schema adds (a type tag): keep looking below the same node
            found, node = match[0].start_mark.line + 1, match[1]
        elif isinstance(node, yaml.SequenceNode) and part.isdigit() and int(part) < len(node.value):
            node = node.value[int(part)]
            found = node.start_mark.line + 1
    return found


# Values YAML makes that a config has no use for: a date or timestamp (``2016-01-01``, a file or test set name
# unquoted), ``!!binary`` and ``!!set``. Validating through JSON would turn them into text of another spelling.
_NOT_CONFIG_VALUES = {datetime.datetime: "a timestamp", datetime.date: "a date", bytes: "binary data (!!binary)",
                      set: "a set (!!set)"}


def _what(value: object) -> str | None:
    """What YAML read ``value`` as, if a config does not take it."""
    return next((what for kind, what in _NOT_CONFIG_VALUES.items() if isinstance(value, kind)), None)


def _key_problem(key: object) -> str | None:
    """Why the mapping key ``key`` is not a name, or None (a string)."""
    if isinstance(key, str):
        return None
    if isinstance(key, bool):
        return f"a key YAML reads as the boolean {str(key).lower()} (an unquoted yes, no, on, off, true or false)"
    if key is None:
        return "a key YAML reads as null (an unquoted ~ or null, or no key at all)"
    return f"the key {key} is {_what(key) or type(key).__name__} in YAML, not a name"


def unsupported_values(raw: object, path: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """``(dotted key, where it is shown, problem)`` for each key of ``raw`` that is not a string, shown at the
    mapping that holds it, and each value a config does not take (``_NOT_CONFIG_VALUES``), so that validation
    never renames or respells them. A key is named in the dotted key as ``str(key)`` (``False``), as
    ``key_origin`` and ``key_line`` find it; a list item as its index."""
    found = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            problem = _key_problem(key)
            if problem:
                found.append((".".join((*path, str(key))), ".".join(path), f"{problem}: write the name in quotes"))
            found += unsupported_values(value, (*path, str(key)))
    elif isinstance(raw, (list, tuple)):
        for index, item in enumerate(raw):
            found += unsupported_values(item, (*path, str(index)))
    elif _what(raw):
        dotted = ".".join(path)
        found.append((dotted, dotted, f"YAML reads this value as {_what(raw)} ({raw}), which a config does not "
                                      f"take: write it in quotes if it is a name or text"))
    return found


def apply_override(raw: dict, assignment: str, *, named: Named | None = None) -> dict:
    """Apply one ``a.b.c=value`` (value parsed as YAML) to a raw config dict (``named``: as ``set_key``)."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected KEY=VALUE, e.g. model.encoder.layers=3")
    key, text = assignment.split("=", 1)
    try:
        value = parse_value(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"--set {key}: value {text!r} is not valid YAML: {err}") from None
    try:
        set_key(raw, key, value, merge=True, named=named)  # a mapping merges into its section, as a grid's `set:`
    except ConfigError as err:
        raise ConfigError(f"--set {err}") from None
    return raw


def set_key(raw: dict, key: str, value: object, *, merge: bool = False, named: Named | None = None,
            at: tuple[str, ...] = ()) -> None:
    """Set the dotted ``key`` of a raw config dict to ``value``. Missing sections, and null ones, are created;
    a number indexes an item of a list that is there (``model.encoder.attention.parts.0.size``), or names a key
    of a mapping (``data.test.2016``). With ``merge``, a mapping value is merged into a mapping already at
    ``key``, key by key (a dotted key in it is a path, as on the command line); ``{}``, or another component
    ``type``, replaces it instead, there or below (``_replaces``). With ``named``, a null for an entry of a
    mapping of names removes it (``merge_mapping``); ``at`` is the key path of ``raw`` in the config."""
    node, parts = raw, key.strip().split(".")
    if not all(p.strip() for p in parts):
        raise ConfigError(f"{key!r}: an empty key name (expected a dotted key such as train.max_steps)")
    for depth, part in enumerate(parts):
        where = ".".join(parts[:depth]) or "the config"
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"{key}: {where} is a list of {len(node)} item(s); {part!r} is not an index of it")
            part = int(part)
        elif not isinstance(node, dict):
            raise ConfigError(f"{key}: {where} is a value, not a section")
        elif part not in node and (item := re.fullmatch(r"(.+)\[(\d+)\]", part)) and \
                isinstance(node.get(item[1]), list):  # `parts[0]` would become a key beside the list `parts`
            dotted = ".".join((*parts[:depth], *item.groups(), *parts[depth + 1:]))
            raise ConfigError(f"{key}: {'.'.join((*parts[:depth], item[1]))} is a list, whose items are named by "
                              f"their index after a dot: {dotted}")
        if depth == len(parts) - 1:
            path = (*at, *parts[:depth])
            if value is None and named is not None and isinstance(node, dict) and named(path):
                _remove(node, part, path)
                return
            old = node[part] if isinstance(node, list) else node.get(part)
            merges = merge and isinstance(value, dict) and isinstance(old, dict) and \
                not _replaces(old, value, empty_replaces=True)
            if not merges:
                if isinstance(value, dict) and named is not None:  # (nulls in it have nothing to remove)
                    value = merge_mapping({}, value, empty_replaces=merge, named=named, at=(*path, str(part)))
                node[part] = value
                return
            for sub, item in value.items():  # key by key, so that a dotted one (`{encoder.layers: 2}`) is a path
                set_key(old, str(sub), item, merge=True, named=named, at=(*path, str(part)))
            return
        # a null there is a section not given: a saved config spells one out (`cross_attention: null`)
        if isinstance(node, dict) and node.get(part) is None:
            if parts[depth + 1].isdigit():  # a list index or a mapping's key: the missing section could be either
                section, name = ".".join(parts[:depth + 1]), parts[depth + 1]
                raise ConfigError(f"{key}: {section} is not set in the file, so it has no item {name}: give the "
                                  f"whole section ({section}=[...] for a list, {section}={{'{name}': ...}} for a "
                                  "mapping)")
            node[part] = {}
        node = node[part]

