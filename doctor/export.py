"""`python -m doctor export --head DIR --to eagle-repo|specforge|speculators|trtllm OUT [--target DIR]
[--verifier-name ORG/NAME]`:
an EAGLE-3 head (any layout the doctor reads) written in the layout a loader reads, tensors unchanged.

- eagle-repo (SafeAILab/EAGLE@cb7e0841 eagle/model/ea_model.py EaModel, eagle/model/cnets.py Model): flat Llama
  config with a top-level `rope_theta` (cnets.py `_init_rope` reads no other), `draft_vocab_size`,
  `midlayer.*` tensors (load_state_dict(strict=False) ignores any other spelling), `d2t`/`t2d`, and
  `embed_tokens.weight` always: with `target_hidden_size` set the loader takes the embedding from the head file
  only, and without it cnets.py reads the target's from a `model.safetensors.index.json` that single-file targets
  lack. A head without an embedding needs --target to copy the target's in. The loader captures layers
  (2, L//2, L-3) whatever the head says: a head trained on others is reported, not rewritten.
- specforge (what SGLang's LlamaForCausalLMEagle3 loads, sgl-project/sglang@03d5a777
  python/sglang/srt/models/llama_eagle3.py): flat config, `tie_word_embeddings` false, `draft_vocab_size`, the
  captured layers at the top level and in an `eagle_config` block, `midlayer.*` tensors, d2t/t2d.
- speculators (speculators 0.9.0 speculators/models/eagle3: Eagle3SpeculatorConfig, Eagle3DraftModel):
  `speculators_model_type` eagle3, a nested `transformer_layer_config`, `speculators_config` with the verifier
  (--target's `architectures`; name_or_path = --verifier-name or the target's hub id, as speculators/config.py
  `VerifierConfig.from_config` takes them from the verifier's config; a local path only when given as the name),
  `layers.0.*` tensors. Its fc is [n_aux * hidden_size -> hidden_size], so heads whose
  target_hidden_size differs from hidden_size cannot be written there.
- trtllm: this project's converter (builders/convert/eagle3.py `write_eagle3_head`), needs --target.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from builders.convert.weights import WeightSource
from doctor.config_check import read_json_config
from doctor.findings import UnusableInput
from builders.convert.head_layout import ARCH_FLAGS, flat_config
from doctor.head import Head, read_head
from core.hfconfig import llama_spec, read_config, rope_theta_of

LAYOUT_KEYS = ("speculators_model_type", "speculators_config", "transformer_layer_config", "speculators_version",
               "eagle_config", "eagle_deploy", "auto_map")
LLAMA_LAYER_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                    "rope_theta", "rope_scaling", "rope_parameters", "attention_bias", "mlp_bias", "bos_token_id",
                    "eos_token_id", "pad_token_id", "initializer_range", "model_type", "tie_word_embeddings",
                    "torch_dtype", "dtype")


def canonical(head: Head) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(flat config without layout-specific keys, tensors with `midlayer.*` names)."""
    if not head.kind.eagle3:
        raise UnusableInput(f"{head.dir} is an EAGLE-1/2 head; export writes EAGLE-3 heads (EAGLE-1/2 heads have one "
                            "layout, SafeAILab's, which every loader reads)")
    with WeightSource(head.dir) as src:
        tensors = {n: src.read(n) for n in src.tensors}
    pre = head.mid + "."
    tensors = {("midlayer." + n[len(pre):] if n.startswith(pre) else n): t for n, t in tensors.items()}
    cfg = {k: v for k, v in head.cfg.items() if k not in LAYOUT_KEYS}
    ids = head.layer_ids
    if ids is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = ids
    cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    cfg["draft_vocab_size"] = int(tensors["lm_head.weight"].shape[0]) if "lm_head.weight" in tensors else cfg.get(
        "draft_vocab_size", cfg.get("vocab_size"))
    cfg["rope_theta"] = rope_theta_of(cfg, head.dir / "config.json")
    return cfg, tensors


