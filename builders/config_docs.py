"""The config reference pages and JSON Schemas, generated from the pydantic models (the one source of truth).

`python devtools/gen_config_docs.py` writes, for the build config (`builders/config.py` `BuildConfig`) and the
training config (`training/config.py` `TrainHeadConfig`), a Markdown reference (every field: type, default,
constraints, description, an example) and a JSON Schema that editors use to validate and complete the YAML
(`# yaml-language-server: $schema=...`). `--check` compares instead of writing; tests run it.

Examples are taken from the configs shipped in `configs/` (the first one, in file order, that sets the field); a
field no shipped config sets gets a value built from its schema, marked "illustrative".
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from builders.config import BuildConfig
from training.config import TrainHeadConfig

ROOT = Path(__file__).resolve().parent.parent
REGEN_COMMAND = ".venv/bin/python devtools/gen_config_docs.py"
SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
MAX_EXAMPLE_CHARS = 160  # longer example values (explicit trees) make the page unreadable; the next source is used


@dataclass(frozen=True)
class Reference:
    """One generated pair: the Markdown page and the JSON Schema of one config model."""

    model: type[BaseModel]
    title: str
    doc: str  # repository-relative paths
    schema: str
    example_glob: str  # shipped configs of this kind: the source of examples
    command: str  # what consumes the config
    intro: str


REFERENCES = (
    Reference(
        model=BuildConfig,
        title="Build config reference (`builders/build.py`)",
        doc="docs/config.md",
        schema="docs/config.schema.json",
        example_glob="configs/*.yaml",
        command="python builders/build.py CONFIG.yaml",
        intro="The YAML that `builders/build.py` turns into a TensorRT-LLM checkpoint, an engine (or LLM API "
        "options) and a Triton model repository. Unknown keys are errors; every problem is reported at once "
        "with the field, the value and the fix (exit code 2, nothing written). Rules between fields (tree vs "
        "engine limits, backend vs head type, what the `trtllm_version` supports) are checked at load too. "
        "`--set a.b=value` overrides any field from the command line (value parsed as YAML). Relative paths are "
        "relative to the config file. The engine limits left unset get TensorRT-LLM's defaults; "
        "`<output_dir>/config.resolved.yaml` records every value used, the derived tree limits, and why.",
    ),
    Reference(
        model=TrainHeadConfig,
        title="Training config reference (`training/train_head.py`)",
        doc="docs/train-config.md",
        schema="docs/train-config.schema.json",
        example_glob="configs/train/*.yaml",
        command="python training/train_head.py CONFIG.yaml",
        intro="The YAML that `training/train_head.py` trains an EAGLE-1/2 or EAGLE-3 head from (see "
        "[train-a-head.md](train-a-head.md)). Unknown keys are errors; every problem is reported at once. "
        "`--set a.b=value` overrides any field. Relative paths are relative to the config file.",
    ),
)


# ---- JSON Schema ------------------------------------------------------------------------------------------------


def json_schema(ref: Reference) -> dict[str, Any]:
    schema = ref.model.model_json_schema()
    return {"$schema": SCHEMA_DIALECT, "$id": ref.schema, **schema}


def schema_text(ref: Reference) -> str:
    return json.dumps(json_schema(ref), indent=2, sort_keys=False) + "\n"


# ---- examples from the shipped configs --------------------------------------------------------------------------


def shipped_configs(ref: Reference, root: Path = ROOT) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(root.glob(ref.example_glob)):
        data = yaml.safe_load(path.read_text())
        if isinstance(data, dict):
            out.append((path.relative_to(root).as_posix(), data))
    return out


_MISSING = object()


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()  # a bare scalar document ends with "..."


def example_yaml(dotted: str, value: Any) -> str:
    """Block-style sections down to the field, its value in flow style (one line)."""
    parts = dotted.split(".")
    lines = [f"{'  ' * i}{part}:" for i, part in enumerate(parts[:-1])]
    lines.append(f"{'  ' * (len(parts) - 1)}{parts[-1]}: {_flow(value)}")
    return "\n".join(lines)


def _illustrative(prop: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A valid value built from the schema: the default, the first choice, the lower bound."""
    if "default" in prop and prop["default"] is not None:
        return prop["default"]
    options = [p for p in prop.get("anyOf", [prop]) if p.get("type") != "null"]
    p = options[0] if options else prop
    if "enum" in p:
        return p["enum"][0]
    if "const" in p:
        return p["const"]
    kind = p.get("type")
    if kind == "integer":
        return p.get("minimum", p.get("exclusiveMinimum", -1) + 1)
    if kind == "number":
        return p.get("minimum", 0.5)
    if kind == "boolean":
        return True
    if kind == "array":
        return [_illustrative(p.get("items", {}), defs)]
    return "..."


