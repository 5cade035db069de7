"""The draft kinds and the backends as types: one class each, chosen by the config's `draft.type` and
`engine.backend` fields (`cfg.draft.kind`, `cfg.engine.kind`), each declaring what differs between them: what they
run on, what their stages write and who reads it, which Triton model serves them, and the config fields they refuse.

The config file and its error messages are unchanged (the fields stay strings, validated as literals); code asks the
kind instead of comparing the string. This module imports nothing of the project at run time, so every layer asks it:
the build config, the reference spec (`spec.kind`), the trainer config (`cfg.kind`), the doctor's head detection and
the Triton models. Behaviour that needs a stage's code stays with that stage, keyed by the class (the engine stage's
EngineSteps, builders/trtllm/rules.py for TensorRT-LLM's limits).
"""

from __future__ import annotations

from typing import ClassVar, Protocol


class DraftConfig(Protocol):  # the fields of builders/config.py DraftConfig the kinds read (no import: see above)
    model: str
    draft_vocab: str | None


class ParallelConfig(Protocol):
    tp: int
    pp: int


# ---- draft kinds --------------------------------------------------------------------------------------------------


class DraftKind:
    """An EAGLE head family: what its checkpoint holds and how the converter writes it."""

    name: ClassVar[str]
    label: ClassVar[str]  # how users and upstream name it
    eagle3: ClassVar[bool]  # fuses three target layers, drafts over a reduced vocabulary, own head directory
    checkpoint_architecture: ClassVar[str]  # what the TensorRT-LLM checkpoint's config.json declares

    def draft_problems(self, draft: DraftConfig) -> list[str]:
        """The `draft` fields this kind cannot take."""
        return []

    def __repr__(self) -> str:
        return f"<draft kind {self.name}>"


class Eagle12(DraftKind):
    """EAGLE-1/2: one decoder layer over the target's last hidden state, converted into the target's TensorRT-LLM
    checkpoint as EagleForCausalLM (the engine flow's layout)."""

    name, label, eagle3 = "eagle", "EAGLE-1/2", False
    checkpoint_architecture = "EagleForCausalLM"


class Eagle3(DraftKind):
    """EAGLE-3: features of three target layers, a reduced draft vocabulary; its normalized head is written beside
    the target checkpoint (checkpoint/eagle3/) and loaded as the speculative model."""

    name, label, eagle3 = "eagle3", "EAGLE-3", True
    checkpoint_architecture = "the target's architecture"

    def draft_problems(self, draft: DraftConfig) -> list[str]:
        p = []
        if draft.model == "random":
            p.append("draft.model=random is supported for draft.type=eagle only; give an EAGLE-3 head directory")
        if draft.draft_vocab is not None:
            p.append("draft.draft_vocab is for draft.type=eagle; an EAGLE-3 head drafts over its own vocabulary (d2t)")
        return p


DRAFT_KINDS: dict[str, DraftKind] = {k.name: k for k in (Eagle12(), Eagle3())}


# ---- backends -----------------------------------------------------------------------------------------------------


class Backend:
    """What serves the build: its runtime, what the engine stage writes, which Triton LLM model serves it."""

    name: ClassVar[str]
    runs_trtllm: ClassVar[bool]  # needs TensorRT-LLM in the serving image (start-up and import checks)
    reference_engine: ClassVar[bool] = False  # this toolkit's PyTorch engine (CPU, every version's layout)
    engine_flow: ClassVar[bool] = False  # trtllm-build engines and the C++ runtime (TensorRT-LLM 1.1 / 1.2)
    cpp_triton_model: ClassVar[bool] = False  # Triton's C++ tensorrtllm backend serves the LLM model
    loads_hf_target: ClassVar[bool] = False  # loads the Hugging Face target itself (no converted target weights)
    exports_speculative_metrics: ClassVar[bool] = False  # its LLM model reports speculation itself (no perf bridge)
    speculative_penalties: ClassVar[bool] = False  # occurrence penalties on the speculative path (enable_penalty)
    greedy_only: ClassVar[bool] = False  # accepts drafts by token equality: sampling requests refused
    llmapi_model: ClassVar[bool] = False  # served by an LLM API model that reads model.yaml (LLM(**args))
    python_llm_model: ClassVar[str | None]  # the Triton python model file serving it (triton_repo/models/), or None
    llmapi_layout_model: ClassVar[str | None] = None  # its model.py in the current line's llmapi layout
    target_weights_reader: ClassVar[str] = ""
    tokenizer_reader: ClassVar[str] = "the Triton preprocessing / postprocessing models and the reference engine"
    eagle3_head_reader: ClassVar[str] = "the reference engine (engine/reference.json eagle3_head_dir)"

    def world_size(self, parallel: ParallelConfig) -> int:
        """Server processes: one, unless the runtime runs a process per rank."""
        return 1

    def parallel_problems(self, parallel: ParallelConfig) -> list[str]:
        return []

    def draft_problems(self, draft: DraftConfig) -> list[str]:
        """The `draft` fields this backend cannot take (a reduced EAGLE-1/2 draft vocabulary is the reference
        engine's own)."""
        if draft.draft_vocab is None:
            return []
        return [f"draft.draft_vocab needs engine.backend reference (TensorRT-LLM's {self.name} backend drafts over the "
                "full vocabulary); remove draft.draft_vocab"]

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


class TensorrtEngine(Backend):
    """The engine flow (TensorRT-LLM 1.1 / 1.2): trtllm-build engines served by Triton's C++ tensorrtllm backend,
    one MPI rank per GPU. EAGLE-1/2 heads; greedy acceptance (token equality)."""

    name, runs_trtllm, engine_flow, cpp_triton_model, greedy_only = "tensorrt", True, True, True, True
    python_llm_model = None
    target_weights_reader = "the engine stage (trtllm-build --checkpoint_dir)"

    def world_size(self, parallel: ParallelConfig) -> int:
        return parallel.tp * parallel.pp


class PytorchLlmApi(Backend):
    """TensorRT-LLM's PyTorch backend behind the LLM API (trtllm-serve, Triton's llmapi model): EAGLE-3 heads; it
    loads the Hugging Face target itself and reports its own speculation statistics."""

    name, runs_trtllm = "pytorch", True
    loads_hf_target, exports_speculative_metrics, speculative_penalties, llmapi_model = True, True, True, True
    python_llm_model, llmapi_layout_model = "llmapi_llm.py", "llmapi_bridge.py"  # the bridge imports upstream's
    tokenizer_reader = "the Triton stage (the client descriptor's tokenizer)"
    eagle3_head_reader = "TensorRT-LLM (speculative_config's speculative model)"


class ReferenceEngine(Backend):
    """This toolkit's PyTorch reference engine (engines/): runs every checkpoint on CPU, serves the chosen
    version's Triton layout through python models, measures acceptance."""

    name, runs_trtllm, reference_engine = "reference", False, True
    python_llm_model, llmapi_layout_model = "reference_llm.py", "llmapi_reference.py"
    target_weights_reader = "the reference engine (engines/checkpoint.py, via engine/reference.json)"

    def parallel_problems(self, parallel: ParallelConfig) -> list[str]:
        return [f"parallel.pp={parallel.pp}: the reference engine runs tp only; set pp=1"] if parallel.pp > 1 else []

    def draft_problems(self, draft: DraftConfig) -> list[str]:
        return []


BACKENDS: dict[str, Backend] = {b.name: b for b in (TensorrtEngine(), PytorchLlmApi(), ReferenceEngine())}
