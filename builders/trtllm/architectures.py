"""The architecture table, derived from the family table (core/families.py FAMILIES, where a family is declared):
which target architectures (a Hugging Face config.json's `architectures[0]`) each path serves, per
`trtllm_version`, with the upstream code that establishes it. One source of truth:

- the convert stage's preflight refuses a target outside it before anything is written (`problems`), naming the
  architecture, what it supports and the way out;
- docs/contracts.md renders it ("Target architectures", ledger/docs.py);
- tests/test_ledger.py checks every row (citations well formed, each version's claim backed by a source, the
  reference engine's families match core/families.py).

Columns:
- engine flow (EAGLE-1/2 heads: convert_checkpoint + trtllm-build + the Triton C++ backend; 1.1 / 1.2): TensorRT-LLM's
  `EagleForCausalLM` subclasses `LLaMAForCausalLM` (tensorrt_llm/models/eagle/model.py), so only Llama targets;
- PyTorch-backend EAGLE-3 per version: `one-model` where the target's class is a `SpecDecOneEngineForCausalLM`
  (tensorrt_llm/_torch/models/modeling_*.py); `two-model` where it is a plain `DecoderModelForCausalLM` whose layers
  capture hidden states for a separate draft model (`eagle3_one_model: false`, which exists on 1.1 / 1.2 only: the
  current line forces every speculative config onto the one-model path, NVIDIA/TensorRT-LLM PR #17366, and has no
  `eagle3_one_model` field); absent = not served;
- reference engine (engines/): `native` (engines' own forward for the family) or `generic` (transformers' own model
  class, engines/generic.py); absent = the reference engine cannot run it;
- trainer (training/train_head.py): EAGLE-3 heads from this family's features.
"""

from __future__ import annotations

from dataclasses import dataclass

from core.kinds import BACKENDS, DRAFT_KINDS
from core import trtllm_versions
from builders.trtllm.citation import Source
from core import capabilities, families, family_survey
from core.families import ONE as ONE  # re-exported: the mode names the rows use
from core.families import TRT, TWO

EAGLE_FLOW = Source(TRT, "tensorrt_llm/models/eagle/model.py", "class EagleForCausalLM(LLaMAForCausalLM)")
TWO_MODEL_REMOVED = Source(TRT, "pull/17366", "'Force 2 model spec dec to fall back to 1 model' (merged 2026-08)")


@dataclass(frozen=True)
class Architecture:
    name: str  # config.json architectures[0]
    family: str  # what users call it
    engine_flow: bool  # EAGLE-1/2 engine flow (1.1 / 1.2)
    eagle3: str  # ONE | TWO: how the target class runs EAGLE-3 on the PyTorch backend (see `pytorch_mode`)
    reference: str | None  # "native" | "generic" | None
    trainer: bool  # training/train_head.py trains EAGLE-3 heads for it
    source: Source  # the registration that establishes the PyTorch column
    read: str  # the versions read, by commit (dated by their content where no tag was read)
    note: str = ""
    versions: tuple[str, ...] | None = None  # None: every version that runs EAGLE-3 (core/families.py Family)

    def pytorch_mode(self, version: str) -> str | None:
        """ONE / TWO where `version` runs this target with an EAGLE-3 head on its PyTorch backend, else None: a
        one-model class runs wherever EAGLE-3 does, a two-model one only where `eagle3_one_model` can be false."""
        v = trtllm_versions.get(version)
        if not v.pytorch_eagle3 or (self.eagle3 == TWO and not v.eagle3_one_model_field):
            return None
        if self.versions is not None and v.key not in self.versions:
            return None
        return self.eagle3

    @property
    def pytorch(self) -> tuple[tuple[str, str], ...]:
        """(trtllm_version, mode) for every version that serves it."""
        return tuple((k, m) for k in trtllm_versions.VERSIONS if (m := self.pytorch_mode(k)) is not None)

    def supports(self) -> str:
        """What this architecture can do, for error messages."""
        parts = []
        if self.engine_flow:
            parts.append("EAGLE-1/2 on the engine flow (1.1, 1.2)")
        by_mode: dict[str, list[str]] = {}
        for v, mode in self.pytorch:
            by_mode.setdefault(mode, []).append(v)
        parts += [f"EAGLE-3 on the PyTorch backend ({mode}) on trtllm_version {', '.join(vs)}"
                  for mode, vs in by_mode.items()]
        if not self.pytorch:
            parts.append("no EAGLE-3 on TensorRT-LLM's PyTorch backend")
        parts.append(f"the reference engine ({self.reference})" if self.reference
                     else "not the reference engine (build for engine.backend pytorch)")
        parts.append("the trainer (EAGLE-3 heads)" if self.trainer else "not the trainer")
        return "; ".join(parts)


def _row(f: families.Family) -> Architecture:
    return Architecture(f.name, f.label, f.engine_flow, f.eagle3, f.reference, f.trainer,
                        Source(TRT, f.path, f.symbol), f.read, f.note, f.versions)


