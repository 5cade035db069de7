"""The generic target (engines/generic.py): transformers' own model class as the reference engine's target, for
families without a native forward (MoE: Qwen3-MoE, gpt-oss). Greedy decoding, target-only and with EAGLE-3 chains,
static and dynamic trees and batches, gives exactly transformers' greedy `generate` in float32; a head that accepts
part of each tree makes the cache roll-back (compaction to the accepted path) happen. Sliding windows shorter than
the sequences are refused with the reason."""

from __future__ import annotations

import json
from typing import Any
from pathlib import Path

import pytest
import torch

from engines.cache import KVCache
from engines.checkpoint import load_eagle3
from engines.drafting import drafting_for
from core.families import GenericTargetError, check_generic
from engines.generic import load_generic
from engines.parallel import TPGroup
from engines.session import generate
from engines.runtime import Runtime, load_tokenizer
from core.trees import DraftTree, DynamicTree
from core.types import GenerationRequest, SamplingParams
from testkit.tiny_families import (GENERIC_FAMILIES, RECURRENT_FAMILIES, hf_model, make_family_target,
                                   make_mimic_eagle3_head)

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[5, 17, 33, 42, 9], [11, 12, 13, 14, 15, 16, 100, 7], [250, 3]]
NEW = 20
TREES = {
    "chain": DraftTree.from_choices([[0], [0, 0], [0, 0, 0]]),
    "static": DraftTree.from_choices([[0], [1], [0, 0], [0, 1], [1, 0], [0, 0, 0]]),
    "dynamic": DynamicTree(3, 4, 8),
}


@pytest.fixture(scope="module", params=["qwen3_moe", "gpt_oss", *GENERIC_FAMILIES])
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Path]:
    root = tmp_path_factory.mktemp(request.param)
    target = make_family_target(root / "target", request.param, block_scale=0.3)
    return request.param, target, make_mimic_eagle3_head(root / "head", target)


def _hf_greedy(target: Path) -> list[list[int]]:
    hf = hf_model(target)  # transformers' own class (Kimi-K2.5: the image-text-to-text wrapper)
    return [hf.generate(torch.tensor([p]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                        pad_token_id=0)[0, len(p):].tolist() for p in PROMPTS]


def test_generic_target_is_lossless(pair: tuple[str, Path, Path]) -> None:
    family, target, head_dir = pair
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    head = load_eagle3(head_dir, tgt, len(tgt.layers), dt, dev)
    tok = load_tokenizer(target)
    want = _hf_greedy(target)
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    plain = Runtime(tgt, None, None, tok, dev, dt, False, TPGroup(0, 1))
    assert [r.output_ids for r in generate(plain, reqs, speculative=False, on_tokens=None)] == want, family
    accepted = {}
    for name, tree in TREES.items():
        rt = Runtime(tgt, head, drafting_for(tree, dev), tok, dev, dt, False, TPGroup(0, 1))
        res = generate(rt, reqs, speculative=True, on_tokens=None)
        assert [r.output_ids for r in res] == want, (family, name)
        one = generate(rt, reqs[1:2], speculative=True, on_tokens=None)  # alone = in a batch
        assert one[0].output_ids == want[1], (family, name)
        accepted[name] = sum(r.stats.accepted_draft_tokens for r in res)
    # The head drafts the target's near-bigram: part of every kind of tree is accepted, so the cache is compacted
    # to accepted paths that are not the first branch.
    assert all(n > 0 for n in accepted.values()), accepted


def test_sliding_window_beyond_the_sequences_is_refused(tmp_path: Path) -> None:
    cfg = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 128}
    check_generic(cfg, tmp_path, max_seq_len=128)
    with pytest.raises(GenericTargetError, match=r"sliding_window=128 but sequences may reach 129 tokens.*"
                                                 r"Set engine.max_seq_len <= 128"):
        check_generic(cfg, tmp_path, max_seq_len=129)
    for c in ({"use_sliding_window": True, "sliding_window": 32}, {"sliding_window": 32}):
        with pytest.raises(GenericTargetError, match="sliding_window=32"):
            check_generic(c, tmp_path, max_seq_len=64)
    check_generic({"use_sliding_window": False, "sliding_window": 32}, tmp_path, max_seq_len=64)
    with pytest.raises(GenericTargetError, match=r"layer_types \['linear_attention'\]"):
        check_generic({"layer_types": ["linear_attention", "full_attention"]}, tmp_path, max_seq_len=64)
    (tmp_path / "config.json").write_text(json.dumps({"sliding_window": 16, "architectures": ["MistralForCausalLM"]}))
    with pytest.raises(GenericTargetError):
        load_generic(tmp_path, torch.float32, torch.device("cpu"), max_seq_len=64)