# Fields that no shipped config sets and whose default is unset: a value valid with configs/demo.yaml's tree
# (topk-2-3: 14 draft tokens, depth 3, at most 4 non-leaves per level) and limits. Tests validate every example.
EXTRA_EXAMPLES: dict[str, Any] = {
    "draft.draft_vocab": "draft-vocab-8192.json",
    "tree.max_draft_len": 14,
    "tree.num_eagle_layers": 3,
    "tree.max_non_leaves_per_layer": 4,
    "tree.dynamic.top_k": 4,
    "tree.dynamic.depth": 4,
    "tree.dynamic.total_draft_tokens": 16,
    "tree.draft_len_schedule": {1: 3, 2: 2, 4: 1},
    "tree.schedule_file": "tune-schedule.json",
    "tree.max_concurrency": 8,
    "tree.acceptance_rate_window_size": 32,
    "tree.acceptance_rate_threshold": 0.2,
    "engine.max_num_tokens": 2048,
    "engine.workers": 2,
    "serving.moe_expert_parallel_size": 8,
    "serving.moe_backend": "CUTLASS",
    "serving.cuda_graph_max_batch_size": 64,
    "serving.extra_llm_api_options": {"print_iter_log": True, "stream_interval": 10},
    "deploy.node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "inference"},
    "deploy.downloads": {"/models/Llama-3.1-8B-Instruct": "meta-llama/Llama-3.1-8B-Instruct",
                         "/models/EAGLE3-LLaMA3.1-Instruct-8B": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"},
    "deploy.storage_class": "nfs-rwx",
    "deploy.image": "registry.example.com/eagle-deploy:trtllm1.4.0rc4",
    "refresh.reference_prompts": "reference-prompts.jsonl",
}


def pick_example(dotted: str, prop: dict[str, Any], sources: list[tuple[str, dict[str, Any]]],
                 defs: dict[str, Any]) -> tuple[str, str]:
    """(YAML snippet, where it comes from)."""
    for name, data in sources:
        value = _lookup(data, dotted)
        if value is _MISSING or (isinstance(value, dict) and dotted not in EXTRA_EXAMPLES):
            continue
        text = example_yaml(dotted, value)
        if len(text) <= MAX_EXAMPLE_CHARS + len(dotted) * 2:
            return text, f"from `{name}`"
    if dotted in EXTRA_EXAMPLES:
        return example_yaml(dotted, EXTRA_EXAMPLES[dotted]), "illustrative"
    if prop.get("default") is not None:
        return example_yaml(dotted, prop["default"]), "the default"
    return example_yaml(dotted, _illustrative(prop, defs)), "illustrative"


# ---- Markdown -----------------------------------------------------------------------------------------------------


def _ref_name(p: dict[str, Any]) -> str | None:
    ref = p.get("$ref")
    return ref.rsplit("/", 1)[-1] if isinstance(ref, str) else None


def _section_ref(p: dict[str, Any]) -> str | None:
    """The $defs name of a nested section (also when it may be null)."""
    return _ref_name(p) or next((_ref_name(x) for x in p.get("anyOf", []) if _ref_name(x)), None)


def type_text(p: dict[str, Any]) -> str:
    if "anyOf" in p:
        return " or ".join(type_text(x) for x in p["anyOf"])
    ref = _ref_name(p)
    if ref is not None:
        return "section"
    if "enum" in p:
        return " \\| ".join(f"`{json.dumps(v)}`" for v in p["enum"])
    if "const" in p:  # a one-value Literal
        return f"`{json.dumps(p['const'])}`"
    kind = p.get("type", "any")
    if kind == "array" and "prefixItems" in p:  # a tuple
        return "[" + ", ".join(type_text(x) for x in p["prefixItems"]) + "]"
    if kind == "array":
        return f"list of {type_text(p.get('items', {}))}"
    return {"integer": "integer", "number": "number", "string": "string", "boolean": "boolean", "null": "null"}.get(
        kind, str(kind)
    )


_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"),
           ("minLength", "length >="), ("maxLength", "length <="))


def constraints_text(p: dict[str, Any]) -> str:
    parts: list[str] = []
    for option in p.get("anyOf", [p]):
        for key, sym in _BOUNDS:
            if key in option:
                parts.append(f"{sym} {option[key]}")
        if option.get("type") == "array" and isinstance(option.get("items"), dict):
            inner = constraints_text(option["items"])
            if inner:
                parts.append(f"each {inner}")
    return ", ".join(parts)


