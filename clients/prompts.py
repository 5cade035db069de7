"""Prompt files for the load tester: JSONL, one object per line, with either `prompt` (a string) or MT-bench's
`turns` (a list of strings; the first turn is the prompt: the load tester sends single-turn requests)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

THINKING_SWITCH = "enable_thinking"  # the variable Qwen3's chat template reads (its model card: enable_thinking)


class PromptFileError(ValueError):
    """A prompt file that cannot be used; the message names the file, the line and the fix."""


def _prompt_of(obj: object, where: str) -> str:
    if not isinstance(obj, dict):
        raise PromptFileError(f"{where}: expected a JSON object with `prompt` or `turns`, got {type(obj).__name__}")
    if "prompt" in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise PromptFileError(f"{where}: `prompt` must be a non-empty string, got {prompt!r}")
        return prompt
    if "turns" in obj:
        turns = obj["turns"]
        if not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise PromptFileError(f"{where}: `turns` must be a non-empty list of strings (MT-bench), got {turns!r}")
        return turns[0]
    raise PromptFileError(f"{where}: no `prompt` or `turns` key (keys: {sorted(obj)}); add one of them")


def load_prompts(path: Path) -> list[str]:
    """All prompts of a JSONL file, in file order; blank lines are skipped."""
    if not path.is_file():
        raise PromptFileError(f"prompt file {path} does not exist; pass a JSONL file with `prompt` or `turns` lines")
    prompts: list[str] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PromptFileError(f"{path}:{lineno}: not valid JSON ({e.msg}); write one JSON object per line") from e
        prompts.append(_prompt_of(obj, f"{path}:{lineno}"))
    if not prompts:
        raise PromptFileError(f"prompt file {path} holds no prompts")
    return prompts


def chat_template(tokenizer_dir: str | None, thinking: str | None = None) -> Callable[[str], str]:
    """prompt -> the prompt inside the model's chat template, as one user turn with the generation prompt (the server
    applies none: contract.text_input). `thinking` on/off sets the template's thinking switch; a template without
    one is refused rather than silently ignored. The tokenizer is loaded once."""
    if tokenizer_dir is None or tokenizer_dir == "whitespace":
        raise ValueError("--chat needs the model's tokenizer: pass --tokenizer DIR (the repository names none)")
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    if not tok.chat_template:
        raise ValueError(f"--chat: the tokenizer in {tokenizer_dir} has no chat template; drop --chat")
    extra = {}
    if thinking is not None:
        if THINKING_SWITCH not in str(tok.chat_template):
            raise ValueError(f"--thinking: the chat template in {tokenizer_dir} has no `{THINKING_SWITCH}` switch "
                             "(Qwen3's templates have one); drop --thinking")
        extra[THINKING_SWITCH] = thinking == "on"

    def wrap(prompt: str) -> str:
        text: str = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                            add_generation_prompt=True, **extra)
        return text

    return wrap


def chat_prompt(tokenizer_dir: str | None, prompt: str, thinking: str | None = None) -> str:
    """One prompt inside the model's chat template (`chat_template`)."""
    return chat_template(tokenizer_dir, thinking)(prompt)