def test_a_moe_target_builds_and_runs_through_the_generic_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """builders/build.py with a Qwen3-MoE target on the reference backend: the checkpoint names the HF directory
    (no converted weights), the engine loads transformers' model from it, EAGLE-3 decoding equals HF greedy; tp=2 and
    a sliding window shorter than engine.max_seq_len are refused before anything is written."""
    import yaml

    from builders import build
    from engines.api import ReferenceEngine

    target = make_family_target(tmp_path / "target", "qwen3_moe", block_scale=0.3)
    head = make_mimic_eagle3_head(tmp_path / "head", target)

    def cfg(name: str, **engine: object) -> Path:
        data = {"name": name, "trtllm_version": "1.4", "output_dir": str(tmp_path / name),
                "target": {"model": str(target), "dtype": "float32"}, "draft": {"type": "eagle3", "model": str(head)},
                "tree": {"dynamic": {"top_k": 2, "depth": 3, "total_draft_tokens": 6}},
                "engine": {"backend": "reference", "device": "cpu", "max_batch_size": 3, "max_input_len": 32,
                           "max_seq_len": 64, **engine}}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data))
        return tmp_path / f"{name}.yaml"

    assert build.main([str(cfg("ok")), "--only", "checkpoint", "--only", "engine"]) == 0
    ckpt = json.loads((tmp_path / "ok" / "checkpoint" / "config.json").read_text())
    assert ckpt["architecture"] == "Qwen3MoeForCausalLM" and ckpt["generic_target"] == str(target.resolve())
    assert not list((tmp_path / "ok" / "checkpoint").glob("rank*.safetensors"))
    engine = ReferenceEngine.from_build(tmp_path / "ok", device="cpu")
    res = engine.generate([GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS])
    assert [r.output_ids for r in res] == _hf_greedy(target)
    assert sum(r.stats.accepted_draft_tokens for r in res) > 0
    capsys.readouterr()
    over = tmp_path / "tp2.yaml"
    over.write_text(cfg("tp2").read_text() + "parallel: {tp: 2}\n")
    assert build.main([str(over), "--only", "checkpoint"]) == 2
    assert "generic path (transformers' own model class), which has no tensor parallelism" in capsys.readouterr().err
    oss = make_family_target(tmp_path / "oss", "gpt_oss", sliding_window=48)
    data = yaml.safe_load(cfg("oss").read_text())
    data["target"]["model"] = str(oss)
    data["draft"]["model"] = str(make_mimic_eagle3_head(tmp_path / "oss-head", oss))
    (tmp_path / "oss.yaml").write_text(yaml.safe_dump(data))
    assert build.main([str(tmp_path / "oss.yaml"), "--only", "checkpoint"]) == 2
    assert "sliding_window=48 but sequences may reach 64 tokens" in capsys.readouterr().err
    assert not (tmp_path / "oss").exists() or not (tmp_path / "oss" / "checkpoint").exists()


