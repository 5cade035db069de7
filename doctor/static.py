"""Static checks: everything the doctor can tell from the files alone, all reported at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from builders.convert.eagle import check_head
from builders.convert.eagle3 import check_eagle3
from builders.convert.weights import WeightSource
from doctor.findings import Finding, UnusableInput
from doctor.head import Head
from doctor.loaders import (
    ENGINES,
    SOURCES,
    compatibility,
    safeailab_default_ids,
)
from core.files import parse_json
from core.hfconfig import LlamaSpec, ModelConfigError, aux_layer_ids, llama_spec

D2T_SOURCE = "SafeAILab/EAGLE@cb7e0841fe0c206c6ed74a197ad5e2a1f13f5a2b eagle/traineagle3/cnets.py scandata"


def _kind(message: str) -> str:
    low = message.lower()
    for key, check in (("d2t", "d2t"), ("t2d", "d2t"), ("captured layer", "captured_layers"), ("vocab", "vocab")):
        if key in low:
            return check
    return "shapes"


def shape_checks(head: Head, target: LlamaSpec, head_dir: Path) -> list[Finding]:
    """The converter's own preflight (builders/convert), as findings."""
    try:
        with WeightSource(head_dir) as src:
            if not head.kind.eagle3:
                msgs = check_head(llama_spec(head_dir, require_arch=False), target, src)
            else:
                ids = head.layer_ids or safeailab_default_ids(target.num_hidden_layers)
                msgs = check_eagle3(head_dir, target, ids, src)
    except ModelConfigError as e:
        msgs = [str(e)]
    return [Finding(_kind(m), "error", m, fix="use a head trained for this target (same tokenizer and sizes)")
            for m in msgs]


def d2t_checks(head: Head, target: LlamaSpec) -> list[Finding]:
    """Order and uniqueness of the draft -> target map (range and t2d agreement: shape_checks)."""
    if "d2t" not in head.shapes or head.shapes["d2t"] != (head.draft_vocab,):
        return []
    tgt = torch.arange(head.shapes["d2t"][0]) + head.tensor("d2t").to(torch.int64)
    out: list[Finding] = []
    dup = int(tgt.numel() - torch.unique(tgt).numel())
    if dup:
        out.append(Finding("d2t", "error", f"d2t maps {dup} draft ids onto target ids already taken: those drafts "
                           "can never be right", {"duplicates": dup}, "rebuild d2t from the training vocabulary"))
    falls = int((tgt[1:] <= tgt[:-1]).sum())
    if falls:
        out.append(Finding(
            "d2t", "warning",
            f"d2t is not ascending ({falls} of {tgt.numel() - 1} steps go down): exporters build it from the draft "
            f"vocabulary sorted by target id ({D2T_SOURCE}; SpecForge; this project's trainer), so this map was "
            "permuted after training",
            {"descending_steps": falls, "first_target_ids": tgt[:8].tolist()},
            "re-export the head's d2t from its training run; the measured experiment `d2t sorted` tests the sorted map",
        ))
    if tgt.min() >= 0 and tgt.max() < target.vocab_size:
        out.append(Finding("d2t", "info", f"{tgt.numel()} draft ids map into target ids {int(tgt.min())}.."
                           f"{int(tgt.max())}", {"draft_vocab": tgt.numel()}))
    return out


def layer_checks(head: Head, target: LlamaSpec) -> list[Finding]:
    if not head.kind.eagle3:
        return []
    L = target.num_hidden_layers
    ids = head.layer_ids
    default = safeailab_default_ids(L)
    if ids is None:
        return [Finding("captured_layers", "info", f"the head names no captured layers; its loaders assume the "
                        f"SafeAILab default {default} for this {L}-layer target", {"assumed": default})]
    ev: dict[str, Any] = {"layer_ids": ids, "target_layers": L, "safeailab_default": default}
    out: list[Finding] = []
    bad = [i for i in ids if not 0 <= i <= L]
    if bad:
        return [
            Finding(
                "captured_layers",
                "error",
                f"captured layer ids {bad} are outside 0..{L} (id j = input of "
                f"target layer j, {L} = the last layer's output)",
                ev,
                f"set eagle_aux_hidden_state_layer_ids to the layers the head was trained on (default {default})",
            )
        ]
    if sorted(set(ids)) != ids:
        out.append(Finding("captured_layers", "info", f"captured layer ids {ids} are not strictly ascending (trainers "
                           "usually capture in layer order; the measured run tells whether these are the trained ones)",
                           ev))
    if ids == [i - 1 for i in default]:
        out.append(Finding(
            "captured_layers", "warning",
            f"ids {ids} are TensorRT-LLM's output-indexed default (eagle3_layers_to_capture) written where an "
            f"input-indexed id is read (id j = input of layer j): the head gets the layers one below {default}",
            ev, f"set eagle_aux_hidden_state_layer_ids to {default}"))
    elif ids == default:
        out.append(Finding("captured_layers", "info", f"captured layers {ids}: the SafeAILab default, input-indexed "
                           f"(TensorRT-LLM eagle3_layers_to_capture = {[i - 1 for i in ids]})", ev))
    else:
        out.append(Finding("captured_layers", "info", f"captured layers {ids} (input-indexed; not the default "
                           f"{default}: only the measured run tells whether they are the ones trained on)", ev))
    return out