def _write(out: Path, cfg: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def _target_embedding(target_dir: Path | None, head: Head) -> torch.Tensor:
    if target_dir is None:
        raise UnusableInput(f"{head.dir} ships no embed_tokens.weight; give --target so the target's embedding is "
                            "copied into the export (the EAGLE authors' loader reads it from the head file)")
    with WeightSource(target_dir) as src:
        return src.read("model.embed_tokens.weight")


def to_eagle_repo(head: Head, out: Path, target_dir: Path | None) -> list[str]:
    cfg, t = canonical(head)
    notes = []
    if head.switches:
        raise UnusableInput(f"the head uses {', '.join(head.switches)}; the EAGLE authors' network has no such switch")
    if "fc.bias" in t:
        raise UnusableInput(
            "the head has fc.bias; the EAGLE authors' EAGLE-3 fc has none (bias=False): it cannot run there"
        )
    if "embed_tokens.weight" not in t:
        t["embed_tokens.weight"] = _target_embedding(target_dir, head).to(t["fc.weight"].dtype)
        notes.append("embed_tokens.weight copied from the target")
    scaling = cfg.get("rope_scaling")
    if isinstance(scaling, dict) and "type" not in scaling and "rope_type" in scaling:
        cfg["rope_scaling"] = dict(scaling, type=scaling["rope_type"])
    cfg.pop("rope_parameters", None)  # a transformers-5 block beside rope_theta; the loader reads rope_theta
    if target_dir is not None and cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
        L = llama_spec(target_dir, require_arch=False).num_hidden_layers
        if cfg["eagle_aux_hidden_state_layer_ids"] != [2, L // 2, L - 3]:
            notes.append(
                f"WARNING: the loader captures layers {[2, L // 2, L - 3]} (modeling_llama_kv.py, hard-coded); "
                f"this head was trained on {cfg['eagle_aux_hidden_state_layer_ids']}"
            )
    _write(out, cfg, t)
    return notes


def to_specforge(head: Head, out: Path, target_dir: Path | None) -> list[str]:
    cfg, t = canonical(head)
    cfg["tie_word_embeddings"] = False  # SGLang ties lm_head to embed_tokens when it is true
    if cfg.get("eagle_aux_hidden_state_layer_ids") is not None:
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": cfg["eagle_aux_hidden_state_layer_ids"]}
    _write(out, cfg, t)
    return []


def to_speculators(head: Head, out: Path, target_dir: Path | None, verifier_name: str | None = None) -> list[str]:
    cfg, t = canonical(head)
    hidden = int(cfg["hidden_size"])
    if int(cfg.get("target_hidden_size") or hidden) != hidden:
        raise UnusableInput(f"target_hidden_size {cfg['target_hidden_size']} != hidden_size {hidden}: speculators' "
                            "Eagle3DraftModel sizes fc from hidden_size and cannot load this head")
    layer = {
        k: cfg[k] for k in LLAMA_LAYER_KEYS if k in cfg and k not in ("rope_theta", "rope_scaling", "rope_parameters")
    }
    layer["rope_parameters"] = dict(cfg.get("rope_scaling") or {"rope_type": "default"}, rope_theta=cfg["rope_theta"])
    layer.update(model_type="llama", tie_word_embeddings=False)
    verifier = verifier_config(target_dir, verifier_name)
    notes = [] if verifier["name_or_path"] is not None else [
        "speculators_config.verifier.name_or_path is null (the target's config names no hub id): speculators' "
        "Eagle3DraftModel.from_pretrained loads the verifier's config by that name; pass --verifier-name ORG/NAME"]
    spec = {
        "architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
        "speculators_config": {"algorithm": "eagle3", "default_proposal_method": "greedy", "verifier": verifier,
                               "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}]},
        "transformer_layer_config": layer, "draft_vocab_size": cfg["draft_vocab_size"],
        "target_hidden_size": cfg.get("target_hidden_size"),
        "eagle_aux_hidden_state_layer_ids": cfg.get("eagle_aux_hidden_state_layer_ids"),
        **{k: bool(cfg.get(k, False)) for k in ARCH_FLAGS},
    }
    _write(
        out, spec, {("layers.0." + n[len("midlayer.") :] if n.startswith("midlayer.") else n): v for n, v in t.items()}
    )
    return notes


# A Hugging Face hub id ("org/name"): the one spelling of the verifier that means the same on every machine.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def verifier_config(target_dir: Path | None, name: str | None = None) -> dict[str, Any]:
    """speculators' VerifierConfig (name_or_path, architectures), as its `from_config` fills it from the verifier's
    config: the target's own `architectures`, and `name` (--verifier-name) or else the target's hub id
    (`_name_or_path`). A local path is written only when given as `name`: it means nothing on another machine, so
    without either name_or_path is null (which VerifierConfig allows)."""
    cfg = read_config(target_dir) if target_dir is not None else {}
    if name is None:
        own = cfg.get("_name_or_path") or cfg.get("name_or_path")
        name = own if isinstance(own, str) and HUB_ID.fullmatch(own) else None
    return {"name_or_path": name, "architectures": list(cfg.get("architectures") or [])}


def to_trtllm(head: Head, out: Path, target_dir: Path | None) -> list[str]:
    from builders.convert.eagle3 import write_eagle3_head
    from builders.convert.llama import Provenance

    if target_dir is None:
        raise UnusableInput("--to trtllm validates the head against its target: give --target")
    target = llama_spec(target_dir)
    ids = head.layer_ids or [2, target.num_hidden_layers // 2, target.num_hidden_layers - 3]
    names: dict[torch.dtype | None, str] = {torch.float16: "float16", torch.bfloat16: "bfloat16"}
    dtype = names.get(head.dtypes.get("fc.weight"), "float32")
    prov = Provenance(random_head=False, target_source=str(target_dir), head_source=str(head.dir))
    write_eagle3_head(head.dir, target, out, dtype=dtype, layer_ids=ids, prov=prov)
    return []


def import_speculators(head_dir: Path, out: Path) -> Path:
    """A speculators head as a flat HF EAGLE-3 head (midlayer.* names); tensors unchanged."""
    raw = json.loads((Path(head_dir) / "config.json").read_text())
    cfg = flat_config(raw, Path(head_dir) / "config.json")
    with WeightSource(Path(head_dir)) as src:
        t = {("midlayer." + n[len("layers.0."):] if n.startswith("layers.0.") else n): src.read(n) for n in src.tensors}
    _write(out, cfg, t)
    return out


WRITERS = {"eagle-repo": to_eagle_repo, "specforge": to_specforge, "speculators": to_speculators, "trtllm": to_trtllm}


def out_problems(out: Path, inputs: list[Path]) -> list[str]:
    """Why export must not write to `out` (empty when it may): the build's output-directory rules
    (builders/build_dir.py `output_dir_problems`: a directory or nothing yet, not the project's sources), plus no
    symbolic link as `out` or inside it and no file inside it with another hard link (the build's rule for what it
    may write: builders/build_dir.py `single_file`; export would write through either, elsewhere) and not one of
    its own inputs (the head or target directory), inside one or above one (it would rewrite what it reads)."""
    from builders.build_dir import output_dir_problems, single_file

    if out.is_symlink():
        return [f"OUT {out} is a symbolic link (to {os.readlink(out)}); give a real directory"]
    problems = [p.replace("output_dir", "OUT") for p in output_dir_problems(out)]
    if out.is_dir():
        links = sorted(p.name for p in out.iterdir() if p.is_symlink())
        if links:
            problems.append(f"OUT {out} holds symbolic link(s) {', '.join(links[:5])}: export would write through "
                            "them; remove them or give an empty directory")
        hard = sorted(p.name for p in out.iterdir() if not p.is_symlink() and p.is_file() and not single_file(p))
        if hard:
            problems.append(f"OUT {out} holds file(s) {', '.join(hard[:5])} with another hard link: export would "
                            "write through them into the other name too; remove them or give an empty directory")
    resolved = out.expanduser().resolve()
    for given in inputs:
        src = given.expanduser().resolve()
        if resolved == src or src in resolved.parents or resolved in src.parents:
            problems.append(f"OUT {out} is, is inside or contains the input {given}; export would overwrite what it "
                            "reads: give another directory")
    return problems


def export(head_dir: Path, to: str, out: Path, *, target_dir: Path | None = None,
           verifier_name: str | None = None) -> str:
    inputs = [Path(head_dir)] + ([Path(target_dir)] if target_dir is not None else [])
    if problems := out_problems(Path(out), inputs):
        raise UnusableInput("; ".join(problems))
    if target_dir is not None:
        read_json_config(target_dir, "--target")  # a bounded regular file, its counts in range, before any work
    head = read_head(head_dir)
    writer = partial(to_speculators, verifier_name=verifier_name) if to == "speculators" else WRITERS[to]
    with tempfile.TemporaryDirectory(prefix="doctor-export-") as tmp:
        if head.layout == "speculators":  # every writer reads the flat layout
            head = read_head(import_speculators(head.dir, Path(tmp) / "flat"))
            head.layout = "speculators"
        notes = writer(head, out, target_dir)
    return "\n".join([f"{out}: {head_dir} written for {to}"] + [f"  {n}" for n in notes])
