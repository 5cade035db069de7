"""The architecture table: which target architectures (a Hugging Face config.json's `architectures[0]`) each path
serves, per `trtllm_version`, with the upstream code that establishes it. One source of truth:

- the convert stage's preflight refuses a target outside it before anything is written (`problems`), naming the
  architecture, what it supports and the way out;
- docs/contracts.md renders it ("Target architectures", builders/trtllm/ledger_docs.py);
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
- trainer (builders/train_head.py): EAGLE-3 heads from this family's features.
"""

from __future__ import annotations

from dataclasses import dataclass

from builders.trtllm import registry
from builders.trtllm.ledger_rows import Source

TRT = "NVIDIA/TensorRT-LLM"
ONE, TWO = "one-model", "two-model"

EAGLE_FLOW = Source(TRT, "tensorrt_llm/models/eagle/model.py", "class EagleForCausalLM(LLaMAForCausalLM)")
TWO_MODEL_REMOVED = Source(TRT, "pull/17366", "'Force 2 model spec dec to fall back to 1 model' (merged 2026-08)")


@dataclass(frozen=True)
class Architecture:
    name: str  # config.json architectures[0]
    family: str  # what users call it
    engine_flow: bool  # EAGLE-1/2 engine flow (1.1 / 1.2)
    eagle3: str  # ONE | TWO: how the target class runs EAGLE-3 on the PyTorch backend (see `pytorch_mode`)
    reference: str | None  # "native" | "generic" | None
    trainer: bool  # builders/train_head.py trains EAGLE-3 heads for it
    source: Source  # the registration that establishes the PyTorch column
    read: str  # the versions read, by commit (dated by their content where no tag was read)
    note: str = ""

    def pytorch_mode(self, version: str) -> str | None:
        """ONE / TWO where `version` runs this target with an EAGLE-3 head on its PyTorch backend, else None: a
        one-model class runs wherever EAGLE-3 does, a two-model one only where `eagle3_one_model` can be false."""
        v = registry.get(version)
        if not v.pytorch_eagle3 or (self.eagle3 == TWO and not v.eagle3_one_model_field):
            return None
        return self.eagle3

    @property
    def pytorch(self) -> tuple[tuple[str, str], ...]:
        """(trtllm_version, mode) for every version that serves it."""
        return tuple((k, m) for k in registry.VERSIONS if (m := self.pytorch_mode(k)) is not None)

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
        parts.append(f"the reference engine ({self.reference})" if self.reference else "not the reference engine")
        parts.append("the trainer (EAGLE-3 heads)" if self.trainer else "not the trainer")
        return "; ".join(parts)


_HF_LLAMA_LIKE = "HF checkpoint read directly by the PyTorch backend"

ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture(
        "LlamaForCausalLM", "Llama 2 / 3.x, SmolLM2, Vicuna", True, ONE, "native", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_llama.py",
               "@register_auto_model('LlamaForCausalLM') class LlamaForCausalLM(SpecDecOneEngineForCausalLM)"),
        "commit 3a5901cd0d77bed18baaf402d1d12fab468d44a9", _HF_LLAMA_LIKE),
    Architecture(
        "Qwen3ForCausalLM", "Qwen3 dense", False, ONE, "native", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_qwen3.py",
               "@register_auto_model('Qwen3ForCausalLM') class Qwen3ForCausalLM(SpecDecOneEngineForCausalLM)"),
        "commit 5dedf53b14d94f0b53c1bff0e560af11dc3eaf5d",
        "per-head q/k RMSNorm; head_dim independent of hidden_size / heads"),
    Architecture(
        "Qwen2ForCausalLM", "Qwen2 / Qwen2.5", False, TWO, "native", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_qwen.py",
               "@register_auto_model('Qwen2ForCausalLM') class Qwen2ForCausalLM(DecoderModelForCausalLM); "
               "QwenDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states"),
        "commits 047098b74c51f488abcfcd72f7d4a988a56442f6 (a transformers-5 era file), "
        "87b279a9719cc257bb89d19ea794296857e2f83f",
        "q/k/v biases; a config with use_sliding_window true is refused"),
    Architecture(
        "MistralForCausalLM", "Mistral", False, TWO, "native", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_mistral.py",
               "@register_auto_model('MistralForCausalLM') class MistralForCausalLM(DecoderModelForCausalLM); "
               "MistralDecoderLayer.forward: spec_metadata.maybe_capture_hidden_states"),
        "commits 002f3cc3d0554c4ebd530d1354f96e89666d93b8, 0dcfa87b9636e749e3656c1e1e6ee61e4d090a5f",
        "Llama-shaped; contexts beyond a configured sliding_window are refused"),
    Architecture(
        "Qwen3MoeForCausalLM", "Qwen3 MoE (30B-A3B, 235B-A22B)", False, ONE, "generic", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_qwen3_moe.py",
               "@register_auto_model('Qwen3MoeForCausalLM') class Qwen3MoeForCausalLM(SpecDecOneEngineForCausalLM)"),
        "commit a678b91aafbeff265cd0b764abb59d7def624ac2",
        "mixture of experts; reference engine: transformers' own model class"),
    Architecture(
        "GptOssForCausalLM", "gpt-oss", False, ONE, "generic", True,
        Source(TRT, "tensorrt_llm/_torch/models/modeling_gpt_oss.py",
               "@register_auto_model('GptOssForCausalLM') class GptOssForCausalLM(SpecDecOneEngineForCausalLM)"),
        "commit 7924c7f1d3b4a3286b62c13fc890900295dc39cb",
        "mixture of experts, attention sinks, sliding-window layers (reference engine: sequences up to the window)"),
)

