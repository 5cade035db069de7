"""The doctor's inputs checked before any work: every config.json read as a bounded regular file, every count it
uses a JSON integer (not a bool, a string or a float) in a range, every float a number; the command-line limits;
the prompts file bounded per file, per line and per prompt count. Each refusal is an UnusableInput (exit 2) naming
the file, the key, what was found and the range, as the build's config refuses its fields (builders/config.py).

The ranges are far above any model this project builds or reads and low enough that nothing sized by them (a list
of layer names, a tensor of `vocab_size` rows) can exhaust memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from doctor.findings import UnusableInput
from core.files import MIB, InputFileError, parse_json, read_text, text_lines

MAX_CONFIG_BYTES = 16 * MIB  # a config.json (HF configs are a few KiB)
MAX_PROMPTS_BYTES = 64 * MIB  # a prompts file
MAX_PROMPT_LINE_BYTES = 1 * MIB  # one JSONL line: one prompt
MAX_PROMPTS = 10_000
MAX_NEW_TOKENS = 4096
MAX_SEQ_LEN = 1 << 24  # --max-seq-len (16,777,216 positions)

MAX_LAYERS = 1024
MAX_WIDTH = 1 << 20  # hidden / intermediate / target hidden size
MAX_HEADS = 4096
MAX_VOCAB = 1 << 24
# key -> (low, high): counts a reader sizes lists and tensors by
INT_FIELDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, MAX_LAYERS),
    "hidden_size": (1, MAX_WIDTH),
    "intermediate_size": (1, MAX_WIDTH),
    "target_hidden_size": (1, MAX_WIDTH),
    "num_attention_heads": (1, MAX_HEADS),
    "num_key_value_heads": (1, MAX_HEADS),
    "head_dim": (1, MAX_WIDTH),
    "vocab_size": (1, MAX_VOCAB),
    "draft_vocab_size": (1, MAX_VOCAB),
    "max_position_embeddings": (1, MAX_SEQ_LEN),
}
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")  # positive numbers
LAYER_IDS = "eagle_aux_hidden_state_layer_ids"
MAX_LAYER_IDS = 64


def read_json_config(directory: Path, what: str) -> dict[str, Any]:
    """`directory`/config.json: a regular file of at most MAX_CONFIG_BYTES holding a JSON object, fields checked."""
    path = Path(directory) / "config.json"
    try:
        cfg = parse_json(read_text(path, what, MAX_CONFIG_BYTES), f"{what} {path}")
    except InputFileError as e:
        raise UnusableInput(str(e)) from None
    if not isinstance(cfg, dict):
        raise UnusableInput(f"{what} {path}: the top level must be a JSON object")
    check_fields(cfg, f"{what} {path}")
    return cfg


def _int_problem(value: Any, low: int, high: int) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return f"is {json.dumps(value)[:40]} ({type(value).__name__}); give an integer in [{low}, {high}]"
    if not low <= value <= high:
        return f"is {value}; give an integer in [{low}, {high}]"
    return None


def check_fields(cfg: dict[str, Any], where: str) -> None:
    """Types and ranges of the fields a reader sizes work by; in nested blocks (transformer_layer_config,
    eagle_config) too. All problems are reported at once."""
    problems: list[str] = []
    blocks: list[tuple[str, dict[str, Any]]] = [("", cfg)]
    blocks += [(f"{k}.", v) for k in ("transformer_layer_config", "eagle_config") if isinstance(v := cfg.get(k), dict)]
    for prefix, block in blocks:
        for key, (low, high) in INT_FIELDS.items():
            if key in block and block[key] is not None and (p := _int_problem(block[key], low, high)):
                problems.append(f"{prefix}{key} {p}")
        for key in FLOAT_FIELDS:
            value = block.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not 0 < value < float("inf")):
                problems.append(f"{prefix}{key} is {json.dumps(value)[:40]}; give a positive number")
        ids = block.get(LAYER_IDS)
        if ids is not None:
            if not isinstance(ids, list) or not 0 < len(ids) <= MAX_LAYER_IDS:
                problems.append(f"{prefix}{LAYER_IDS} must be a list of 1 to {MAX_LAYER_IDS} layer indices")
            elif bad := [i for i in ids if _int_problem(i, -1, MAX_LAYERS - 1)]:
                problems.append(f"{prefix}{LAYER_IDS} holds {json.dumps(bad)[:60]}; give integers in "
                                f"[-1, {MAX_LAYERS - 1}]")
    if problems:
        raise UnusableInput(f"{where}: " + "; ".join(problems))


def check_limits(max_new_tokens: int, max_seq_len: int | None) -> None:
    if not 2 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise UnusableInput(f"--max-new-tokens {max_new_tokens}: give an integer in [2, {MAX_NEW_TOKENS}]")
    if max_seq_len is not None and not 1 <= max_seq_len <= MAX_SEQ_LEN:
        raise UnusableInput(f"--max-seq-len {max_seq_len}: give an integer in [1, {MAX_SEQ_LEN}] (prompt + output "
                            "tokens)")


def read_prompts(path: Path) -> list[str]:
    """Prompts from a JSONL file (`prompt` or MT-bench `turns`, as sources.data.read_prompts), bounded: the file,
    each line and the number of prompts; each line is refused by its length before it is parsed or tokenized."""
    out: list[str] = []
    try:
        for n, line in text_lines(path, "--prompts", MAX_PROMPTS_BYTES, MAX_PROMPT_LINE_BYTES):
            if not line.strip():
                continue
            row = parse_json(line, f"--prompts {path}: line {n}")
            prompt = row.get("prompt") if isinstance(row, dict) else None
            turns = row.get("turns") if isinstance(row, dict) else None
            if isinstance(prompt, str) and prompt:
                out.append(prompt)
            elif isinstance(turns, list) and turns and isinstance(turns[0], str) and turns[0]:
                out.append(turns[0])
            else:
                raise UnusableInput(f"--prompts {path}: line {n} has neither a non-empty string `prompt` nor a "
                                    "non-empty `turns` list")
            if len(out) > MAX_PROMPTS:
                raise UnusableInput(f"--prompts {path}: more than {MAX_PROMPTS} prompts; give fewer")
    except InputFileError as e:
        raise UnusableInput(str(e)) from None
    if not out:
        raise UnusableInput(f"--prompts {path}: no prompts (one JSON object per line with a `prompt` string)")
    return out
