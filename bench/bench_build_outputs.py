"""Build time and bytes written by a current-line PyTorch build (trtllm_version 1.4, engine.backend pytorch, an
EAGLE-3 head), for one or more checkouts of the project, in one run.

    python bench/bench_build_outputs.py --work DIR [--shape llama-3.1-8b|tiny] [--layers N]
        [--project LABEL=PATH ...] [--keep]

A synthetic target of the shape (Llama-3.1-8B's config.json: hidden 4096, 32 layers, vocab 128256; random float16
weights of the real shapes, in shards; a small BPE tokenizer) and an EAGLE-3 head of the matching shape (hidden
4096, draft vocabulary 32000) are written once into DIR/inputs. Then each project checkout builds the same config
with its own `builders/build.py` (`python PATH/builders/build.py CONFIG`, PYTHONPATH=PATH), one after the other; the
wall time of the build and the bytes of the regular files it wrote (links to the inputs excluded) are printed per
checkout, and the build directory is removed before the next one (the disk holds one build at a time) unless --keep.
`--layers` changes the number of target layers (a smaller disk); say so where the figures are quoted.

Inputs:  none (everything is synthetic); the checkouts named by --project (default: this one, `this=.`)
Outputs: DIR/inputs/ (target, head), DIR/<label>.yaml, a table on stdout
Guide:   docs/benchmarks.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SHAPES: dict[str, dict[str, Any]] = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, draft_vocab=32000, max_position_embeddings=131072,
                         rope_theta=500000.0, rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 8192}),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=300, draft_vocab=96, max_position_embeddings=2048,
                 rope_theta=10000.0, rope_scaling=None),
}
CORPUS = "the quick brown fox jumps over the lazy dog. speculative decoding drafts tokens and verifies them. " * 8


def llama_config(shape: dict, layers: int) -> dict:
    cfg = {k: v for k, v in shape.items() if k != "draft_vocab"}
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama", num_hidden_layers=layers, hidden_act="silu",
               rms_norm_eps=1e-5, tie_word_embeddings=False, torch_dtype="float16", bos_token_id=1, eos_token_id=2,
               attention_bias=False, mlp_bias=False, head_dim=shape["hidden_size"] // shape["num_attention_heads"])
    if cfg["rope_scaling"] is None:
        cfg.pop("rope_scaling")
    return cfg


def _tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([CORPUS], trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                            pad_token="<|endoftext|>").save_pretrained(out)


def _layer(prefix: str, h: int, inter: int, q: int, kv: int, qkv_in: int, g: Any) -> dict:
    import torch

    def rnd(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.float16)

    return {f"{prefix}.self_attn.q_proj.weight": rnd(q, qkv_in), f"{prefix}.self_attn.k_proj.weight": rnd(kv, qkv_in),
            f"{prefix}.self_attn.v_proj.weight": rnd(kv, qkv_in), f"{prefix}.self_attn.o_proj.weight": rnd(h, q),
            f"{prefix}.mlp.gate_proj.weight": rnd(inter, h), f"{prefix}.mlp.up_proj.weight": rnd(inter, h),
            f"{prefix}.mlp.down_proj.weight": rnd(h, inter),
            f"{prefix}.input_layernorm.weight": torch.ones(h, dtype=torch.float16),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(h, dtype=torch.float16)}


def write_inputs(root: Path, shape: dict, layers: int) -> tuple[Path, Path]:
    """The synthetic target (shards of at most 4 layers) and EAGLE-3 head; reused when already complete."""
    import torch
    from safetensors.torch import save_file

    target, head = root / "target", root / "head"
    cfg = llama_config(shape, layers)
    done = root / "inputs.json"
    if done.is_file() and json.loads(done.read_text()) == cfg:
        return target, head
    shutil.rmtree(root, ignore_errors=True)
    target.mkdir(parents=True)
    g = torch.Generator().manual_seed(0)
    h, inter, vocab = shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = shape["num_attention_heads"] * hd, shape["num_key_value_heads"] * hd
    index: dict[str, str] = {}
    groups = [list(range(i, min(i + 4, layers))) for i in range(0, layers, 4)]
    n_shards = len(groups) + 2

    def save(n: int, shard: dict) -> None:  # one shard in memory at a time
        name = f"model-{n:05d}-of-{n_shards:05d}.safetensors"
        save_file(shard, str(target / name), metadata={"format": "pt"})
        index.update({k: name for k in shard})

    save(1, {"model.embed_tokens.weight": (torch.randn(vocab, h, generator=g) * 0.02).half()})
    for n, group in enumerate(groups, 2):
        shard: dict = {}
        for i in group:
            shard.update(_layer(f"model.layers.{i}", h, inter, q, kv, h, g))
        save(n, shard)
        del shard
    save(n_shards, {"model.norm.weight": torch.ones(h, dtype=torch.float16),
                    "lm_head.weight": (torch.randn(vocab, h, generator=g) * 0.02).half()})
    (target / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": index}))
    (target / "config.json").write_text(json.dumps(cfg, indent=2))
    _tokenizer(target)
    head.mkdir()
    dv = shape["draft_vocab"]
    ids = torch.sort(torch.randperm(vocab, generator=g)[:dv]).values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[ids] = True
    t = _layer("midlayer", h, inter, q, kv, 2 * h, g)
    t.update({"midlayer.hidden_norm.weight": torch.ones(h, dtype=torch.float16),
              "norm.weight": torch.ones(h, dtype=torch.float16),
              "fc.weight": (torch.randn(h, 3 * h, generator=g) * 0.02).half(),
              "lm_head.weight": (torch.randn(dv, h, generator=g) * 0.02).half(),
              "d2t": ids - torch.arange(dv), "t2d": t2d})
    save_file(t, str(head / "model.safetensors"), metadata={"format": "pt"})
    (head / "config.json").write_text(json.dumps(dict(
        cfg, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=dv,
        target_hidden_size=h, eagle_aux_hidden_state_layer_ids=[2, layers // 2, layers - 3]), indent=2))
    done.write_text(json.dumps(cfg))
    return target, head


def write_config(path: Path, target: Path, head: Path, out: Path) -> Path:
    path.write_text(json.dumps({
        "name": "bench-build-outputs", "trtllm_version": "1.4", "output_dir": str(out),
        "target": {"model": str(target), "dtype": "float16"}, "draft": {"type": "eagle3", "model": str(head)},
        "tree": {"choices": "chain-3"}, "engine": {"backend": "pytorch"},
    }, indent=2))
    return path


def bytes_written(build: Path) -> int:
    return sum(p.stat().st_size for p in build.rglob("*") if p.is_file() and not p.is_symlink())


def measure(label: str, project: Path, cfg: Path, build: Path, keep: bool) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=str(project))
    shutil.rmtree(build, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, str(project / "builders" / "build.py"), str(cfg)], env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{label}: the build failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    n = bytes_written(build)
    if not keep:
        shutil.rmtree(build)
    return seconds, n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, required=True, help="scratch directory (inputs and builds)")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, help="target layers (default: the shape's)")
    ap.add_argument("--project", action="append", default=[], metavar="LABEL=PATH",
                    help="a checkout of the project to build with (repeatable; default this=.)")
    ap.add_argument("--keep", action="store_true", help="keep each build directory")
    args = ap.parse_args(argv)
    shape = SHAPES[args.shape]
    layers = args.layers or shape["num_hidden_layers"]
    projects = [p.split("=", 1) for p in args.project] or [["this", str(REPO)]]
    t0 = time.perf_counter()
    target, head = write_inputs(args.work / "inputs", shape, layers)
    target_bytes = sum(p.stat().st_size for p in target.glob("*.safetensors"))
    print(f"inputs: {args.shape} shape, {layers} layers, target {target_bytes / 1e9:.2f} GB of float16 weights "
          f"({time.perf_counter() - t0:.0f} s to write)")
    print("| checkout | build seconds | bytes written |\n|---|---|---|")
    for label, path in projects:
        build = args.work / f"build-{label}"
        cfg = write_config(args.work / f"{label}.json", target, head, build)
        seconds, n = measure(label, Path(path).resolve(), cfg, build, args.keep)
        print(f"| {label} | {seconds:.1f} | {n:,} ({n / 1e9:.2f} GB) |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
