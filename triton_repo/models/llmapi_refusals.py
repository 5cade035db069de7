"""Inputs of upstream's llmapi config.pbtxt that the reference engine's mirror (models/llmapi_reference.py) declares
only to refuse them by name: a client written for upstream's model gets INVALID_ARGUMENT saying what is not served
here, instead of Triton's "unexpected inference input". Kept apart from request parsing (models/llmapi_io.py)."""

from __future__ import annotations

from typing import Any

from triton_repo.llmapi_contract import LORA_INPUTS

LORA_NAMES = tuple(t.name for t in LORA_INPUTS)


def refuse_adapter_inputs(pb_utils: Any, request: Any) -> str | None:
    """The refusal message when the request carries any lora_* input, else None."""
    sent = [n for n in LORA_NAMES if pb_utils.get_input_tensor_by_name(request, n) is not None]
    if not sent:
        return None
    return (f"{', '.join(sent)}: LoRA adapters are not served by this deployment (the reference engine runs the "
            "target and its EAGLE-3 head only); send the request without the lora_* inputs")
