"""The generated config references (docs/config.md, docs/train-config.md) and JSON Schemas: in sync with the pydantic
models, complete, with valid examples, and the shipped configs carry a modeline and validate against them."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from builders import config_docs
from builders.config import load_config
from builders.config_docs import REFERENCES, REGEN_COMMAND, Reference
from training.config import load_train_config

ROOT = Path(__file__).resolve().parent.parent
IDS = [r.doc for r in REFERENCES]


def test_generated_files_are_current() -> None:
    bad = config_docs.stale()
    assert bad == [], f"stale generated config docs {bad}: run `{REGEN_COMMAND}` and commit the result"


def test_check_mode_exit_status() -> None:
    r = subprocess.run([sys.executable, "devtools/gen_config_docs.py", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "up to date" in r.stdout


def test_stale_names_missing_and_edited_files(tmp_path: Path) -> None:
    (tmp_path / "configs" / "train").mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    expected = {ref.doc for ref in REFERENCES} | {ref.schema for ref in REFERENCES}
    assert set(config_docs.stale(tmp_path)) == expected
    assert set(config_docs.write(tmp_path)) == expected
    assert config_docs.stale(tmp_path) == []
    page = tmp_path / "docs" / "config.md"
    page.write_text(page.read_text().replace("Max sequences in flight", "Max sequences"))
    assert config_docs.stale(tmp_path) == ["docs/config.md"]


def _fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, description) of every field, nested sections included."""
    out = []
    for name, info in model.model_fields.items():
        dotted = f"{prefix}{name}"
        out.append((dotted, info.description or ""))
        args = [info.annotation, *getattr(info.annotation, "__args__", ())]
        for sub in args:
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out.extend(_fields(sub, dotted + "."))
    return out


@pytest.mark.parametrize("ref", REFERENCES, ids=IDS)
def test_every_field_documented_with_type_default_and_example(ref: Reference) -> None:
    page = (ROOT / ref.doc).read_text()
    blocks = dict(re.findall(r"^### `([^`]+)`\n\n(.*?)(?=^### |^## |\Z)", page, flags=re.S | re.M))
    fields = _fields(ref.model)
    assert len(fields) > 10
    for dotted, description in fields:
        assert description, f"{dotted} has no description in the model"
        block = blocks.get(dotted)
        assert block is not None, f"{ref.doc} lacks `{dotted}`"
        assert description in block
        assert "- type: " in block and "- default: " in block
        assert "- example (" in block or "- fields: see" in block, dotted


def _examples(page: str) -> list[dict[str, Any]]:
    return [yaml.safe_load(re.sub(r"^  ", "", m, flags=re.M))
            for m in re.findall(r"- example \([^)]*\):\n\n  ```yaml\n(.*?)\n  ```", page, flags=re.S)]


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in patch.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _leaf(example: dict[str, Any]) -> tuple[list[str], Any]:
    path, node = [], example
    while isinstance(node, dict) and len(node) == 1:
        (key, node), = node.items()
        path.append(key)
    return path, node


def _property_schema(schema: dict[str, Any], path: list[str]) -> dict[str, Any]:
    node = schema
    for key in path:
        if "properties" not in node:  # a section reached through $ref, possibly in anyOf with null
            ref = node.get("$ref") or next(x["$ref"] for x in node["anyOf"] if "$ref" in x)
            node = schema["$defs"][ref.rsplit("/", 1)[-1]]
        node = node["properties"][key]
    return {"$defs": schema.get("$defs", {}), **node}


@pytest.mark.parametrize("ref", REFERENCES, ids=IDS)
def test_examples_validate_against_the_schema(ref: Reference) -> None:
    schema = json.loads((ROOT / ref.schema).read_text())
    examples = _examples((ROOT / ref.doc).read_text())
    leaves = [f for f, _ in _fields(ref.model)]
    sections = {f.rsplit(".", 1)[0] for f in leaves if "." in f}  # a section has no example of its own
    assert {".".join(_leaf(ex)[0]) for ex in examples} >= set(leaves) - sections
    for ex in examples:
        path, value = _leaf(ex)
        assert ".".join(path) in leaves
        jsonschema.validate(value, _property_schema(schema, path))


def test_schema_rejects_what_the_loader_rejects() -> None:
    schema = json.loads((ROOT / "docs/config.schema.json").read_text())
    demo = yaml.safe_load((ROOT / "configs/demo.yaml").read_text())
    for bad in ({"engine": {"bogus": 1}}, {"target": {"dtype": "int4"}}, {"engine": {"max_batch_size": 0}},
                {"triton": {"kv_cache_free_gpu_mem_fraction": 1.5}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(_merge(demo, bad), schema)


@pytest.mark.parametrize("ref", REFERENCES, ids=IDS)
def test_shipped_configs_have_modeline_validate_and_load(ref: Reference) -> None:
    schema = json.loads((ROOT / ref.schema).read_text())
    paths = sorted(ROOT.glob(ref.example_glob))
    assert paths
    for path in paths:
        first = path.read_text().splitlines()[0]
        m = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert m, f"{path}: first line must be the yaml-language-server modeline (see {ref.doc})"
        assert (path.parent / m.group(1)).resolve() == (ROOT / ref.schema).resolve()
        jsonschema.validate(yaml.safe_load(path.read_text()), schema)
        cfg = load_config(path) if ref.doc == "docs/config.md" else load_train_config(path)
        assert cfg.name
