"""Typed configuration: dataclass schemas + YAML overrides + dotted command-line overrides.

The schemas (dataclasses) are the only home of defaults and help text. A YAML file holds
overrides only; ``a.b.c=value`` on the command line overrides both, with the value parsed as a
YAML scalar or list. Every mistake is a :class:`UserError` naming the key and where it came from:
unknown keys (with the closest valid key suggested), wrong types, bad choices.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from alignctl.errors import UserError

T = TypeVar("T")


class ConfigErrors(UserError):
    """Every mistake found in one pass over a config, most important first (a missing required key,
    an unknown key, a wrong type or value, then a refusal of the schema's cross-key checks). The
    CLI prints one ``error:`` line each; ``str()`` joins them for a library caller."""

    def __init__(self, messages: list[str]) -> None:
        self.messages = [" ".join(m.split("\n")) for m in messages]
        super().__init__(" | ".join(self.messages))

    def prefixed(self, prefix: str) -> ConfigErrors:
        return ConfigErrors([m if m.startswith(prefix) else f"{prefix}: {m}" for m in self.messages])


# How to write a list or a section, named in the message of a value that is not one.
LIST_EXAMPLE = "write a list as key=[a, b] on the command line or key: [a, b] in YAML"
SECTION_EXAMPLE = "write a section as key.sub=value on the command line or key: {sub: value} in YAML"

# Top-level keys any stage file may carry without being part of the stage's schema.
META_KEYS = ("stage",)


def field(default: Any = dataclasses.MISSING, *, help: str, choices: tuple[Any, ...] | None = None,
          default_factory: Any = dataclasses.MISSING, ge: float | None = None, gt: float | None = None,
          le: float | None = None, same_result: bool = False) -> Any:
    """A dataclass field with help text (shown by ``config show --help-keys`` and the docs).

    ``ge`` / ``gt`` / ``le`` bound a number (each item of a list of numbers); null passes. Bounds
    are checked when the config is built, so a bad value fails before anything runs.
    ``same_result``: the setting changes how a stage runs, never what it produces (a test shows
    it), so it stays out of the pipeline cache key (:func:`result_dict`)."""
    metadata = {"help": help, "choices": choices, "bounds": (ge, gt, le), "same_result": same_result}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type[T], *, help: str) -> Any:
    """A nested config section (a dataclass whose defaults are its own)."""
    return dataclasses.field(default_factory=cls, metadata={"help": help, "choices": None})


# ---------------------------------------------------------------------------------- reading


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, except that a key given twice in one mapping is an error: PyYAML keeps
    the last silently, so a second ``lr:`` (or a second stage of the same name) would win unseen."""


def _strict_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    seen: dict[Any, Any] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:  # ``? [a]`` makes a list key: a config key is a name, never a list or mapping
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a name, got a {type(key).__name__}", key_node.start_mark) from None
        if key in seen:
            first = seen[key]
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first given on line {first.line + 1})", key_node.start_mark)
        seen[key] = key_node.start_mark
    return loader.construct_mapping(node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _strict_mapping)


