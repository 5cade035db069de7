"""What the llmapi layout's `tensorrt_llm` model refuses at the request boundary, by name, with INVALID_ARGUMENT,
instead of passing it on to fail later or to be dropped. Kept apart from request parsing (models/llmapi_io.py) and
shared by upstream's model under the metrics bridge (models/llmapi_bridge.py, engine.backend pytorch) and the
reference engine's mirror (models/llmapi_reference.py), so both answer a request alike.

Sampling inputs the one-model speculative path cannot honour (TensorRT-LLM's rule, read in
NVIDIA/TensorRT-LLM tensorrt_llm/_torch/speculative/spec_sampler_base.py `SpecSampler.validate_request` at commit
006567a7b85d72e256e4863bf65ae843ba8d3a7b and tensorrt_llm/_torch/speculative/utils.py `get_spec_decoder`):
- a repetition / presence / frequency penalty other than neutral needs `enable_penalty: true` in the speculative
  config, and is refused under tree speculation (eagle_choices or a dynamic tree) even then. Of those, the llmapi
  model takes presence and frequency (helpers.py get_sampling_params_from_request); Triton refuses every other
  sampling input as undeclared (min_p, repetition_penalty, logprobs and the logits outputs among them);
- log probabilities are never computed there, so `return_cumulative_logprob` could only answer "None".
Upstream checks these when the request reaches its executor; here they are refused before the LLM sees them.
"""

from __future__ import annotations

from typing import Any

from triton_repo.llmapi_contract import LORA_INPUTS

LORA_NAMES = tuple(t.name for t in LORA_INPUTS)
PENALTIES = ("sampling_param_presence_penalty", "sampling_param_frequency_penalty")  # neutral value: 0
PENALTY_SWITCH = "tree.enable_penalty (TensorRT-LLM's speculative_config.enable_penalty)"


def refuse_adapter_inputs(pb_utils: Any, request: Any) -> str | None:
    """The refusal message when the request carries any lora_* input, else None."""
    sent = [n for n in LORA_NAMES if pb_utils.get_input_tensor_by_name(request, n) is not None]
    if not sent:
        return None
    return (f"{', '.join(sent)}: LoRA adapters are not served by this deployment (the reference engine runs the "
            "target and its EAGLE-3 head only); send the request without the lora_* inputs")


def _scalar(pb_utils: Any, request: Any, name: str) -> Any:
    t = pb_utils.get_input_tensor_by_name(request, name)
    if t is None:
        return None
    arr = t.as_numpy().reshape(-1)
    return arr[0].item() if arr.size else None


def refuse_speculative_sampling(pb_utils: Any, request: Any, spec: dict[str, Any]) -> str | None:
    """The refusal message for what the one-model speculative path cannot honour under `spec` (model.yaml's
    speculative_config), else None."""
    if _scalar(pb_utils, request, "return_cumulative_logprob"):
        return ("return_cumulative_logprob: speculative decoding computes no log probabilities (TensorRT-LLM's "
                "one-model speculative sampler refuses logprobs), so there is no cumulative_logprob to return; send "
                "the request without it")
    sent = [f"{n}={v:g}" for n in PENALTIES if (v := _scalar(pb_utils, request, n)) not in (None, 0.0)]
    if not sent:
        return None
    what = ", ".join(sent)
    if spec.get("use_dynamic_tree") or spec.get("eagle_choices"):
        return (f"{what}: TensorRT-LLM does not apply penalties under tree speculation (this deployment drafts a "
                "tree); send the request without them, or serve a chain built with " + PENALTY_SWITCH)
    if not spec.get("enable_penalty"):
        return (f"{what}: TensorRT-LLM's one-model speculative path applies penalties only when the deployment "
                f"turns them on: rebuild with {PENALTY_SWITCH} (engine.backend pytorch, a chain), or send the "
                "request without them")
    return None