@pytest.mark.parametrize("family", RECURRENT_FAMILIES)
def test_recurrent_target_keeps_only_the_accepted_state(family: str, tmp_path: Path) -> None:
    """Qwen3-Next / Qwen3.5 (gated delta-net layers + attention): with chain drafts of every length, alone and in a
    batch, greedy decoding equals transformers' greedy `generate`, while most drafts are rejected, so each step's
    recurrent state must be the one after the accepted path (engines/recurrent.py); trees with branches are
    refused."""
    target = make_family_target(tmp_path / "target", family, block_scale=0.3, layers=4)
    head_dir = make_mimic_eagle3_head(tmp_path / "head", target)
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    assert tgt.recurrent is not None
    head = load_eagle3(head_dir, tgt, len(tgt.layers), dt, dev)
    tok = load_tokenizer(target)
    want = _hf_greedy(target)
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    plain = Runtime(tgt, None, None, tok, dev, dt, False, TPGroup(0, 1))
    assert [r.output_ids for r in generate(plain, reqs, speculative=False, on_tokens=None)] == want
    for depth in (1, 2, 4):
        chain = DraftTree.from_choices([[0] * i for i in range(1, depth + 1)])
        rt = Runtime(tgt, head, drafting_for(chain, dev), tok, dev, dt, False, TPGroup(0, 1))
        res = generate(rt, reqs, speculative=True, on_tokens=None)
        assert [r.output_ids for r in res] == want, (family, depth)
        assert generate(rt, reqs[1:2], speculative=True, on_tokens=None)[0].output_ids == want[1]
        accepted, drafted = (sum(r.stats.accepted_draft_tokens for r in res), sum(r.stats.draft_tokens for r in res))
        assert 0 < accepted < drafted, (depth, accepted, drafted)
    for name in ("static", "dynamic"):
        with pytest.raises(ValueError, match=f"verifies only chain drafts for it.*not {name} trees with branches"):
            Runtime(tgt, head, drafting_for(TREES[name], dev), tok, dev, dt, False, TPGroup(0, 1))


def _variant(target: Path, out: Path, config: dict[str, Any]) -> Path:
    """A copy of `target` with another config.json (the same weights)."""
    out.mkdir()
    for f in target.iterdir():
        (out / f.name).write_bytes(f.read_bytes())
    (out / "config.json").write_text(json.dumps(config))
    return out


def _trees_equal_hf(tgt: Any, head: Any, tok: Any, reqs: list[Any], want: list[list[int]],
                    alone: bool = False) -> None:
    """Chain, static and dynamic trees, batched (and `alone`: the second request by itself), give HF greedy's
    tokens with drafts accepted."""
    dev, dt = torch.device("cpu"), torch.float32
    for name, tree in TREES.items():
        rt = Runtime(tgt, head, drafting_for(tree, dev), tok, dev, dt, False, TPGroup(0, 1))
        res = generate(rt, reqs, speculative=True, on_tokens=None)
        assert [r.output_ids for r in res] == want, name
        if alone:
            assert generate(rt, reqs[1:2], speculative=True, on_tokens=None)[0].output_ids == want[1], name
        assert sum(r.stats.accepted_draft_tokens for r in res) > 0, name