def load_yaml(text: str) -> Any:
    """Parse YAML text safely, refusing duplicate keys."""
    return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; errors name the file (and line for syntax)."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: config file not found")
    if path.is_dir():
        raise UserError(f"{path}: expected a YAML file, got a folder")
    try:
        data = load_yaml(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise UserError(f"{path}:{where} invalid YAML: {exc.problem}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys at the top level, "
                        f"got {type(data).__name__}")
    return data


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a", "b", "c"], value parsed as YAML)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise UserError(f"command-line override {text!r}: expected KEY=VALUE with a dotted key, e.g. trainer.total_epochs=2")
    try:
        # A bare "~" is YAML's null, but on a command line it means the home folder.
        value = raw.strip() if raw.strip() == "~" else (load_yaml(raw) if raw.strip() else "")
    except yaml.YAMLError:
        value = _with_quoted_references(raw)
    return key.split("."), value


# A pipeline reference (``${stage}`` and an optional /sub/path) not already inside quotes.
_BARE_REFERENCE = re.compile(r"""(?<!["'\w])(\$\{[^}]*\}[^,\]\}\s]*)""")


def _with_quoted_references(raw: str) -> Any:
    """``[${data}/a.parquet]`` is no YAML (``{`` opens a mapping inside a list): read it with each
    ``${...}`` reference quoted, as the user meant; anything else unparsable stays a plain string
    (type checking follows)."""
    quoted = _BARE_REFERENCE.sub(r'"\1"', raw)
    if quoted != raw:
        try:
            return load_yaml(quoted)
        except yaml.YAMLError:
            pass
    return raw


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> set[str]:
    """Set each override into the nested ``data`` dict in place; returns the dotted keys set."""
    keys = set()
    for text in overrides:
        path, value = parse_override(text)
        set_dotted(data, path, value, text)
        keys.add(".".join(path))
    return keys


def set_dotted(data: dict[str, Any], path: list[str], value: Any, text: str | None = None) -> None:
    node = data
    for i, part in enumerate(path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, dict):
            prefix = ".".join(path[: i + 1])
            raise UserError(f"command-line override {text or '.'.join(path)!r}: key {prefix!r} is a value, not a section")
        node = child
    node[path[-1]] = value


# ---------------------------------------------------------------------------------- building


@dataclasses.dataclass
class _Origin:
    """Where values came from, to name it in errors; the errors found so far."""

    file: str | None
    override_keys: set[str]
    errors: list[str] = dataclasses.field(default_factory=list)

    def of(self, dotted: str) -> str:
        dotted = dotted.split("[", 1)[0]  # list items belong to their key
        if any(k == dotted or k.startswith(dotted + ".") for k in self.override_keys):
            return "command-line override"
        return self.file or "config"


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is not None:
        return str(tp).replace("typing.", "")
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, key: str, origin: _Origin) -> Any:
    """Check ``value`` against the annotation ``tp``; allow only lossless conversions."""
    kind = typing.get_origin(tp)
    example = LIST_EXAMPLE if kind in (list, tuple) else SECTION_EXAMPLE if (kind is dict or tp is dict) else ""
    bad = UserError(f"{origin.of(key)}: key {key!r} expected {_type_name(tp)}, got {value!r}"
                    + (f" ({example})" if example else ""))
    if tp is Any:
        return value
    if kind in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, origin)
            except UserError:
                continue
        raise bad
    if kind is typing.Literal:
        if value in typing.get_args(tp):
            return value
        raise bad
    if kind in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        (item_tp, *_) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item_tp, f"{key}[{i}]", origin) for i, v in enumerate(value)]
    if kind is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad
        item_tp = (typing.get_args(tp) or (Any, Any))[-1]
        if dataclasses.is_dataclass(item_tp):  # named sections, e.g. trainer.pools.<name>.*
            return {str(k): _build(item_tp, v, f"{key}.{k}", origin) for k, v in value.items()}
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise bad
    if tp is float:
        number = _as_float(value)
        if number is None:
            raise bad
        if not math.isfinite(number):  # nan / inf would train silently on garbage (lr=inf, temperature=nan)
            raise UserError(f"{origin.of(key)}: key {key!r} expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. a numeric id
        raise bad
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key, origin)
    raise bad


def _as_float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" as a string
        try:
            return float(value)
        except ValueError:
            return None
    return None


