"""The trainer's EAGLE heads (training/model.py, training/eagle3_model.py) and the reference engine's drafters
(engines/heads.py) are two definitions of one function, kept apart on purpose: the trainer's are torch modules that
train with autograd over whole teacher-forced sequences (and EAGLE-3's training-time-test unroll, whose attention
is no KV cache), the engine's run inference over a preallocated KV cache with a tree mask and fused, FP8 or
tensor-parallel linears that have no gradient. What ties them is the state dict (SafeAILab's keys) and this test: a
head the trainer builds, exported as the trainer exports it and loaded as the engine loads it, computes the same
hidden states (and, for EAGLE-3, the same logits and target ids) for the same inputs."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from engines.cache import KVCache, Rows, Step
from engines.checkpoint import Loader, Quant, Tensors, load_eagle1, load_eagle3, read_config, rank_file
from engines.parallel import TPGroup
from training.eagle3_model import eagle3_config_dict, eagle3_head_from_target, eagle3_state_dict
from training.model import head_config_dict, head_from_target, safeailab_state_dict

CPU = torch.device("cpu")
T = 7  # tokens of the one sequence both sides run


def _causal(kv_heads: int, head_dim: int, layers: int) -> tuple[Step, KVCache]:
    """One row, T new tokens after nothing, each seeing itself and the ones before: the trainer's causal pass."""
    step = Rows.of([0], [0], CPU).step(torch.arange(T)[None], torch.ones(T, T, dtype=torch.bool).tril()[None])
    return step, KVCache.allocate(layers, 1, T, kv_heads, head_dim, torch.float32, CPU)


def _target(tiny_target: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    return json.loads((tiny_target / "config.json").read_text()), load_file(str(tiny_target / "model.safetensors"))


def test_eagle1_head_trained_here_runs_the_same_in_the_engine(tiny_target: Path, tmp_path: Path) -> None:
    from builders.convert.eagle import convert_eagle

    cfg, w = _target(tiny_target)
    head = head_from_target(cfg, w["model.embed_tokens.weight"], seed=3, bias=True).eval()
    head_dir = tmp_path / "head"
    head_dir.mkdir()
    state = safeailab_state_dict(head, torch.float32)
    del state["embed_tokens.weight"]  # as the trainer exports it (export_embedding: false): the target's is used
    save_file(state, str(head_dir / "model.safetensors"))
    (head_dir / "config.json").write_text(json.dumps(head_config_dict(cfg, True)))
    ckpt = tmp_path / "ckpt"
    convert_eagle(tiny_target, head_dir, ckpt, dtype="float32", max_draft_len=4, num_eagle_layers=4,
                  max_non_leaves_per_layer=1)
    ld = Loader(Tensors(rank_file(ckpt, 0), CPU), torch.float32, Quant(False, False, ()))
    drafter = load_eagle1(ld, read_config(ckpt), ckpt / "config.json", TPGroup(0, 1), CPU)

    g = torch.Generator().manual_seed(0)
    feats = torch.randn(1, T, cfg["hidden_size"], generator=g)
    ids = torch.randint(0, cfg["vocab_size"], (1, T), generator=g)
    step, cache = _causal(drafter.kv_heads, drafter.head_dim, len(drafter.layers))
    with torch.no_grad():
        trained = head(feats, ids)
        served = drafter.forward(ids, drafter.features(feats, []), step, cache)
    torch.testing.assert_close(served, trained, rtol=1e-5, atol=1e-5)
    assert trained.abs().mean() > 0.1  # not two zeros agreeing


def test_eagle3_head_trained_here_runs_the_same_in_the_engine(tiny_target: Path, tmp_path: Path) -> None:
    cfg, w = _target(tiny_target)
    h, vocab = cfg["hidden_size"], cfg["vocab_size"]
    draft_ids = torch.arange(0, vocab, 3)  # a reduced draft vocabulary: d2t is not the identity
    head = eagle3_head_from_target(cfg, w["model.embed_tokens.weight"], w["lm_head.weight"], w["model.norm.weight"],
                                   draft_ids, n_aux=3, seed=4, lm_head_init="target").eval()
    head_dir = tmp_path / "head3"
    head_dir.mkdir()
    save_file(eagle3_state_dict(head, torch.float32, embedding=True), str(head_dir / "model.safetensors"))
    (head_dir / "config.json").write_text(json.dumps(eagle3_config_dict(cfg, len(draft_ids), [0, 1, 2])))
    target = SimpleNamespace(lm_head=SimpleNamespace(vocab_size=vocab), embed=w["model.embed_tokens.weight"])
    drafter = load_eagle3(head_dir, target, cfg["num_hidden_layers"], torch.float32, CPU)  # type: ignore[arg-type]

    g = torch.Generator().manual_seed(1)
    captured = [torch.randn(1, T, h, generator=g) for _ in range(3)]  # the target's layer inputs at 0, 1, 2
    ids = torch.randint(0, vocab, (1, T), generator=g)
    step, cache = _causal(drafter.kv_heads, drafter.head_dim, len(drafter.layers))
    with torch.no_grad():
        trained = head.step(head.fc(torch.cat(captured, dim=-1)), ids, 0, [], [])
        served = drafter.forward(ids, drafter.features(captured[-1], captured), step, cache)
        trained_logits, served_logits = head.logits(trained), drafter.logits(served)
    torch.testing.assert_close(served, trained, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(served_logits, trained_logits.float(), rtol=1e-5, atol=1e-5)
    drafts = served_logits.argmax(-1)
    assert torch.equal(drafter.to_target_ids(drafts), head.draft_to_target(drafts))
    assert not torch.equal(drafter.to_target_ids(drafts), drafts)  # the mapping was exercised