def default_text(name: str, p: dict[str, Any], required: set[str]) -> str:
    if name in required:
        return "required"
    if "default" in p:
        return "unset (`null`)" if p["default"] is None else f"`{json.dumps(p['default'])}`"
    return "the section's defaults"


def _field_block(dotted: str, p: dict[str, Any], required: set[str], sources: list[tuple[str, dict[str, Any]]],
                 defs: dict[str, Any]) -> list[str]:
    name = dotted.rsplit(".", 1)[-1]
    lines = [f"### `{dotted}`", "", p.get("description", "(no description)"), ""]
    lines.append(f"- type: {type_text(p)}")
    lines.append(f"- default: {default_text(name, p, required)}")
    bounds = constraints_text(p)
    if bounds:
        lines.append(f"- constraints: {bounds}")
    if _section_ref(p) is None:
        snippet, where = pick_example(dotted, p, sources, defs)
        lines += [f"- example ({where}):", "", "  ```yaml", *(f"  {ln}" for ln in snippet.splitlines()), "  ```"]
    else:
        lines.append(f"- fields: see [`{dotted}.*`](#{_anchor(dotted)}-section)")
    return lines + [""]


def _anchor(dotted: str) -> str:
    return dotted.replace(".", "").lower()  # GitHub's heading anchors drop dots


def _section(prefix: str, obj: dict[str, Any], defs: dict[str, Any], sources: list[tuple[str, dict[str, Any]]],
             out: list[str]) -> None:
    required = set(obj.get("required", []))
    nested: list[tuple[str, str, dict[str, Any]]] = []
    for name, p in obj.get("properties", {}).items():
        dotted = f"{prefix}.{name}" if prefix else name
        out.extend(_field_block(dotted, p, required, sources, defs))
        ref = _section_ref(p)
        if ref is not None:
            nested.append((dotted, p.get("description", ""), defs[ref]))
    for dotted, about, sub in nested:
        out += [f"## {dotted} section", "", f"{about} Fields under `{dotted}:`.".strip(), ""]
        _section(dotted, sub, defs, sources, out)


def markdown(ref: Reference, root: Path = ROOT) -> str:
    schema = json_schema(ref)
    defs = schema.get("$defs", {})
    sources = shipped_configs(ref, root)
    schema_from_configs = "../" + ref.schema if ref.example_glob.startswith("configs/*") else "../../" + ref.schema
    out = [
        f"# {ref.title}",
        "",
        f"<!-- Generated from `{ref.model.__module__}.{ref.model.__name__}` by `{REGEN_COMMAND}`; do not edit. -->",
        "",
        ref.intro,
        "",
        f"Command: `{ref.command}`. Schema for editors: [`{Path(ref.schema).name}`]({Path(ref.schema).name}).",
        "",
        "## Editor support",
        "",
        f"The JSON Schema `{ref.schema}` is generated with this page. Editors that use the YAML language server "
        "(VS Code's Red Hat YAML extension, Neovim, JetBrains, Helix) validate and complete a config that starts "
        "with a modeline pointing at it; the path is relative to the config file:",
        "",
        "```yaml",
        f"# yaml-language-server: $schema={schema_from_configs}",
        "```",
        "",
        f"(as the configs in `{ref.example_glob.rsplit('/', 1)[0]}/` do). The schema checks each field on its own; "
        "the rules between fields run when the config loads.",
        "",
        "## Top level",
        "",
    ]
    _section("", schema, defs, sources, out)
    return "\n".join(out).rstrip() + "\n"


# ---- write / check -------------------------------------------------------------------------------------------------


def outputs(root: Path = ROOT) -> dict[Path, str]:
    files: dict[Path, str] = {}
    for ref in REFERENCES:
        files[root / ref.doc] = markdown(ref, root)
        files[root / ref.schema] = schema_text(ref)
    return files


def stale(root: Path = ROOT) -> list[str]:
    """Repository-relative paths whose content differs from what the generator writes now."""
    out = []
    for path, text in outputs(root).items():
        if not path.is_file() or path.read_text() != text:
            out.append(path.relative_to(root).as_posix())
    return out


def write(root: Path = ROOT) -> list[str]:
    written = []
    for path, text in outputs(root).items():
        if not path.is_file() or path.read_text() != text:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(path.relative_to(root).as_posix())
    return written