def test_llama4_temperature_by_tree_positions_and_chunks_refused(tmp_path: Path) -> None:
    """Llama 4 (interleaved MoE with a shared expert, RoPE layers with q/k norm and chunked attention, NoPE layers
    with attention temperature tuning; floor_scale 8 so the temperature changes within these sequences): with every
    block at full strength the temperature changes HF's tokens, and chain, static and dynamic trees still give HF
    greedy's, because the engine scales q by the tree's positions (transformers numbers a forward's tokens from the
    cache length). A chunk shorter than the sequences is refused, at load and per request, naming the key."""
    target = make_family_target(tmp_path / "target", "llama4")
    head_dir = make_mimic_eagle3_head(tmp_path / "head", target)
    want = _hf_greedy(target)
    cfg = json.loads((target / "config.json").read_text())
    flat = _variant(target, tmp_path / "no-temperature",
                    {**cfg, "text_config": {**cfg["text_config"], "attn_temperature_tuning": False}})
    assert _hf_greedy(flat) != want
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    assert tgt.temperature is not None and (tgt.window, tgt.window_key) == (128, "attention_chunk_size")
    tok = load_tokenizer(target)
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    _trees_equal_hf(tgt, load_eagle3(head_dir, tgt, len(tgt.layers), dt, dev), tok, reqs, want)

    cfg["text_config"]["attention_chunk_size"] = 16
    (flat / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(GenericTargetError, match=r"attention_chunk_size=16 but sequences may reach 64 tokens.*"
                                                 r"sees every earlier key \(not only the query's chunk\).*"
                                                 r"Set engine.max_seq_len <= 16"):
        load_generic(flat, dt, dev, max_seq_len=64)
    short = load_generic(flat, dt, dev)
    rt = Runtime(short, None, None, tok, dev, dt, False, TPGroup(0, 1), window=short.window,
                 window_key=short.window_key)
    with pytest.raises(ValueError, match=r"exceeds the target's attention_chunk_size=16"):
        generate(rt, reqs, speculative=False, on_tokens=None)


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_sparse_attention_indexer_selects_like_hf_in_trees(family: str, tmp_path: Path) -> None:
    """DeepSeek-V3.2 / GLM-5 (whose second layer reuses the first one's selection): the indexer keeps each query's
    top 4 keys, which changes HF's tokens against a dense selection; its keys live in the engine's cache slots and
    move with compaction, so chain, static and dynamic trees, batched and alone, give HF greedy's tokens."""
    target = make_family_target(tmp_path / "target", family)
    head_dir = make_mimic_eagle3_head(tmp_path / "head", target)
    want = _hf_greedy(target)
    cfg = json.loads((target / "config.json").read_text())
    dense = _variant(target, tmp_path / "dense", {**cfg, "index_topk": 2048})
    assert cfg["index_topk"] == 4 and _hf_greedy(dense) != want
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    assert tgt.indexer_at == cfg["qk_rope_head_dim"]
    tok = load_tokenizer(target)
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    _trees_equal_hf(tgt, load_eagle3(head_dir, tgt, len(tgt.layers), dt, dev), tok, reqs, want, alone=True)


def test_kimi_k25_embeds_media_placeholder_ids_as_tensorrt_llm_does(tmp_path: Path) -> None:
    """Kimi-K2.5's text model runs on the request's ids as given, as TensorRT-LLM's wrapper does for a request with no
    image (fuse_input_embeds returns the ids unchanged); transformers' own generate maps image_token_id /
    video_token_id to id 0 first. With a placeholder id inside the tiny vocabulary, the engine equals greedy decoding
    of the text model on the ids as given, and not HF's generate."""
    target = make_family_target(tmp_path / "target", "kimi_k25")
    cfg = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**cfg, "image_token_id": 7, "video_token_id": 8}))
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    prompt = [5, 7, 17, 9, 7]
    rt = Runtime(tgt, None, None, load_tokenizer(target), dev, dt, False, TPGroup(0, 1))
    [res] = generate(rt, [GenerationRequest(prompt, NEW, SamplingParams(), [])], speculative=False, on_tokens=None)
    hf = hf_model(target)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(NEW):
            hidden = hf.model.language_model(input_ids=torch.tensor([ids])).last_hidden_state
            ids.append(int(hf.lm_head(hidden)[0, -1].argmax()))
    assert res.output_ids == ids[len(prompt):]
    zeroed = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, eos_token_id=None,
                         pad_token_id=0)[0, len(prompt):].tolist()
    assert zeroed[0] != res.output_ids[0]


