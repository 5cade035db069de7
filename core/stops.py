"""The token ids a served answer stops at: the tokenizer's eos token and every `eos_token_id` of the model's
generation_config.json (an int or a list), as transformers' `generate` stops (GenerationConfig.eos_token_id).

Chat models list their end-of-turn tokens there: Qwen2.5 / Qwen3 instruct models stop at `<|im_end|>` and
`<|endoftext|>`, Llama 3 instruct at `<|eot_id|>` and `<|end_of_text|>`, while the tokenizer names one eos token.
The convert stage copies generation_config.json next to the tokenizer files (builders/convert/tokenizer.py), so the
file is read from the tokenizer's directory.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


class StopTokenError(ValueError):
    """A generation_config.json whose eos_token_id is not an int or a list of ints; the message names the file."""


def generation_eos_ids(directory: Path) -> list[int]:
    """`eos_token_id` of `directory`/generation_config.json ([] when there is no such file or key)."""
    return list(_eos_ids(str(directory)))


@functools.lru_cache(maxsize=16)
def _eos_ids(directory: str) -> tuple[int, ...]:  # read once per directory (a served model asks per request)
    f = Path(directory) / "generation_config.json"
    if not f.is_file():
        return ()
    try:
        value = json.loads(f.read_text()).get("eos_token_id")
    except (ValueError, AttributeError) as e:
        raise StopTokenError(f"{f}: not a JSON object ({e}); fix or remove it") from None
    values = value if isinstance(value, list) else [] if value is None else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise StopTokenError(f"{f}: eos_token_id={value!r} must be an int or a list of ints")
    return tuple(int(v) for v in values)


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's eos id, then generation_config.json's, without repeats."""
    ids = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    name = getattr(tokenizer, "name_or_path", None)
    if name and Path(name).is_dir():
        ids += generation_eos_ids(Path(name))
    return list(dict.fromkeys(ids))
