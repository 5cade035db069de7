"""Tiny heads for the doctor's tests: a copy-and-break helper, and an EAGLE-3 pair whose head really accepts.

`make_mimic3(out)`: a 4-layer target whose next token is a fixed permutation pi of the current one (its layers
write only into the upper half of the hidden state, which the lm_head never reads), and an EAGLE-3 head that
predicts the token after next, pi(pi(x_t)), from the captured layer-0 input (the embedding of x_t). Its fc passes
slot 0 (captured id 0) through; its lm_head rows also carry large weights on the upper half, so capturing any
later layer (whose input holds the layers' writes) drowns the right logit: moving the captured layers breaks it.
Its draft vocabulary is the permutation's support S (sorted ids, the usual d2t), so d2t remaps break it too.
With `template_blind` the head only drafts right on text that follows raw prompts (a head trained without the chat
template).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from testkit import tiny_models as tm

LOW = tm.HIDDEN // 2  # dims 0..LOW-1 carry tokens; LOW.. carry what the target's layers write


def copy_head(src: Path, dst: Path, *, cfg: dict | None = None, drop_cfg: tuple[str, ...] = (),
              tensors: dict[str, torch.Tensor] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A copy of head `src` with config keys set / dropped and tensors replaced / dropped."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, dst / f.name)
    c = json.loads((src / "config.json").read_text())
    c.update(cfg or {})
    for k in drop_cfg:
        c.pop(k, None)
    (dst / "config.json").write_text(json.dumps(c, indent=2))
    t = load_file(str(src / "model.safetensors"))
    t.update(tensors or {})
    for k in drop:
        t.pop(k, None)
    save_file(t, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def _last_tokens(tok_dir: Path) -> tuple[int, list[int], int]:
    """(last token of every chat-templated doctor prompt, last tokens of the raw ones, eos id)."""
    from doctor.measure import PROMPTS
    from sources.data import chat_ids
    from engines.runtime import load_tokenizer

    tok = load_tokenizer(tok_dir)
    [chat_last] = {chat_ids(tok, p)[-1] for p in PROMPTS}
    return chat_last, sorted({tok(p)["input_ids"][-1] for p in PROMPTS}), int(tok.eos_token_id)


def _cycles(g: torch.Generator, support: list[int], first: list[int], size_a: int) -> tuple[dict[int, int], set[int]]:
    """A permutation of `support` with two cycles; cycle A holds `first` (and size_a tokens in all)."""
    rest = [support[i] for i in torch.randperm(len(support), generator=g).tolist() if support[i] not in first]
    a, b = first + rest[: size_a - len(first)], rest[size_a - len(first):]
    pi = {x: a[(i + 1) % len(a)] for i, x in enumerate(a)} | {x: b[(i + 1) % len(b)] for i, x in enumerate(b)}
    return pi, set(a)


def make_mimic3(out: Path, *, seed: int = 7, draft_vocab: int = 200, template_blind: bool = False) -> tuple[Path, Path]:
    """`template_blind`: pi has two cycles, one holding the token that ends every chat-templated doctor prompt, the
    other the last tokens of the raw prompts, and the head drafts wrong on the first cycle only: it accepts
    nothing with the chat template and everything without it (a head trained on raw text)."""
    g = torch.Generator().manual_seed(seed)
    V, H = tm.VOCAB, tm.HIDDEN
    cfg = tm.llama_config(layers=4)
    target = out / "target"
    tm.make_tokenizer(target)
    emb = torch.zeros(V, H)
    emb[:, :LOW] = torch.randn(V, LOW, generator=g)
    blind: set[int] = set()
    if template_blind:
        chat_last, raw_last, eos = _last_tokens(target)
        must = [chat_last, *raw_last]
        others = [i for i in torch.randperm(V, generator=g).tolist() if i not in must and i != eos]
        support = torch.tensor(sorted(must + others[: draft_vocab - len(must)]))
        pi, blind = _cycles(g, support.tolist(), [chat_last], 20)
        assert not blind & set(raw_last)
    else:
        support = torch.sort(torch.randperm(V, generator=g)[:draft_vocab]).values
        perm = support[torch.randperm(draft_vocab, generator=g)]  # pi(support[i]) = perm[i]
        pi = {int(a): int(b) for a, b in zip(support, perm)}
    inv = {b: a for a, b in pi.items()}
    t = {"model.embed_tokens.weight": emb}
    for i in range(4):
        layer = tm._decoder_layer(g, f"model.layers.{i}", cfg, input_norm=True)
        for k in (f"model.layers.{i}.self_attn.o_proj.weight", f"model.layers.{i}.mlp.down_proj.weight"):
            layer[k][:LOW] = 0  # the layers never touch the token half
            layer[k] *= 20
        t.update(layer)
    t["model.norm.weight"] = torch.ones(H)
    lm = torch.randn(V, H, generator=g) * 0.05
    lm[:, LOW:] = 0
    for o, x in inv.items():
        lm[o] = emb[x]
    t["lm_head.weight"] = lm
    save_file(t, str(target / "model.safetensors"), metadata={"format": "pt"})
    (target / "config.json").write_text(json.dumps(cfg, indent=2))
    (target / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))

    hcfg = dict(cfg, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=draft_vocab,
                target_hidden_size=H, eagle_aux_hidden_state_layer_ids=[0, 1, 2])
    hd = tm._decoder_layer(g, "midlayer", hcfg, input_norm=True, qkv_in=2 * H)
    hd["midlayer.self_attn.o_proj.weight"].zero_()
    hd["midlayer.mlp.down_proj.weight"].zero_()
    hd["midlayer.hidden_norm.weight"] = torch.ones(H)
    hd["norm.weight"] = torch.ones(H)
    hd["fc.weight"] = torch.cat([torch.eye(H), torch.zeros(H, 2 * H)], 1)
    rows = torch.zeros(draft_vocab, H)
    for j, tid in enumerate(support.tolist()):
        rows[j, :LOW] = emb[inv[inv[tid]], :LOW]  # draft j = target tid: after x_t comes pi(pi(x_t)) = tid
        if tid in blind:  # predicts tid after a token that never precedes it
            rows[j, :LOW] = emb[inv[tid], :LOW]
    rows[:, LOW:] = torch.randn(draft_vocab, H - LOW, generator=g) * 0.5
    hd["lm_head.weight"] = rows
    hd["d2t"] = support - torch.arange(draft_vocab)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[support] = True
    hd["t2d"] = t2d
    head = out / "head3"
    head.mkdir(parents=True, exist_ok=True)
    save_file(hd, str(head / "model.safetensors"), metadata={"format": "pt"})
    (head / "config.json").write_text(json.dumps(hcfg, indent=2))
    return target, head
