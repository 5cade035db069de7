"""Native families beyond Llama in the reference engine (core/families.py): Qwen3 (per-head q/k RMSNorm, head_dim
independent of hidden_size / heads), Qwen2 / Qwen2.5 (q/k/v biases), Mistral (sliding window refused beyond it).
Tiny random targets written by transformers (testkit/tiny_families.py), converted by builders/convert, decoded by the
engine: greedy outputs equal transformers' greedy `generate` in float32 — target-only, chain, static and dynamic
trees, a batch and alone, with and without the AVX2 kernel, tp=2 — with an EAGLE-3 head that accepts part of each
tree. Variants cover GQA ratios, tied and untied embeddings, odd head_dim, rope_theta 1e6 and YaRN."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from builders.convert import convert_eagle3
from engines import skinny
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.parallel import spawn
from core.trees import DraftTree, DynamicTree
from testkit.tiny_families import YARN, make_family_target, make_mimic_eagle3_head

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 17, 33, 42, 9], [11, 12, 13, 14, 15, 16, 100, 7], [250, 3]]
NEW = 20
TREES = {
    "chain": [[0], [0, 0], [0, 0, 0]],
    "static": [[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]],
    "dynamic": (3, 4, 8),
}
VARIANTS = {  # name -> (family, options)
    "qwen3-oddhd-yarn": ("qwen3", {"head_dim": 24, "rope_scaling": YARN}),
    "qwen3-tied-gqa4": ("qwen3", {"tie": True, "kv_heads": 1}),
    "qwen2-tied-yarn": ("qwen2", {"tie": True, "rope_scaling": YARN}),
    "qwen2-mha": ("qwen2", {"kv_heads": 4}),
    "mistral-window": ("mistral", {"sliding_window": 64, "head_dim": 20}),
}


def _tree(name: str) -> DraftTree | DynamicTree:
    spec = TREES[name]
    return DynamicTree(*spec) if isinstance(spec, tuple) else DraftTree.from_choices(spec)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path, list[list[int]]]]:
    """variant -> (target, converted checkpoint, transformers' greedy outputs)."""
    from transformers import AutoModelForCausalLM

    out = {}
    for name, (family, opts) in VARIANTS.items():
        root = tmp_path_factory.mktemp(name)
        target = make_family_target(root / "target", family, block_scale=0.3, **opts)
        head = make_mimic_eagle3_head(root / "head", target)
        ckpt = root / "ckpt"
        convert_eagle3(target, head, ckpt, dtype="float32", tp=1, layers_to_capture=None)
        hf = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32)
        want = [hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                            pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]
        out[name] = (target, ckpt, want)
    return out


def _decode(ckpt: Path, tree: str | None) -> tuple[list[list[int]], int]:
    engine = ReferenceEngine.from_checkpoint(ckpt, tree=None if tree is None else _tree(tree), dtype="float32",
                                             device="cpu", eagle3_head_dir=ckpt / "eagle3")
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    res = engine.generate(reqs, speculative=tree is not None)
    alone = engine.generate(reqs[1:2], speculative=tree is not None)
    assert alone[0].output_ids == res[1].output_ids
    return [r.output_ids for r in res], sum(r.stats.accepted_draft_tokens for r in res)


CASES = [(v, True) for v in VARIANTS] + [(v, False) for v in ("qwen3-oddhd-yarn", "qwen2-tied-yarn")]


@pytest.mark.parametrize(("variant", "kernel"), CASES, ids=[f"{v}-{'kernel' if k else 'no-kernel'}" for v, k in CASES])
def test_native_family_is_lossless(variant: str, kernel: bool, built: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variant where the AVX2 kernel runs (bf16 panels / float32 multi-row products), and the two layouts of the
    family-specific products (q/k norm over odd head_dim, q/k/v biases) without it too."""
    if kernel and skinny.unavailable() is not None:
        pytest.skip(f"kernel unavailable: {skinny.unavailable()}")
    if not kernel:
        monkeypatch.setattr(skinny, "_load", lambda: (None, "switched off by the test"))
    _, ckpt, want = built[variant]
    assert _decode(ckpt, None)[0] == want
    for tree in TREES:
        got, accepted = _decode(ckpt, tree)
        assert got == want, (variant, tree)
        assert accepted > 0, (variant, tree, "the mimic head should get part of every tree accepted")


def _worker(rank: int, *, root: str) -> dict[str, list[list[int]]]:
    torch.set_num_threads(1)
    return {t: _decode(Path(root), t)[0] for t in (None, "static", "dynamic")}


def test_tp2_equals_hf(built: dict, tmp_path: Path) -> None:
    """Column/row splits of the q/k/v biases (Qwen2), replicated q/k norms (Qwen3), one KV head duplicated over two
    ranks (kv_heads=1 < tp)."""
    for variant in ("qwen3-tied-gqa4", "qwen2-tied-yarn"):
        target, _, want = built[variant]
        head = make_mimic_eagle3_head(tmp_path / f"{variant}-head", target)
        ckpt = tmp_path / f"{variant}-tp2"
        convert_eagle3(target, head, ckpt, dtype="float32", tp=2, layers_to_capture=None)
        ranks = spawn(functools.partial(_worker, root=str(ckpt)), world=2)
        assert ranks[0] == ranks[1]
        assert all(out == want for out in ranks[0].values()), variant


def test_mistral_refuses_sequences_beyond_its_window(built: dict) -> None:
    _, ckpt, _ = built["mistral-window"]
    engine = ReferenceEngine.from_checkpoint(ckpt, tree=None, dtype="float32", device="cpu")
    with pytest.raises(ValueError, match=r"a sequence of up to 65 tokens \(prompt \+ max_new_tokens\) exceeds the "
                                         r"target's sliding_window=64.*keep prompt \+ max_new_tokens <= 64"):
        engine.generate([GenerationRequest([5] * 60, 5, SamplingParams(), [])])
    assert len(engine.generate([GenerationRequest([5] * 60, 4, SamplingParams(), [])])[0].output_ids) == 4
