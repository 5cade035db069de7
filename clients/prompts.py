"""Prompt files for the load tester: JSONL, one object per line, with either `prompt` (a string) or MT-bench's
`turns` (a list of strings; the first turn is the prompt: the load tester sends single-turn requests)."""

from __future__ import annotations

import json
from pathlib import Path


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
