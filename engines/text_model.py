"""The causal LM of a target directory, as the reference engine's generic path and the trainer run it.

For most rows of the family table that is transformers' `AutoModelForCausalLM`. A row whose transformers class is an
image-text-to-text wrapper (`Family.text_model` set: Kimi-K2.5, whose model_type AutoModelForCausalLM does not map)
is loaded as that wrapper (`AutoModelForImageTextToText`, the class its own greedy `generate` runs) and its text
model is kept: `TextCausalLM` has the decoder at `.model` (`model.<text_model>` of the wrapper, e.g. Kimi-K2.5's
DeepseekV3Model with its `layers`) and the wrapper's `lm_head`, the interface the generic target and the trainer's
feature capture use. The vision encoder and projector are dropped: the served requests are token ids, which
TensorRT-LLM's wrapper hands to its text model unchanged when no image comes with them. Which class is loaded follows
from the row, not from trying one after the other.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from core.families import family_of


class TextCausalLM(torch.nn.Module):
    """A multimodal wrapper's text model with its lm_head: `.model` the decoder, `.lm_head`, `.config` the
    wrapper's (its `get_text_config()` is the text model's)."""

    def __init__(self, wrapper: Any, attribute: str) -> None:
        super().__init__()
        self.model = getattr(wrapper.model, attribute)
        self.lm_head = wrapper.lm_head
        self.config = wrapper.config

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.model.get_input_embeddings()

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head

    def forward(self, input_ids: torch.Tensor, **kwargs: Any) -> Any:
        """The text model's logits for `input_ids` (keyword arguments go to the decoder), as `.logits`."""
        from transformers.modeling_outputs import CausalLMOutputWithPast

        out = self.model(input_ids=input_ids, **kwargs)
        return CausalLMOutputWithPast(logits=self.lm_head(out.last_hidden_state))


def text_model_of(hf_dir: Path) -> str | None:
    """The wrapper attribute holding the text model of `hf_dir`'s architecture (its family row), or None."""
    cfg = json.loads((Path(hf_dir) / "config.json").read_text())
    row = family_of((cfg.get("architectures") or [None])[0])
    return None if row is None else row.text_model


def load_causal_lm(hf_dir: Path | str, **kwargs: Any) -> Any:
    """transformers' model of `hf_dir` as a causal LM (`from_pretrained` keyword arguments as given)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    attribute = text_model_of(Path(hf_dir))
    if attribute is None:
        return AutoModelForCausalLM.from_pretrained(str(hf_dir), **kwargs)
    return TextCausalLM(AutoModelForImageTextToText.from_pretrained(str(hf_dir), **kwargs), attribute)