BY_NAME = {a.name: a for a in ARCHITECTURES}


def get(name: str) -> Architecture | None:
    return BY_NAME.get(name)


def _listing() -> str:
    return ", ".join(a.name for a in ARCHITECTURES)


def problems(arch: str | None, *, version: str, backend: str, draft_type: str, where: str) -> list[str]:
    """Why this target architecture cannot take this path (empty = it can). `where` names the target."""
    v = registry.get(version)
    a = BY_NAME.get(arch or "")
    if a is None:
        return [f"target.model {where}: architecture {arch!r} is not in the architecture table (docs/contracts.md, "
                f"'Target architectures'), which lists {_listing()}; nothing would serve it as an EAGLE target "
                "here. Use a target of a listed architecture (docs/bring-your-own-model.md)"]
    p: list[str] = []
    if (draft_type == "eagle" or backend == "tensorrt") and not a.engine_flow:
        how = "draft.type=eagle (EAGLE-1/2)" if draft_type == "eagle" else "engine.backend=tensorrt"
        p.append(f"target.model {where}: {a.name} cannot use {how} on {v.name} (trtllm_version '{v.key}'): the engine "
                 f"flow's EagleForCausalLM subclasses LLaMAForCausalLM ({EAGLE_FLOW.path}), so it serves "
                 f"LlamaForCausalLM targets only. {a.name} supports: {a.supports()}. Way out: "
                 f"{_way_out(a)}")
        return p
    if draft_type == "eagle3" and a.pytorch_mode(v.key) is None:
        # The reference engine serves a version's Triton layout and nothing that version could not serve.
        mirror = ", and the reference engine serves only what its version serves" if backend == "reference" else ""
        p.append(f"target.model {where}: {a.name} with an EAGLE-3 head is not served by {v.name}'s PyTorch backend "
                 f"(trtllm_version '{v.key}'; {a.source.path}: {a.source.symbol}){mirror}. {a.name} supports: "
                 f"{a.supports()}. Way out: {_way_out(a)}")
    return p


def _way_out(a: Architecture) -> str:
    if a.pytorch:
        versions = ", ".join(f"'{v}'" for v, _ in a.pytorch)
        return (f"draft.type eagle3 with engine.backend pytorch (GPU) or reference (CPU) and trtllm_version "
                f"{versions}; train an EAGLE-3 head with builders/train_head.py (head: eagle3) if you have none")
    return "none on TensorRT-LLM; use a listed architecture"


def markdown() -> list[str]:
    """The table as docs/contracts.md renders it."""
    versions = list(registry.VERSIONS)
    out = ["| architecture | family | engine flow (EAGLE-1/2) | " + " | ".join(f"PyTorch EAGLE-3 {v}" for v in versions)
           + " | reference engine | trainer | established by | note |",
           "|---|---|---|" + "---|" * len(versions) + "---|---|---|---|"]
    for a in ARCHITECTURES:
        cols = [a.pytorch_mode(v) or "no" for v in versions]
        cite = f"{a.source.repo}:{a.source.path} `{a.source.symbol}` (read: {a.read})"
        out.append(f"| `{a.name}` | {a.family} | {'yes' if a.engine_flow else 'no'} | " + " | ".join(cols)
                   + f" | {a.reference or 'no'} | {'yes' if a.trainer else 'no'} | {cite} | {a.note} |")
    out += ["", f"Engine flow: {EAGLE_FLOW.repo}:{EAGLE_FLOW.path} `{EAGLE_FLOW.symbol}` (read: commit 89fd9b74). "
            f"Two-model EAGLE-3 on the current line: {TWO_MODEL_REMOVED.repo} {TWO_MODEL_REMOVED.path} "
            f"{TWO_MODEL_REMOVED.symbol}; the current line's Eagle3DecodingConfig has no eagle3_one_model field "
            "(docs/contracts.md, Sources). A target outside this table, or on a path its row does not list, is "
            "refused by the convert stage's preflight before anything is written."]
    return out


GUIDE_BEGIN, GUIDE_END = "<!-- architectures: generated -->", "<!-- architectures: end -->"


def guide_table() -> list[str]:
    """The table by architecture of docs/bring-your-own-model.md (what to set for each target)."""
    out = ["| target architecture | family | EAGLE-1/2 heads (engine flow) | EAGLE-3 on TensorRT-LLM | "
           "reference engine (CPU) | trainer | note |", "|---|---|---|---|---|---|---|"]
    for a in ARCHITECTURES:
        modes: dict[str, list[str]] = {}
        for v, m in a.pytorch:
            modes.setdefault(m, []).append(v)
        e3 = "; ".join(f"{m} on {', '.join(vs)}" for m, vs in modes.items()) or "no"
        out.append(f"| `{a.name}` | {a.family} | {'1.1, 1.2' if a.engine_flow else 'no'} | {e3} | "
                   f"{a.reference or 'no'} | {'yes' if a.trainer else 'no'} | {a.note} |")
    return out
