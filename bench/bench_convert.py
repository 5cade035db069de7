"""Benchmark: our streaming converter vs ModelOpt's export_tensorrt_llm_checkpoint vs a plain copy.

    python bench/bench_convert.py [--work-dir /tmp/bench_convert] [--keep]

Writes a synthetic ~1.1B-parameter fp16 Llama (random weights: 22 layers, hidden 2048, intermediate 5632, 32 heads,
4 KV heads, vocab 32000, untied; ~2.2 GB), then runs, each in its OWN process, in this one run:
  copy      shutil.copytree of the HF directory (the I/O floor)
  ours      builders.convert.convert_llama(dtype=float16, tp=1)
  modelopt  transformers AutoModelForCausalLM.from_pretrained + modelopt export_tensorrt_llm_checkpoint(float16)
  baseline  interpreter + `import torch, builders.convert` only (the RSS floor of `ours`)
and prints wall time (whole process, imports included), work time (imports excluded), peak RSS (the child's own
VmHWM) and the ratios.
Needs ~7 GB of free disk in --work-dir and ~3.5 GB of RAM (ModelOpt materializes the whole model).

Inputs:  none: writes its own synthetic model into --work-dir
Outputs: the figures on stdout
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

REPO = Path(__file__).resolve().parent.parent

SHAPE = dict(layers=22, hidden=2048, inter=5632, heads=32, kv_heads=4, vocab=32000)


def write_synthetic(d: Path) -> None:
    """The synthetic model, streamed tensor by tensor (same writer as the converter) so writing it stays small."""
    import torch
    from tokenizers import Tokenizer, models

    from builders.convert.weights import OutTensor, write_safetensors

    s = SHAPE
    h, i, hd = s["hidden"], s["inter"], s["hidden"] // s["heads"]
    kv = s["kv_heads"] * hd
    gen = torch.Generator().manual_seed(0)

    def rnd(name: str, shape: tuple[int, ...]) -> OutTensor:
        return OutTensor(name, shape, torch.float16, lambda: (torch.randn(*shape, generator=gen) * 0.02).half())

    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (s["vocab"], h)}
    for n in range(s["layers"]):
        p = f"model.layers.{n}"
        shapes.update({
            f"{p}.input_layernorm.weight": (h,), f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (h, h), f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h), f"{p}.self_attn.o_proj.weight": (h, h),
            f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h), f"{p}.mlp.down_proj.weight": (h, i),
        })
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (s["vocab"], h)
    plan = [rnd(n, sh) for n, sh in shapes.items()]
    d.mkdir(parents=True, exist_ok=True)
    write_safetensors(d / "model.safetensors", plan, desc="synthetic 1.1B")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": s["vocab"], "hidden_size": h,
        "intermediate_size": i, "num_hidden_layers": s["layers"], "num_attention_heads": s["heads"],
        "num_key_value_heads": s["kv_heads"], "hidden_act": "silu", "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False, "torch_dtype": "float16",
        "bos_token_id": 1, "eos_token_id": 2,
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
    Tokenizer(models.WordLevel({"<unk>": 0, "<s>": 1, "</s>": 2}, unk_token="<unk>")).save(str(d / "tokenizer.json"))


def child(method: str, model: Path, out: Path) -> None:
    """Runs in its own process; prints one JSON line with its work time (imports excluded) and peak RSS."""
    if method in ("ours", "baseline"):
        import torch

        from builders.convert import convert_llama
    elif method == "modelopt":
        import warnings

        import torch

        os.environ["HF_HUB_OFFLINE"] = "1"
        warnings.simplefilter("ignore")
        from modelopt.torch.export import export_tensorrt_llm_checkpoint
        from transformers import AutoModelForCausalLM
    elif method != "copy":
        raise SystemExit(f"unknown method {method}")
    t0 = time.perf_counter()
    if method == "copy":
        shutil.copytree(model, out)
    elif method == "ours":
        convert_llama(model, out, dtype="float16", tp=1)
    elif method == "modelopt":
        m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float16)
        export_tensorrt_llm_checkpoint(m, "llama", dtype=torch.float16, export_dir=out, inference_tensor_parallel=1)
    work = time.perf_counter() - t0
    print(json.dumps({"method": method, "work_s": work, "peak_rss_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """This process's peak RSS: VmHWM of its own address space. (getrusage's ru_maxrss is NOT used: Linux carries
    the parent's high-water mark across fork+exec, so every child would report at least the parent's peak.)"""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB -> MiB
    raise SystemExit("no VmHWM in /proc/self/status (Linux only)")


def run_child(method: str, model: Path, out: Path) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, __file__, "--child", method, "--model", str(model), "--out", str(out)],
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{method} failed:\n{proc.stderr[-4000:]}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["wall_s"] = wall
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) if out.exists() else 0
    res["output_gb"] = size / 1e9
    shutil.rmtree(out, ignore_errors=True)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work-dir", type=Path, default=Path("/tmp/bench_convert"))
    ap.add_argument("--keep", action="store_true", help="keep the synthetic model for the next run")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.model, args.out)
        return
    model = args.work_dir / "synthetic-1.1b"
    if not (model / "config.json").is_file():
        t0 = time.perf_counter()
        write_synthetic(model)
        print(f"wrote synthetic model in {time.perf_counter() - t0:.1f} s: {model}", flush=True)
    n_params = 0
    from builders.convert.weights import read_safetensors_header

    for info in read_safetensors_header(model / "model.safetensors").values():
        k = 1
        for s in info.shape:
            k *= s
        n_params += k
    print(f"model: {n_params / 1e9:.3f} B params, {(model / 'model.safetensors').stat().st_size / 1e9:.2f} GB fp16; "
          f"{os.cpu_count()} CPUs", flush=True)
    results = {}
    print(f"load average before: {os.getloadavg()[0]:.1f} (figures are only comparable on a quiet machine)", flush=True)
    for method in ("baseline", "copy", "ours", "modelopt"):
        results[method] = run_child(method, model, args.work_dir / f"out-{method}")
        r = results[method]
        print(
            f"  {method:9s} wall {r['wall_s']:7.2f} s  (work {r['work_s']:7.2f} s)  peak RSS {r['peak_rss_mb']:8.1f} MB"
            f"  output {r['output_gb']:.2f} GB",
            flush=True,
        )
    o, m, c = results["ours"], results["modelopt"], results["copy"]
    print("ratios:")
    print(
        f"  ours / modelopt   wall {o['wall_s'] / m['wall_s']:.3f}x   "
        f"peak RSS {o['peak_rss_mb'] / m['peak_rss_mb']:.3f}x"
        "   (targets: time <= 0.35x, RSS <= 0.2x)"
    )
    print(f"  ours / modelopt   work {o['work_s'] / m['work_s']:.3f}x   (imports excluded)")
    print(f"  ours / copy       wall {o['wall_s'] / c['wall_s']:.2f}x")
    print(f"  modelopt / copy   wall {m['wall_s'] / c['wall_s']:.2f}x")
    if not args.keep:
        shutil.rmtree(model)


if __name__ == "__main__":
    main()