def rope_checks(head: Head, target: LlamaSpec) -> list[Finding]:
    try:
        spec = llama_spec(head.dir, require_arch=False) if head.layout != "speculators" else None
    except ModelConfigError as e:
        return [Finding("rope", "error", str(e))]
    theta = spec.rope_theta if spec is not None else head.rope_theta
    scaling = spec.rope_scaling if spec is not None else None
    ev = {"head_rope_theta": theta, "target_rope_theta": target.rope_theta,
          "head_rope_scaling": scaling, "target_rope_scaling": target.rope_scaling}
    out = []
    reads = ("the drafter's RoPE comes from the head's config in SafeAILab, vLLM, SGLang and TensorRT-LLM's EAGLE-3 "
             "loader" if head.kind.eagle3 else
             "TensorRT-LLM's EAGLE-1 checkpoint takes the target's (so does this project's converter); the EAGLE "
             "repository's cnets1.py takes the head's")
    if theta != target.rope_theta:
        out.append(Finding("rope", "warning", f"the head's RoPE base {theta:g} differs from the target's "
                           f"{target.rope_theta:g} ({reads})", ev,
                           f"set rope_theta={target.rope_theta:g} in the head's config.json if the head was trained "
                           "with the target's base (the measured rope experiment tells)"))
    if (scaling or None) != (target.rope_scaling or None) and head.kind.eagle3:
        out.append(Finding("rope", "warning", f"the head's RoPE scaling {scaling} differs from the target's "
                           f"{target.rope_scaling}", ev, "copy the target's rope_scaling into the head's config"))
    return out


def position_checks(head: Head, target: LlamaSpec, max_seq_len: int | None) -> list[Finding]:
    head_max = int(head.cfg.get("max_position_embeddings", 2048))
    limit = max_seq_len or target.max_position_embeddings
    ev = {"head_max_position_embeddings": head_max, "serving_max_seq_len": limit,
          "target_max_position_embeddings": target.max_position_embeddings}
    if head_max < limit:
        return [Finding("positions", "warning", f"the head's max_position_embeddings {head_max} is below the serving "
                        f"limit {limit}: drafts past it run outside what the head's RoPE tables (vLLM, SafeAILab) "
                        "cover", ev, f"set max_position_embeddings={limit} or serve with max_seq_len <= {head_max}")]
    return [Finding("positions", "info", f"max positions: head {head_max}, serving limit {limit}", ev)]


def _json_object(f: Path) -> dict[str, Any]:
    """A tokenizer file as a JSON object (exit 2 with the reason when it is not one)."""
    data = parse_json(f.read_bytes(), str(f))
    if not isinstance(data, dict):
        raise UnusableInput(f"{f}: the top level must be a JSON object")
    return data