def test_deepseek_v4_compressed_state_keeps_only_the_accepted_tokens(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSeek-V4 (hyper-connection streams, a sliding-only, a CSA (every 4 tokens, 3-key indexer) and an HCA
    (every 8) layer): with chain drafts of every length, alone and in a batch, greedy decoding equals transformers'
    greedy `generate` while most drafts are rejected. The compressors pool a verification's draft tokens, so without
    the roll-back (engines/compressed.py `accept`) the tokens differ; trees with branches and windows shorter than
    the sequences are refused."""
    from engines import compressed

    target = make_family_target(tmp_path / "target", "deepseek_v4", block_scale=0.3)
    head_dir = make_mimic_eagle3_head(tmp_path / "head", target)
    dev, dt = torch.device("cpu"), torch.float32
    tgt = load_generic(target, dt, dev, max_seq_len=64)
    assert tgt.compressed is not None and tgt.recurrent is None and tgt.window == 128
    head = load_eagle3(head_dir, tgt, len(tgt.layers), dt, dev)
    tok = load_tokenizer(target)
    want = _hf_greedy(target)
    reqs = [GenerationRequest(p, NEW, SamplingParams(), []) for p in PROMPTS]
    plain = Runtime(tgt, None, None, tok, dev, dt, False, TPGroup(0, 1))
    assert [r.output_ids for r in generate(plain, reqs, speculative=False, on_tokens=None)] == want
    chains = {depth: DraftTree.from_choices([[0] * i for i in range(1, depth + 1)]) for depth in (1, 2, 4)}
    for depth, chain in chains.items():
        rt = Runtime(tgt, head, drafting_for(chain, dev), tok, dev, dt, False, TPGroup(0, 1))
        res = generate(rt, reqs, speculative=True, on_tokens=None)
        assert [r.output_ids for r in res] == want, depth
        assert generate(rt, reqs[1:2], speculative=True, on_tokens=None)[0].output_ids == want[1]
        accepted, drafted = (sum(r.stats.accepted_draft_tokens for r in res), sum(r.stats.draft_tokens for r in res))
        assert 0 < accepted < drafted, (depth, accepted, drafted)
    for name in ("static", "dynamic"):
        with pytest.raises(ValueError, match=f"compressed attention.*verifies only chain drafts for it.*not {name} "
                                             "trees with branches"):
            Runtime(tgt, head, drafting_for(TREES[name], dev), tok, dev, dt, False, TPGroup(0, 1))
    # EAGLE-3 features: the engine and the trainer read the same tensors (the embeddings, then layer j - 1's MoE
    # output, hidden_size wide, as TensorRT-LLM captures them), not the hc_mult residual streams
    from engines.cache import Rows
    from training.features import FeatureSpec, forward_features

    ids = torch.tensor([PROMPTS[1]])
    n = ids.shape[1]
    kv = KVCache.allocate(len(tgt.layers), 1, 64, tgt.kv_heads, tgt.head_dim, dt, dev)
    step = Rows.of([0], [0], dev).step(torch.arange(n)[None], torch.ones(n, n, dtype=torch.bool).tril()[None])
    hidden, feats = tgt.forward(ids, step, kv, (0, 1, 3))
    hf = forward_features(tgt.model, ids, torch.ones_like(ids), FeatureSpec((0, 1, 3), dt))
    assert [f.shape[-1] for f in feats] == [64] * 3 and torch.allclose(hidden, hf["hidden"], atol=1e-5)
    assert torch.allclose(torch.cat(feats, -1), hf["aux"], atol=1e-5)
    monkeypatch.setattr(compressed.CompressedStore, "accept", lambda self, rows, lengths: self.pending.clear())
    rt = Runtime(tgt, head, drafting_for(chains[2], dev), tok, dev, dt, False, TPGroup(0, 1))
    assert [r.output_ids for r in generate(rt, reqs, speculative=True, on_tokens=None)] != want
    cfg = json.loads((target / "config.json").read_text())
    with pytest.raises(GenericTargetError, match=r"sliding_window=16 but sequences may reach 64 tokens"):
        check_generic({**cfg, "sliding_window": 16}, tmp_path, max_seq_len=64)
    with pytest.raises(GenericTargetError, match=r"has_engram true.*Engram n-gram embeddings.*engine.backend pytorch"):
        check_generic({**cfg, "has_engram": True}, tmp_path, max_seq_len=64)
