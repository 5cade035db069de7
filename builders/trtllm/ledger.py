"""The contract ledger: every key, flag, parameter, input/output and tensor name this project writes for TensorRT-LLM
or Triton, per supported TensorRT-LLM version, with the upstream code that reads it.

A row = (surface, name, versions, required, type, consumer). `name` may hold placeholders for indices ({i} target
layer, {j} drafter layer, {k} head copy, {lin} a linear). `required` = the consumer fails when the name is missing
(for configs its `when` flags describe); an optional row is read with a default. The consumer is cited as repository,
ref (the tag of the row's version), path and symbol; docs/contracts.md is rendered from these rows
(`python -m builders.trtllm.ledger_docs`), and tests/test_ledger.py checks every emitted artifact against them both
ways: nothing emitted that the ledger lacks, nothing required missing.

Adding a TensorRT-LLM version: a registry entry (builders/trtllm/registry.py), then, surface by surface, read the
consumer of each row at the new tag and add the version to the rows that still hold (new rows for what changed).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace

from builders.trtllm import registry

ALL = tuple(registry.VERSIONS)  # every supported version
ENGINE_FLOW = tuple(k for k, v in registry.VERSIONS.items() if v.engine_flow)  # checkpoint format, trtllm-build
ENSEMBLE = tuple(k for k, v in registry.VERSIONS.items() if v.triton_layout == "ensemble")  # our ensemble repository
LLMAPI_LAYOUT = tuple(k for k, v in registry.VERSIONS.items() if v.triton_layout == "llmapi")  # upstream llmapi model

# The ref a citation names, per repository and version (registry tags for TensorRT-LLM; the Triton release of the
# image for Triton core/common; this repository's own files are cited at the commit that carries the ledger).
TRITON_RELEASE_REF = "r25.12"
PROJECT = "eagle-deploy"


def ref_of(repo: str, version: str) -> str:
    if repo == "NVIDIA/TensorRT-LLM":
        return registry.get(version).tag
    if repo.startswith("triton-inference-server/"):
        return TRITON_RELEASE_REF
    if repo == "huggingface/transformers":
        return {"1.1": "v4.56.0", "1.2": "v4.57.3"}.get(version, "v4")  # the images' transformers (release notes)
    return "this commit"


@dataclass(frozen=True)
class Source:
    repo: str
    path: str
    symbol: str


@dataclass(frozen=True)
class Row:
    surface: str
    name: str
    versions: tuple[str, ...]
    required: bool
    type: str
    source: Source
    when: tuple[str, ...] = ()  # config flags under which the row applies (all must hold): see `flags_of`
    note: str = ""

    def cite(self, version: str) -> str:
        s = self.source
        return f"{s.repo}@{ref_of(s.repo, version)}:{s.path} {s.symbol}"


def rows_of(surface: str, names: Iterable[str], source: Source, *, type: str, required: bool = False,
            versions: tuple[str, ...] = ALL, when: tuple[str, ...] = (), note: str = "") -> list[Row]:
    return [Row(surface, n, versions, required, type, source, when, note) for n in names]


def only(rows: list[Row], versions: tuple[str, ...]) -> list[Row]:
    """The rows restricted to `versions` (a surface that exists only in some versions, e.g. the engine flow's)."""
    out = [replace(r, versions=tuple(v for v in r.versions if v in versions)) for r in rows]
    return [r for r in out if r.versions]


def all_rows() -> list[Row]:
    from builders.trtllm import ledger_build, ledger_checkpoint, ledger_llmapi, ledger_triton

    return ledger_checkpoint.ROWS + ledger_build.ROWS + ledger_triton.ROWS + ledger_llmapi.ROWS


def rows_for(surface: str, version: str) -> list[Row]:
    return [r for r in all_rows() if r.surface == surface and version in r.versions]


# ---- turning outputs into names -------------------------------------------------------------------------------------

_INDEX_PATTERNS = (
    (re.compile(r"^transformer\.layers\.\d+\."), "transformer.layers.{i}."),
    (re.compile(r"^eagle_nets\.\d+\."), "eagle_nets.{k}."),
    (re.compile(r"\.drafter\.layers\.\d+\."), ".drafter.layers.{j}."),
)


def tensor_pattern(name: str) -> str:
    """`eagle_nets.2.drafter.layers.0.attention.qkv.weight` -> `eagle_nets.{k}.drafter.layers.{j}.attention.qkv.weight`."""
    for rx, repl in _INDEX_PATTERNS:
        name = rx.sub(repl, name)
    return name


def flat_keys(d: dict[str, object], prefix: str = "") -> set[str]:
    """Dotted key paths of nested mappings (lists are values)."""
    out: set[str] = set()
    for k, v in d.items():
        path = f"{prefix}{k}"
        out.add(path)
        if isinstance(v, dict):
            out |= flat_keys(v, path + ".")  # type: ignore[arg-type]
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
    name = registry.get(version).name
    p = [f"{surface}: {n!r} is emitted but has no ledger row for {name} (cite its upstream consumer or stop writing it)"
         for n in sorted(emitted - known)]
    for r in rows:
        if r.required and set(r.when) <= flags and r.name not in emitted:
            p.append(f"{surface}: required {r.name!r} is missing ({name} reads it: {r.cite(version)})")
    return p