def _tok_files(d: Path) -> dict[str, Any] | None:
    f = d / "tokenizer.json"
    if not f.is_file():
        return None
    data = _json_object(f)
    model = data.get("model") or {}
    cfg_path = d / "tokenizer_config.json"
    cfg = _json_object(cfg_path) if cfg_path.is_file() else {}
    specials = {k: cfg.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
    return {"vocab": model.get("vocab"), "merges": model.get("merges"),
            "added": sorted((t["id"], t["content"]) for t in data.get("added_tokens", [])), "specials": specials}


def chat_template_of(d: Path) -> str | None:
    cfg_path = d / "tokenizer_config.json"
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text()
    if cfg_path.is_file():
        t = _json_object(cfg_path).get("chat_template")
        return t if isinstance(t, str) else None
    return None


def tokenizer_checks(head: Head, target_dir: Path, target: LlamaSpec) -> list[Finding]:
    out: list[Finding] = []
    tgt = _tok_files(target_dir)
    if tgt is None:
        return [Finding("tokenizer", "error", f"{target_dir} has no tokenizer.json", fix="give the target's HF "
                        "directory with its tokenizer files")]
    mine = _tok_files(head.dir)
    if mine is None:
        out.append(Finding("tokenizer", "info", "the head ships no tokenizer; compared by vocabulary size and "
                           "special token ids only"))
    else:
        diff = [k for k in ("vocab", "merges", "added", "specials") if mine[k] != tgt[k]]
        if diff:
            out.append(
                Finding(
                    "tokenizer",
                    "error",
                    f"the head's tokenizer differs from the target's in {', '.join(diff)}:"
                    " the head was trained on other token ids",
                    {"differs_in": diff},
                    "use a head trained with this target's tokenizer",
                )
            )
        else:
            out.append(Finding("tokenizer", "info", "the head's tokenizer is the target's (vocabulary, merges, "
                               "special tokens)"))
    ids = {k: (head.cfg.get(k), target.raw.get(k)) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    differ = {k: v for k, v in ids.items() if v[0] is not None and v[1] is not None and v[0] != v[1]}
    if differ:
        out.append(Finding("tokenizer", "warning", f"special token ids differ between head and target config: "
                           f"{ {k: {'head': a, 'target': b} for k, (a, b) in differ.items()} }", {"ids": differ},
                           "the head's config comes from another model; check it was trained on this target"))
    template = chat_template_of(target_dir)
    if template is None:
        out.append(Finding("chat_template", "warning", "the target's tokenizer has no chat template: prompts are "
                           "sent raw, and a head trained on chat-formatted answers drafts worse",
                           fix="add the chat template the head was trained with (tokenizer_config.json chat_template)"))
    else:
        out.append(
            Finding("chat_template", "info", f"the target's tokenizer has a chat template ({len(template)} chars)")
        )
    return out


def embedding_checks(head: Head, target_dir: Path, target: LlamaSpec) -> list[Finding]:
    """A head narrower or wider than its target needs its own embedding; one that ships the target-sized embedding
    should ship the target's (EAGLE heads freeze it during training)."""
    hidden = int(head.cfg.get("hidden_size", target.hidden_size))
    if hidden != target.hidden_size and "embed_tokens.weight" not in head.shapes:
        return [Finding("embedding", "error", f"the head's hidden_size {hidden} differs from the target's "
                        f"{target.hidden_size}, so it cannot use the target's embedding, and it ships no "
                        "embed_tokens.weight: every loader either fails or embeds with random weights "
                        "(TensorRT-LLM builds its own Embedding when target_hidden_size != hidden_size)",
                        {"head_hidden_size": hidden, "target_hidden_size": target.hidden_size},
                        "ship the embedding the head was trained with (embed_tokens.weight)")]
    if head.shapes.get("embed_tokens.weight") != (target.vocab_size, target.hidden_size):
        return []
    with WeightSource(target_dir) as src:
        if "model.embed_tokens.weight" not in src:
            return []
        t = src.read("model.embed_tokens.weight").float()
    h = head.tensor("embed_tokens.weight").float()
    rel = float((h - t).norm() / t.norm().clamp_min(1e-12))
    ev = {"relative_difference": round(rel, 5)}
    if rel > 1e-2:  # fp16/bf16 copies differ by ~1e-3
        return [Finding("embedding", "warning", f"the head's embed_tokens.weight differs from the target's "
                        f"(relative difference {rel:.3f}): the head was trained against another checkpoint", ev,
                        "use the head trained for this target, or drop embed_tokens.weight to use the target's")]
    return [Finding("embedding", "info", "the head's embedding is the target's", ev)]


def loader_checks(head: Head, target: LlamaSpec, engine: str) -> tuple[list[Finding], dict[str, str]]:
    table = compatibility(head, target)
    out = [Finding(f"loader:{engine}", "info" if "not verified" in m else "error", m, {"engine": engine},
                   f"python -m doctor export --head {head.dir} --to "
                   f"{'eagle-repo' if engine == 'eagle-repo' else 'specforge' if engine == 'sglang' else 'trtllm'} OUT")
           for m in table[engine]]
    if head.kind.eagle3 and head.layer_ids is not None and engine in ENGINES[1:4]:
        out.append(Finding("loader:trtllm", "info", "TensorRT-LLM takes the captured layers from the LLM API "
                           f"option eagle3_layers_to_capture={[i - 1 for i in head.layer_ids]} (output-indexed), not "
                           f"from the head [{SOURCES['trtllm']}]"))
    return out, {e: ("loads as it is" if not p else "; ".join(p)) for e, p in table.items()}


def random_head_check(head: Head) -> list[Finding]:
    if (head.cfg.get("eagle_deploy") or {}).get("random_head"):
        return [Finding("head", "error", "the head is marked randomly initialized (eagle_deploy.random_head): it "
                        "accepts nothing", fix="train a head: python training/train_head.py CONFIG")]
    return []


def layer_shape_checks(head: Head) -> list[Finding]:
    """Every decoder-layer tensor against the shape the head's own config implies (a config copied from another
    model loads in some engines and computes garbage in others)."""
    try:
        spec = llama_spec(head.dir, require_arch=False)
    except ModelConfigError as e:
        return [Finding("shapes", "error", str(e))]
    h, i, q, kv = spec.hidden_size, spec.intermediate_size, spec.q_size, spec.kv_size
    if head.kind.eagle3:
        prefixes, qkv_in = [head.mid], 2 * h  # attention over concat[embedding, feature]
        extra = {
            f"{head.mid}.hidden_norm.weight": (h,),
            f"{head.mid}.input_layernorm.weight": (h,),
            "norm.weight": (h,),
            "lm_head.weight": (int(head.cfg.get("draft_vocab_size") or spec.vocab_size), h),
        }
    else:
        prefixes, qkv_in, extra = [f"layers.{j}" for j in range(spec.num_hidden_layers)], h, {}
    want: dict[str, tuple[int, ...]] = dict(extra)
    for p in prefixes:
        want.update({f"{p}.self_attn.q_proj.weight": (q, qkv_in), f"{p}.self_attn.k_proj.weight": (kv, qkv_in),
                     f"{p}.self_attn.v_proj.weight": (kv, qkv_in), f"{p}.self_attn.o_proj.weight": (h, q),
                     f"{p}.mlp.gate_proj.weight": (i, h), f"{p}.mlp.up_proj.weight": (i, h),
                     f"{p}.mlp.down_proj.weight": (h, i), f"{p}.post_attention_layernorm.weight": (h,)})
    out = []
    missing = [n for n in want if n not in head.shapes]
    if missing:
        out.append(Finding("shapes", "error", f"missing tensor(s) {', '.join(missing[:4])}", {"missing": missing},
                           "the head file is incomplete or from another architecture; re-export it"))
    wrong = {n: (head.shapes[n], s) for n, s in want.items() if n in head.shapes and head.shapes[n] != s}
    if wrong:
        detail = "; ".join(f"{n} {a} (config implies {b})" for n, (a, b) in list(wrong.items())[:4])
        out.append(Finding("shapes", "error", f"tensor shapes disagree with the head's config.json: {detail}",
                           {"shapes": {n: [list(a), list(b)] for n, (a, b) in wrong.items()}},
                           "the config.json belongs to another head; use the one saved with these weights"))
    return out


def bias_checks(head: Head) -> list[Finding]:
    """EAGLE-1/2: the converter's rule (builders/convert/eagle.py `head_bias`); EAGLE-3: a bias only TensorRT-LLM
    builds, and only when the config says so."""
    if not head.kind.eagle3:
        from builders.convert.eagle import head_bias

        try:
            with WeightSource(head.dir) as src:
                head_bias(head.dir, src)
        except ModelConfigError as e:
            return [Finding("bias", "error", str(e), fix="make config.json \"bias\" match the weights")]
        return []
    if "fc.bias" in head.shapes and head.cfg.get("bias") is not True:
        return [
            Finding(
                "bias",
                "warning",
                'the head has fc.bias but its config does not say "bias": true: SafeAILab, '
                "vLLM and TensorRT-LLM build the EAGLE-3 fc without a bias and drop or reject it",
                fix='set "bias": true (TensorRT-LLM, this engine) or retrain without the bias',
            )
        ]
    return []


def value_checks(head: Head) -> list[Finding]:
    """Non-finite weights, and index tensors of the wrong type."""
    out = []
    with WeightSource(head.dir) as src:
        bad = [
            n
            for n in src.tensors
            if src.info(n).dtype.is_floating_point and not bool(torch.isfinite(src.read(n)).all())
        ]
    if bad:
        out.append(Finding("values", "error", f"non-finite values (NaN/inf) in {', '.join(bad[:4])}", {"tensors": bad},
                           "the head diverged in training or was saved in a dtype too narrow for it; re-export it"))
    for name, kinds in (("d2t", (torch.int64, torch.int32)), ("t2d", (torch.bool, torch.uint8, torch.int64))):
        if name in head.dtypes and head.dtypes[name] not in kinds:
            out.append(Finding("d2t", "error", f"{name} has dtype {head.dtypes[name]}; loaders index with it "
                               f"({', '.join(str(k) for k in kinds)})", fix=f"save {name} as an integer tensor"))
    return out


def layer_id_agreement(head: Head) -> list[Finding]:
    try:
        aux_layer_ids(head.cfg, head.dir / "config.json")
    except ModelConfigError as e:
        return [Finding("captured_layers", "error", str(e), fix="keep one list of captured layer ids")]
    return []


def head_template_checks(head: Head, target_dir: Path) -> list[Finding]:
    """A head that ships its tokenizer tells which chat template it was trained with."""
    mine, theirs = chat_template_of(head.dir), chat_template_of(target_dir)
    if mine is not None and theirs is not None and mine != theirs:
        return [Finding("chat_template", "warning", "the head's tokenizer has another chat template than the "
                        "target's: it was trained on prompts formatted differently from the ones served",
                        {"head_chars": len(mine), "target_chars": len(theirs)},
                        "serve with the template the head was trained on, or retrain the head")]
    return []