# Derived from the one family table (core/families.py FAMILIES): a family is declared there, not here.
ARCHITECTURES: tuple[Architecture, ...] = tuple(_row(f) for f in families.FAMILIES)

BY_NAME = {a.name: a for a in ARCHITECTURES}


def get(name: str) -> Architecture | None:
    return BY_NAME.get(name)


def _listing() -> str:
    return ", ".join(a.name for a in ARCHITECTURES)


def problems(arch: str | None, *, version: str, backend: str, draft_type: str, where: str) -> list[str]:
    """Why this target architecture cannot take this path (empty = it can). `where` names the target."""
    v = trtllm_versions.get(version)
    a = BY_NAME.get(arch or "")
    if a is None and (arch or "") in family_survey.NOT_EAGLE3:
        path, what, read = family_survey.NOT_EAGLE3[arch or ""]
        return [f"target.model {where}: {arch} is registered by TensorRT-LLM ({path}) but does not run EAGLE-3 there: "
                f"{what} (read at {read}); it is not in the architecture table, which lists {_listing()}"]
    if a is None and (arch or "") in family_survey.NOT_ROWS:
        path, what, read, why = family_survey.NOT_ROWS[arch or ""]
        return [f"target.model {where}: {arch} is registered by TensorRT-LLM ({path}: {what}; read at {read}) but is "
                f"not a row of the architecture table: {why}. The table lists {_listing()}"]
    if a is None:
        return [f"target.model {where}: architecture {arch!r} is not in the architecture table (docs/contracts.md, "
                f"'Target architectures'), which lists {_listing()}; nothing would serve it as an EAGLE target "
                "here. Use a target of a listed architecture (docs/bring-your-own-model.md)"]
    p: list[str] = []
    kind, runtime = DRAFT_KINDS[draft_type], BACKENDS[backend]
    if (not kind.eagle3 or runtime.engine_flow) and not a.engine_flow:
        how = "draft.type=eagle (EAGLE-1/2)" if not kind.eagle3 else "engine.backend=tensorrt"
        p.append(f"target.model {where}: {a.name} cannot use {how} on {v.name} (trtllm_version '{v.key}'): the engine "
                 f"flow's EagleForCausalLM subclasses LLaMAForCausalLM ({EAGLE_FLOW.path}), so it serves "
                 f"LlamaForCausalLM targets only. {a.name} supports: {a.supports()}. Way out: "
                 f"{_way_out(a)}")
        return p
    if kind.eagle3 and a.pytorch_mode(v.key) is None:
        # The reference engine serves a version's Triton layout and nothing that version could not serve.
        mirror = ", and the reference engine serves only what its version serves" if runtime.reference_engine else ""
        p.append(f"target.model {where}: {a.name} with an EAGLE-3 head is not served by {v.name}'s PyTorch backend "
                 f"(trtllm_version '{v.key}'; {a.source.path}: {a.source.symbol}){mirror}. {a.name} supports: "
                 f"{a.supports()}. Way out: {_way_out(a)}")
    elif runtime.reference_engine and a.reference is None:
        p.append(f"target.model {where}: {a.name} cannot run on engine.backend reference: {a.note}. {a.name} "
                 f"supports: {a.supports()}. Way out: {_way_out(a)}")
    return p


def _way_out(a: Architecture) -> str:
    if a.pytorch:
        versions = ", ".join(f"'{v}'" for v, _ in a.pytorch)
        where = "engine.backend pytorch (GPU) or reference (CPU)" if a.reference else "engine.backend pytorch (GPU)"
        head = ("train an EAGLE-3 head with training/train_head.py (head: eagle3) if you have none" if a.trainer
                else "bring a published EAGLE-3 head for it (the trainer does not train its heads)")
        return f"draft.type eagle3 with {where} and trtllm_version {versions}; {head}"
    return "none on TensorRT-LLM; use a listed architecture"


def capability_table() -> list[str]:
    """What the PyTorch backend does with each row, read in its code path (core/capabilities.py), with citations."""
    out = ["| architecture | EAGLE-3 capture (code path read) | trees on the PyTorch backend | KV per rank | "
           "NVIDIA support matrix |", "|---|---|---|---|---|"]
    for f in families.FAMILIES:
        capture = capabilities.capture_of(f) or "not read at a pinned commit (admitted on its registration)"
        out.append(f"| `{f.name}` | {capture} | {capabilities.trees_of(f)} | {capabilities.kv_layout(f)} | "
                   f"{capabilities.matrix_status(f)} |")
    return out + ["", f"Trees: {capabilities.TREES_DOC}; recurrent and compressed layers read a forward's tokens in "
                  f"order (chains only); {capabilities.TOPK1}, so `tree.dynamic.top_k: 1` is written as a chain. "
                  f"KV per rank: {capabilities.KV_RULE} (MLA: kv_lora_rank + qk_rope_head_dim, kv_factor 1, not "
                  f"divided by tp; GQA heads / tp, whole with enable_attention_dp); DSA indexer: "
                  f"{capabilities.DSA_RULE}. Support matrix: {capabilities.SUPPORT_MATRIX} (its EAGLE-3 one-model "
                  "cell; 'listed, no feature row' = in SUPPORTED_MODELS_PYTORCH only)."] + modelopt_list()