def _suggest(name: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _build(cls: type[T], data: Any, prefix: str, origin: _Origin) -> T:
    """The schema instance; a bad key or value is noted in ``origin.errors`` and its default kept,
    so that one pass finds every mistake (the caller raises them together)."""
    where = prefix or "top level"
    if not isinstance(data, dict):
        raise UserError(f"{origin.of(prefix)}: key {where!r} expected a section (mapping), got {data!r} "
                        f"({SECTION_EXAMPLE})")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for name, value in data.items():
        dotted = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            if not prefix and name in META_KEYS:
                continue
            valid = sorted(fields)
            full_valid = [f"{prefix}.{v}" if prefix else v for v in valid]
            origin.errors.append(f"{origin.of(dotted)}: unknown config key {dotted!r}"
                                 f"{_suggest(dotted, full_valid) or _suggest(str(name), valid)}")
            continue
        try:
            kwargs[name] = _coerce(value, hints[name], dotted, origin)
        except UserError as exc:
            origin.errors.append(str(exc))
    try:
        obj = cls(**kwargs)
    except TypeError as exc:  # a required field without default
        raise UserError(f"{origin.of(prefix)}: section {where!r}: {exc}") from None
    _check_choices(obj, prefix, origin)
    return obj


def _check_choices(obj: Any, prefix: str, origin: _Origin) -> None:
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        value = getattr(obj, f.name)
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        if choices and value not in choices:
            origin.errors.append(f"{origin.of(dotted)}: key {dotted!r} expected one of "
                                 f"{', '.join(map(str, choices))}, got {value!r}")
            _reset(obj, f)
            continue
        bounds = f.metadata.get("bounds")
        if bounds and any(b is not None for b in bounds):
            for item in value if isinstance(value, list) else [value]:
                # Bounds bound numbers; a word a field also allows (cpus_per_worker: auto) is not one.
                if isinstance(item, (int, float)) and not _within(item, *bounds):
                    noun = "an integer" if isinstance(item, int) else "a number"
                    origin.errors.append(f"{origin.of(dotted)}: key {dotted!r} expected "
                                         f"{describe_bounds(*bounds).replace('a number', noun)}, got {value!r}")
                    _reset(obj, f)
                    break


def _reset(obj: Any, f: dataclasses.Field[Any]) -> None:
    """A refused value back to its default, so that the cross-key checks that run next judge the rest
    of the config, not the value already reported."""
    if f.default is not dataclasses.MISSING:
        setattr(obj, f.name, f.default)
    elif f.default_factory is not dataclasses.MISSING:
        setattr(obj, f.name, f.default_factory())


def _within(value: float, ge: float | None, gt: float | None, le: float | None) -> bool:
    # NaN never gets here: _coerce refuses non-finite numbers before bounds are checked
    return (ge is None or value >= ge) and (gt is None or value > gt) and (le is None or value <= le)


def describe_bounds(ge: float | None, gt: float | None, le: float | None) -> str:
    """'a number > 0', 'a number in [0, 1]' ... (error messages and the config reference)."""
    parts = [f">= {ge:g}" if ge is not None else "", f"> {gt:g}" if gt is not None else "",
             f"<= {le:g}" if le is not None else ""]
    return "a number " + " and ".join(p for p in parts if p)


REQUIRED_PLACEHOLDER = "<required>"
REQUIRED_MESSAGE = re.compile(r"key '([A-Za-z0-9_.]+)' is required")
_NAMED_KEY = re.compile(r"key '([A-Za-z0-9_.\[\]]+)'")


def build_config(cls: type[T], data: dict[str, Any], *, file: str | None = None,
                 override_keys: set[str] | None = None) -> T:
    """Build and validate a schema instance from a nested dict; every mistake at once
    (:class:`ConfigErrors`, one message when there is one)."""
    origin = _Origin(file, override_keys or set())
    obj = _build(cls, data, "", origin)
    required, refusal = validation_refusals(obj)
    bad_keys = {m.group(1).split("[")[0] for m in map(_NAMED_KEY.search, origin.errors) if m}
    if refusal and origin.errors:
        refusal = None  # judged with defaults standing in for the values already reported: likely noise
    required = [m for m in required if (found := REQUIRED_MESSAGE.search(m)) and found.group(1) not in bad_keys]
    messages = required + sorted(origin.errors, key=lambda m: "unknown config key" not in m) + \
        ([refusal] if refusal else [])
    if len(messages) == 1:
        raise UserError(messages[0])
    if messages:
        raise ConfigErrors(messages)
    return obj


def validation_refusals(obj: Any) -> tuple[list[str], str | None]:
    """Run the schema's ``validate()`` (which stops at its first refusal) until it passes or refuses
    something other than a missing required key: each missing key it names is filled with
    :data:`REQUIRED_PLACEHOLDER` and the check runs again. Returns (the missing-key messages, the
    other refusal or None); ``obj`` keeps the placeholders (``config show`` prints them)."""
    validate = getattr(obj, "validate", None)
    required: list[str] = []
    while callable(validate):
        try:
            validate()
            return required, None
        except UserError as exc:
            found = REQUIRED_MESSAGE.search(str(exc))
            if found is None or not _fill_required(obj, found.group(1)) or len(required) > 32:
                return required, str(exc)
            required.append(str(exc))
    return required, None


def _fill_required(obj: Any, dotted: str) -> bool:
    """Set ``dotted`` to the placeholder (a one-item list for a list key); False when it is no key."""
    *parents, name = dotted.split(".")
    for part in parents:
        obj = getattr(obj, part, None)
    if obj is None or not dataclasses.is_dataclass(obj) or not hasattr(obj, name):
        return False
    current = getattr(obj, name)
    if current not in (None, "", []) and current != [REQUIRED_PLACEHOLDER]:
        return False  # set, yet refused: filling it would hide the refusal
    setattr(obj, name, [REQUIRED_PLACEHOLDER] if isinstance(current, list) else REQUIRED_PLACEHOLDER)
    return True


def build_unvalidated(cls: type[T], data: dict[str, Any], *, file: str | None = None) -> T:
    """The schema instance without its cross-key checks (``config show`` of bare defaults)."""
    origin = _Origin(file, set())
    obj = _build(cls, data, "", origin)
    if origin.errors:
        raise UserError(origin.errors[0]) if len(origin.errors) == 1 else ConfigErrors(origin.errors)
    return obj


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None,
                *, base: dict[str, Any] | None = None, flags: dict[str, Any] | None = None,
                check: bool = True) -> T:
    """Defaults of ``cls`` <- ``base`` dict <- YAML file at ``path`` <- command-line ``flags``
    (already typed, dotted keys) <- dotted ``overrides`` (``a.b=value`` strings). ``check=False``
    skips the schema's cross-key checks (required keys included)."""
    data: dict[str, Any] = merge_dicts({}, base or {})
    if path is not None:
        data = merge_dicts(data, read_yaml_mapping(path))
    keys = set()
    for dotted, value in (flags or {}).items():
        if value is not None:
            set_dotted(data, dotted.split("."), value)
            keys.add(dotted)
    keys |= apply_overrides(data, list(overrides or []))
    if not check:
        return build_unvalidated(cls, data, file=str(path) if path else None)
    return build_config(cls, data, file=str(path) if path else None, override_keys=keys)


