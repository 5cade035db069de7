"""What the config loader does to the raw YAML before validation: parse it within bounds, resolve its paths;
and the bounds on what a config error prints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from core.files import InputFileError, read_text

MAX_CONFIG_BYTES = 256 << 10  # a build config is a few KB; an explicit 256-node tree is under 100 KB
MAX_READ_BYTES = 16 << 20  # read at most this much; load_yaml then says how far over MAX_CONFIG_BYTES a file is
MAX_NODES = 100_000  # scalars + containers after YAML alias expansion
MAX_PROBLEMS = 50  # config errors printed
MAX_PROBLEM_CHARS = 1600  # characters of one printed problem (the longest message we write is ~800)


class ConfigError(Exception):
    """Raised with every problem found in a config; `problems` is a list of one-line messages."""

    def __init__(self, problems: list[str], source: str = "config") -> None:
        self.problems = problems
        shown = bounded_problems(problems)
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  - {p}" for p in shown))


class _UniqueKeys(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key written twice in one mapping (PyYAML keeps the last silently, so a second
    `engine:` section would replace the first unseen). Merge keys (`<<: *base`) still work: a key given beside a
    merge overrides the merged one, as YAML specifies."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _value in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: SafeLoader refuses it itself
                continue
            if first is not None:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} at line {line} (first at line {first}): the later value would "
                    "silently replace the earlier one; keep one", key_node.start_mark)
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def safe_load_unique(text: str) -> Any:
    """yaml.safe_load, refusing duplicate keys (_UniqueKeys)."""
    return yaml.load(text, Loader=_UniqueKeys)  # a SafeLoader subclass: no arbitrary objects


def load_yaml(text: str, source: str) -> dict[str, Any]:
    """YAML -> a mapping, refusing oversized text and alias expansion beyond MAX_NODES (an alias bomb is a few
    lines that expand to billions of nodes: every consumer after the parser would walk them)."""
    if len(text.encode()) > MAX_CONFIG_BYTES:
        raise ConfigError([f"the file has {len(text.encode()):,} bytes; a build config is at most "
                           f"{MAX_CONFIG_BYTES:,} (a few KB is usual): use a tree preset or a shorter list"], source)
    try:
        data = safe_load_unique(text)
    except yaml.YAMLError as e:
        raise ConfigError([f"malformed YAML: {bounded(str(e))}"], source) from None
    except RecursionError:
        raise ConfigError([NESTED], source) from None
    problem = expansion_problem(data)
    if problem:
        raise ConfigError([problem], source)
    if not isinstance(data, dict):
        raise ConfigError([f"top level must be a mapping of sections, got {type(data).__name__}"], source)
    return data


NESTED = ("YAML nested too deeply to read (lists or mappings inside each other thousands of levels deep); a build "
          "config is a few sections of plain values")


def expansion_problem(data: object) -> str | None:
    """Count nodes as every consumer sees them (each alias use counts again); stop at MAX_NODES."""
    stack, seen = [data], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return (f"the config expands to more than {MAX_NODES:,} values (YAML anchors and aliases repeat what "
                    "they name, and a self-referencing alias never ends); write the values out without aliases")
        if isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def choices_problem(value: object, limit: int) -> str | None:
    """tree.choices bounded before the tree is built: at most `limit` paths of at most `limit` ranks."""
    if not isinstance(value, list):
        return None
    if len(value) > limit:
        return f"{len(value)} paths; TensorRT-LLM allows at most {limit} draft tokens (tree nodes)"
    long = next((p for p in value if isinstance(p, list) and len(p) > limit), None)
    if long is not None:
        return f"a path of {len(long)} ranks; a tree is at most {limit} deep"
    return None


def bounded(text: str, limit: int = MAX_PROBLEM_CHARS) -> str:
    if len(text) <= limit:
        return text
    # Head and tail: a message ends with its fix, and the value echoed in its middle is what can be megabytes.
    half = limit // 2
    return f"{text[:half]}... ({len(text) - 2 * half:,} more characters) ...{text[-half:]}"


def bounded_problems(problems: list[str]) -> list[str]:
    """At most MAX_PROBLEMS problems of at most MAX_PROBLEM_CHARS characters each (a value echoed in an error can
    be megabytes)."""
    shown = [bounded(p) for p in problems[:MAX_PROBLEMS]]
    if len(problems) > MAX_PROBLEMS:
        shown.append(f"... and {len(problems) - MAX_PROBLEMS} more problem(s); fix these first")
    return shown


PATH_FIELDS = (("target", "model"), ("draft", "model"), ("draft", "draft_vocab"), ("tree", "schedule_file"),
               ("monitoring", "calibration_prompts"), ("capture", "dir"), ("refresh", "reference_prompts"),
               (None, "output_dir"))


def resolve_paths(data: dict[str, Any], base: Path) -> list[str]:
    """Resolve relative paths against the config's directory; an empty one is refused (it would silently mean
    that directory)."""
    problems = []
    for section, key in PATH_FIELDS:
        sec = data if section is None else data.get(section)
        if not isinstance(sec, dict) or not isinstance(sec.get(key), str):
            continue
        if not sec[key].strip():
            where = key if section is None else f"{section}.{key}"
            problems.append(f"{where}: empty path {sec[key]!r}; give a path (relative paths are relative to the "
                            "config file)")
            sec.pop(key)
            continue
        sec[key] = resolve_path(sec[key], base)
    return problems


def resolve_path(value: str, base: Path) -> str:
    if value == "random" or value.startswith("pip:"):
        return value
    p = Path(value).expanduser()
    return str(p if p.is_absolute() else (base / p).resolve())


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> list[str]:
    """Apply `a.b=value` overrides in place (value parsed as YAML). Returns problems."""
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"--set {item!r}: expected KEY=VALUE, e.g. --set engine.max_batch_size=8")
            continue
        node = data
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                problems.append(f"--set {item!r}: {part!r} is not a section")
                break
            node = child
        else:
            try:
                node[parts[-1]] = safe_load_unique(raw) if raw != "" else ""
            except yaml.constructor.ConstructorError as e:
                problems.append(f"--set {item!r}: {bounded(str(e.problem))}")
            except yaml.YAMLError as e:
                problems.append(f"--set {item!r}: the value is not valid YAML ({e.__class__.__name__}); quote it")
            except RecursionError:
                problems.append(f"--set {bounded(item, 200)!r}: {NESTED}")
    return problems


def format_pydantic(err: ValidationError) -> list[str]:
    out = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            out.append(f"{loc}: unknown key (value {bounded(repr(e['input']), 200)}); remove it or check the spelling")
        elif e["type"] == "missing":
            out.append(f"{loc}: required field is missing; add it")
        elif e["type"] == "value_error" and not e["loc"]:
            msg = str(e["ctx"]["error"]) if "ctx" in e else e["msg"]
            out.extend(msg.split("\n"))
        else:
            out.append(f"{loc}: {e['msg']} (got {bounded(repr(e['input']), 200)})")
    return out


def read_config(path: Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The one way a config file becomes data: read, parse bounded YAML, apply `--set` overrides, bound the result.
    Both loaders (the build's and the trainer's) start here, then validate with their own pydantic model and report
    its errors through `format_pydantic`."""
    try:  # a regular file read with its bound: a FIFO or a device would block or never end
        text = read_text(path, "config file", MAX_READ_BYTES)
    except InputFileError as e:
        raise ConfigError([str(e)], str(path)) from None
    data = load_yaml(text, str(path))
    problems = apply_overrides(data, overrides or [])
    if problems:
        raise ConfigError(problems, str(path))
    size_problem = expansion_problem(data)
    if size_problem:
        raise ConfigError([f"after --set overrides: {size_problem}"], str(path))
    return data