def markdown() -> list[str]:
    """The table as docs/contracts.md renders it."""
    versions = list(trtllm_versions.VERSIONS)
    out = ["| architecture | family | engine flow (EAGLE-1/2) | " + " | ".join(f"PyTorch EAGLE-3 {v}" for v in versions)
           + " | reference engine | trainer | established by | note |",
           "|---|---|---|" + "---|" * len(versions) + "---|---|---|---|"]
    for a in ARCHITECTURES:
        cols = [a.pytorch_mode(v) or "no" for v in versions]
        cite = f"{a.source.repo}:{a.source.path} `{a.source.symbol}` (read: {a.read})"
        out.append(f"| `{a.name}` | {a.family} | {'yes' if a.engine_flow else 'no'} | " + " | ".join(cols)
                   + f" | {a.reference or 'no'} | {'yes' if a.trainer else 'no'} | {cite} | {a.note} |")
    out += ["", "Capabilities per row (what the PyTorch backend does with it, read in its code path):", ""]
    out += capability_table()
    out += [""] + [f"- Not a row: `{name}` ({TRT}:{path} at {read}): {what}."
                   for name, (path, what, read) in family_survey.NOT_EAGLE3.items()]
    out += [f"- Not a row: `{name}` ({TRT}:{path} at {read}: {what}): {why}."
            for name, (path, what, read, why) in family_survey.NOT_ROWS.items()]
    out += ["", f"Engine flow: {EAGLE_FLOW.repo}:{EAGLE_FLOW.path} `{EAGLE_FLOW.symbol}` (read: commit 89fd9b74). "
            f"Two-model EAGLE-3 on the current line: {TWO_MODEL_REMOVED.repo} {TWO_MODEL_REMOVED.path} "
            f"{TWO_MODEL_REMOVED.symbol}; the current line's Eagle3DecodingConfig has no eagle3_one_model field "
            "(docs/contracts.md, Sources). A target outside this table, or on a path its row does not list, is "
            "refused by the convert stage's preflight before anything is written."]
    return out


GUIDE_BEGIN, GUIDE_END = "<!-- architectures: generated -->", "<!-- architectures: end -->"


def guide_table() -> list[str]:
    """The table by architecture of docs/bring-your-own-model.md (what to set for each target)."""
    out = ["| target architecture | family | EAGLE-1/2 heads (engine flow) | EAGLE-3 on TensorRT-LLM | trees "
           "(PyTorch backend) | KV per rank | NVIDIA support matrix | reference engine (CPU) | trainer | "
           "ModelOpt FP8 (current line) | note |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for a in ARCHITECTURES:
        f = families.BY_NAME[a.name]
        modes: dict[str, list[str]] = {}
        for v, m in a.pytorch:
            modes.setdefault(m, []).append(v)
        e3 = "; ".join(f"{m} on {', '.join(vs)}" for m, vs in modes.items()) or "no"
        out.append(f"| `{a.name}` | {a.family} | {'1.1, 1.2' if a.engine_flow else 'no'} | {e3} | "
                   f"{capabilities.trees_of(f)} | {capabilities.kv_layout(f)} | {capabilities.matrix_status(f)} | "
                   f"{a.reference or 'no'} | {'yes' if a.trainer else 'no'} | "
                   f"{'yes' if capabilities.modelopt_mirror(f) else 'no'} | {a.note} |")
    return out + ["", f"Trees: {capabilities.TREES_DOC}; {capabilities.TOPK1}. KV per rank: {capabilities.KV_RULE}; "
                  f"{capabilities.DSA_RULE}. Support matrix: {capabilities.SUPPORT_MATRIX}. Where each row's EAGLE-3 "
                  "capture was read: docs/contracts.md, 'Target architectures', capability table."] + modelopt_list()


def modelopt_list() -> list[str]:
    """Per row: whether `quantization.weights: fp8` / `kv_cache: fp8` quantizes it with ModelOpt on the current line,
    how the reference engine mirrors it, or why not and what to do instead (core/capabilities.py)."""
    return ["", "ModelOpt FP8 on the current line (`quantization.weights: fp8` and/or `quantization.kv_cache: fp8`; "
            f"NVFP4 on the dense rows only), per row (what the export writes: {capabilities.MODELOPT}):", ""] + [
        f"- `{f.name}`: {capabilities.modelopt_cell(f)}" for f in families.FAMILIES]