def merge_dicts(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """Deep merge ``other`` into a copy of ``into`` (sections merge, values replace)."""
    out = dict(into)
    for key, value in other.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_dicts(out[key], value)
        elif isinstance(value, dict):  # copied too: overrides are set into the result in place
            out[key] = merge_dicts({}, value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------------- output


def to_dict(obj: Any) -> dict[str, Any]:
    """A schema instance as plain nested dicts (what is written into artifacts)."""
    return dataclasses.asdict(obj)


def result_dict(obj: Any) -> dict[str, Any]:
    """``to_dict`` without the ``same_result`` fields: what decides a stage's artifact."""
    out = to_dict(obj)

    def prune(value: Any, data: dict[str, Any]) -> None:
        for item in dataclasses.fields(value):
            if item.metadata.get("same_result"):
                data.pop(item.name, None)
            elif dataclasses.is_dataclass(getattr(value, item.name)):
                prune(getattr(value, item.name), data[item.name])

    prune(obj, out)
    return out


def seed_settings(obj: Any) -> list[str]:
    """Every seed key of a schema instance as ``dotted.key=value``, in schema order: what a run
    prints so that a result can be reproduced (the seeds decide init, sampling and data order)."""
    found: list[str] = []

    def walk(value: Any, prefix: str) -> None:
        for key, item in value.items():
            if isinstance(item, dict):
                walk(item, f"{prefix}{key}.")
            elif key == "seed" or key.endswith("_seed"):
                found.append(f"{prefix}{key}={item}")

    walk(to_dict(obj), "")
    return found


def to_yaml(obj: Any) -> str:
    return yaml.safe_dump(to_dict(obj), sort_keys=False, default_flow_style=False)


def iter_keys(cls: type, prefix: str = "") -> typing.Iterator[tuple[str, str, Any, str]]:
    """(dotted key, type name, default, help) for every leaf key of a schema, in order."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            yield from iter_keys(tp, dotted)
            continue
        item_tp = (typing.get_args(tp) or (Any, Any))[-1] if typing.get_origin(tp) is dict else None
        if item_tp is not None and dataclasses.is_dataclass(item_tp):  # named sections: one row, then its keys
            yield dotted, f"mapping of name -> {item_tp.__name__}", f.default_factory(), f.metadata.get("help", "")
            yield from iter_keys(item_tp, f"{dotted}.<name>")
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        bounds = f.metadata.get("bounds") or (None, None, None)
        limits = describe_bounds(*bounds).removeprefix("a number ") if any(b is not None for b in bounds) else ""
        yield dotted, f"{_type_name(tp)} {limits}".strip(), default, f.metadata.get("help", "")
