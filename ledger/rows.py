"""The ledger's row type and the version sets rows are written for; ledger/*.py declare their rows
with these, ledger/table.py gathers them and checks outputs against them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from core import trtllm_versions
from dynamo_serve.layout import DYNAMO_VERSION
from builders.trtllm.citation import Source  # re-exported: the rows' modules import it with Row

ALL = tuple(trtllm_versions.VERSIONS)  # every supported version
ENGINE_FLOW = tuple(k for k, v in trtllm_versions.VERSIONS.items() if v.engine_flow)  # checkpoint format, trtllm-build
ENSEMBLE = tuple(k for k, v in trtllm_versions.VERSIONS.items() if v.triton_layout == "ensemble")  # our repository
LLMAPI_LAYOUT = tuple(k for k, v in trtllm_versions.VERSIONS.items() if v.triton_layout == "llmapi")  # upstream's

# The ref a citation names, per repository and version (registry tags for TensorRT-LLM; the Triton release of the
# image for Triton core/common; this repository's own files are cited at the commit that carries the ledger).
TRITON_RELEASE_REF = "r25.12"
# The transformers release each version reads our directories with: 1.1 / 1.2 the images' (release notes); 1.4 the
# 5.x pin of TensorRT-LLM PR #12829 (the exact pin at v1.4.0rc4 was not read: docs/contracts.md, "Not verified").
# Its major is the registry's `transformers_major` (tests/test_ledger.py checks they agree).
TRANSFORMERS_REF = {"1.1": "v4.56.0", "1.2": "v4.57.3", "1.4": "v5.3.0"}
TRANSFORMERS4 = tuple(k for k, v in trtllm_versions.VERSIONS.items() if v.transformers_major == 4)
TRANSFORMERS5 = tuple(k for k, v in trtllm_versions.VERSIONS.items() if v.transformers_major == 5)
PROJECT = "eagle-deploy"
DYNAMO_REF = f"v{DYNAMO_VERSION}"  # the ai-dynamo release the Dynamo deployment is written for (every current line)


def ref_of(repo: str, version: str) -> str:
    if repo == "NVIDIA/TensorRT-LLM":
        return trtllm_versions.get(version).tag
    if repo.startswith("triton-inference-server/"):
        return TRITON_RELEASE_REF
    if repo == "huggingface/transformers":
        return TRANSFORMERS_REF[version]
    if repo == "ai-dynamo/dynamo":
        return DYNAMO_REF
    return "this commit"


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
    # A required name the consumer lets go missing when another emitted name ends with this suffix (e.g. PretrainedModel
    # .load: lm_head.weight may be left out while a vocab_embedding.weight is there, the embedding being shared).
    exempt_if_emitted_suffix: str = ""

    def exempt(self, emitted: set[str]) -> bool:
        sfx = self.exempt_if_emitted_suffix
        return bool(sfx) and any(n.endswith(sfx) for n in emitted)

    def cite(self, version: str) -> str:
        s = self.source
        return f"{s.repo}@{ref_of(s.repo, version)}:{s.path} {s.symbol}"


def rows_of(surface: str, names: Iterable[str], source: Source, *, type: str, required: bool = False,
            versions: tuple[str, ...] = ALL, when: tuple[str, ...] = (), note: str = "",
            exempt_if_emitted_suffix: str = "") -> list[Row]:
    return [Row(surface, n, versions, required, type, source, when, note, exempt_if_emitted_suffix) for n in names]


def only(rows: list[Row], versions: tuple[str, ...]) -> list[Row]:
    """The rows restricted to `versions` (a surface that exists only in some versions, e.g. the engine flow's)."""
    out = [replace(r, versions=tuple(v for v in r.versions if v in versions)) for r in rows]
    return [r for r in out if r.versions]
