"""Counting output tokens on the client side (as genai-perf does): the ensemble returns text, so the number of
generated tokens is the length of the text re-tokenized with the model's tokenizer (no special tokens added).

`--tokenizer` takes a Hugging Face tokenizer directory (the build's target model; the rendered repository names it
in the preprocessing model's `tokenizer_dir` parameter) or `whitespace` (one token per whitespace-separated word:
exact for the echo test model, an approximation otherwise)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

WHITESPACE = "whitespace"


class TokenCounter(Protocol):
    name: str

    def count(self, text: str) -> int: ...


class WhitespaceCounter:
    name = WHITESPACE

    def count(self, text: str) -> int:
        return len(text.split())


class HFCounter:
    """Counts with a local Hugging Face tokenizer (never downloads: HF_HUB_OFFLINE=1)."""

    def __init__(self, directory: Path) -> None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        from transformers import AutoTokenizer

        if not (directory / "tokenizer_config.json").is_file() and not (directory / "tokenizer.json").is_file():
            raise ValueError(
                f"--tokenizer {directory}: no tokenizer.json / tokenizer_config.json there; pass the target model's "
                f"Hugging Face directory or `{WHITESPACE}`"
            )
        self.name = str(directory)
        self._tok = AutoTokenizer.from_pretrained(str(directory))

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False)) if text else 0


def make_counter(spec: str | None) -> TokenCounter:
    """`whitespace` or a tokenizer directory; None is an error that says what to pass."""
    if spec is None:
        raise ValueError(
            "cannot count output tokens: the model config names no tokenizer this client can open (`tokenizer_dir` "
            "parameter; a served one is relative to the server's repository); "
            f"pass --tokenizer DIR (the target's Hugging Face directory) or --tokenizer {WHITESPACE}"
        )
    if spec == WHITESPACE:
        return WhitespaceCounter()
    path = Path(spec)
    if not path.is_dir():
        raise ValueError(f"--tokenizer {spec}: not a directory; pass a Hugging Face tokenizer dir or {WHITESPACE}")
    return HFCounter(path)
