"""The contract ledger: every key, flag, parameter, input/output and tensor name this project writes for TensorRT-LLM
or Triton, per supported TensorRT-LLM version, with the upstream code that reads it.

A row = (surface, name, versions, required, type, consumer). `name` may hold placeholders for indices ({i} target
layer, {j} drafter layer, {k} head copy, {lin} a linear). `required` = the consumer fails when the name is missing
(for configs its `when` flags describe); an optional row is read with a default. The consumer is cited as repository,
ref (the tag of the row's version), path and symbol; docs/contracts.md is rendered from these rows
(`python -m ledger.docs`), and tests/test_ledger.py checks every emitted artifact against them both
ways: nothing emitted that the ledger lacks, nothing required missing.

Adding a TensorRT-LLM version: a registry entry (core/trtllm_versions.py), then, surface by surface, read the
consumer of each row at the new tag and add the version to the rows that still hold (new rows for what changed).
"""

from __future__ import annotations

import re

from core import trtllm_versions

from ledger import build as ledger_build
from ledger import checkpoint as ledger_checkpoint
from ledger import dynamo as ledger_dynamo
from ledger import hf_quant as ledger_hf_quant
from ledger import llmapi as ledger_llmapi
from ledger import triton as ledger_triton
from ledger.rows import Row


def all_rows() -> list[Row]:
    return (ledger_checkpoint.ROWS + ledger_build.ROWS + ledger_triton.ROWS + ledger_llmapi.ROWS + ledger_hf_quant.ROWS
            + ledger_dynamo.ROWS)


def rows_for(surface: str, version: str) -> list[Row]:
    return [r for r in all_rows() if r.surface == surface and version in r.versions]


# ---- turning outputs into names -------------------------------------------------------------------------------------

_INDEX_PATTERNS = (
    (re.compile(r"^transformer\.layers\.\d+\."), "transformer.layers.{i}."),
    (re.compile(r"^eagle_nets\.\d+\."), "eagle_nets.{k}."),
    (re.compile(r"\.drafter\.layers\.\d+\."), ".drafter.layers.{j}."),
    (re.compile(r"^model\.layers\.\d+\."), "model.layers.{i}."),  # Hugging Face names (hf_quantized/)
    (re.compile(r"\.experts\.\d+\."), ".experts.{e}."),  # routed experts, one per expert (hf_quantized/)
)


def tensor_pattern(name: str) -> str:
    """`eagle_nets.2.drafter.layers.0.attention.qkv.weight` ->
    `eagle_nets.{k}.drafter.layers.{j}.attention.qkv.weight`."""
    for rx, repl in _INDEX_PATTERNS:
        name = rx.sub(repl, name)
    return name


def flat_keys(d: dict[str, object], prefix: str = "") -> set[str]:
    """Dotted key paths of nested mappings (lists, and mappings keyed by numbers such as draft_len_schedule, are
    values)."""
    out: set[str] = set()
    for k, v in d.items():
        path = f"{prefix}{k}"
        out.add(path)
        if isinstance(v, dict) and all(isinstance(key, str) for key in v):
            out |= flat_keys(v, path + ".")
    return out


def argv_flags(argv: list[str]) -> set[str]:
    return {a for a in argv if a.startswith("--")}


# ---- checking -------------------------------------------------------------------------------------------------------


def flags_of(**facts: bool) -> frozenset[str]:
    """The `when` flags that hold for a config (e.g. flags_of(eagle=True, kv_fp8=False))."""
    return frozenset(k for k, v in facts.items() if v)


def check(surface: str, version: str, emitted: set[str], flags: frozenset[str] = frozenset()) -> list[str]:
    """Problems between what was emitted for `surface` and the ledger rows of `version`, both ways."""
    rows = rows_for(surface, version)
    if not rows:
        return [f"ledger has no rows for surface {surface!r} of TensorRT-LLM version {version!r}"]
    known = {r.name for r in rows}
    name = trtllm_versions.get(version).name
    p = [f"{surface}: {n!r} is emitted but has no ledger row for {name} (cite its upstream consumer or stop writing it)"
         for n in sorted(emitted - known)]
    for r in rows:
        if r.required and set(r.when) <= flags and r.name not in emitted and not r.exempt(emitted):
            p.append(f"{surface}: required {r.name!r} is missing ({name} reads it: {r.cite(version)})")
    return p
