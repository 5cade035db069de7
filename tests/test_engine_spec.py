"""Reference engine, speculative decoding: greedy EAGLE output == target-only greedy output, for every tree shape and
head kind; acceptance actually happens with a head that predicts the target; streaming, stops, stats.

Trees: chains, TensorRT-LLM's default 63-node tree, the EAGLE repository's 25-node tree, the EAGLE-2 dynamic tree
(core/trees.py presets, upstream tensorrt_llm/runtime/generation.py and SafeAILab eagle/model/choices.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, DynamicTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.step import draw, target_probs

PROMPTS = [[5, 17, 33, 101, 7], [9, 8, 7], [100, 200, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
NEW = [30, 17, 24]  # different lengths: sequences finish at different steps


pytestmark = pytest.mark.usefixtures("one_thread")


def static(name: str) -> DraftTree:
    return DraftTree.from_choices(preset(name))


def requests(stop: list[int] | None = None) -> list[GenerationRequest]:
    return [GenerationRequest(p, n, SamplingParams(), stop or []) for p, n in zip(PROMPTS, NEW)]


def assert_lossless(engine: ReferenceEngine, reqs: list[GenerationRequest]) -> list:
    plain = engine.generate(reqs, speculative=False)
    spec = engine.generate(reqs)
    for p, s in zip(plain, spec):
        assert s.output_ids == p.output_ids
        assert s.finish_reason == p.finish_reason
        assert s.stats.generated_tokens == len(s.output_ids)
        # tau counts the tokens produced after the prefill: 1 + accepted per forward (the last step's bonus token
        # may be cut by max_new_tokens / a stop, hence the +1 slack).
        gained = s.stats.accepted_draft_tokens + s.stats.target_forwards
        assert len(s.output_ids) - 1 <= gained <= len(s.output_ids)
        assert sum(s.stats.acceptance_by_depth) == s.stats.accepted_draft_tokens
        depth = engine.tree.depth
        assert len(s.stats.acceptance_by_depth) == depth
        # Reaching depth d requires reaching every shallower depth first.
        assert all(a >= b for a, b in zip(s.stats.acceptance_by_depth, s.stats.acceptance_by_depth[1:]))
    return spec


@pytest.mark.parametrize(
    "tree",
    [static("chain-1"), static("chain-4"), static("trtllm-default"), static("eagle-default"), DynamicTree(4, 4, 20)],
    ids=["chain-1", "chain-4", "trtllm-63", "eagle-25", "dynamic-k4-d4-n20"],
)
def test_greedy_lossless_random_head(eagle_ckpt: Path, tree: DraftTree | DynamicTree) -> None:
    engine = ReferenceEngine.from_checkpoint(eagle_ckpt, tree=tree, dtype="float32", device="cpu")
    spec = assert_lossless(engine, requests())
    size = tree.size
    assert spec[0].stats.draft_tokens == size * spec[0].stats.target_forwards


def test_greedy_lossless_head_without_fc_bias(eagle_ckpt_nobias: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(
        eagle_ckpt_nobias, tree=static("eagle-default"), dtype="float32", device="cpu"
    )
    assert_lossless(engine, requests())


@pytest.mark.parametrize("tree", [static("eagle-default"), DynamicTree(3, 5, 16)], ids=["eagle-25", "dynamic"])
def test_greedy_lossless_eagle3(eagle3_ckpt: Path, tree: DraftTree | DynamicTree) -> None:
    engine = ReferenceEngine.from_checkpoint(
        eagle3_ckpt, tree=tree, dtype="float32", device="cpu", eagle3_head_dir=eagle3_ckpt / "eagle3"
    )
    d = engine._rt.drafter
    assert d is not None and d.d2t is not None and d.lm_head.weight.shape[0] == 96  # reduced draft vocabulary
    assert_lossless(engine, requests())


@pytest.mark.parametrize(
    "tree", [static("chain-3"), static("trtllm-default"), static("eagle-default"), DynamicTree(4, 5, 24)],
    ids=["chain-3", "trtllm-63", "eagle-25", "dynamic"],
)
def test_head_that_predicts_the_target_accepts(mimic_ckpt: Path, tree: DraftTree | DynamicTree) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 40, SamplingParams(), []) for i in range(3)]
    spec = assert_lossless(engine, reqs)
    agg = engine.aggregate(spec)
    assert agg.tau > 1.25  # a random head gives ~1.0
    assert agg.acceptance_by_depth[1] > 0  # multi-token paths were accepted, not only depth 1
    assert agg.target_forwards < 3 * 39  # fewer forwards than target-only decoding


def test_verification_computes_target_logits_only_along_the_walked_path(mimic_ckpt: Path) -> None:
    """engines/step.py `walk`: the 49k-wide lm_head runs on the accepted path + the node where the walk stops
    (accepted + 1 rows per sequence and forward), never on the rest of the tree; batches share one call per level."""
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("trtllm-default"), dtype="float32", device="cpu")
    target = engine._rt.target
    head = target.lm_head  # the EAGLE-1 drafter shares this LMHead; only the target's calls are counted
    calls: list[int] = []

    def counting(h: torch.Tensor) -> torch.Tensor:
        calls.append(h.shape[0])
        return head(h)

    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 40, SamplingParams(), []) for i in range(3)]
    target.lm_head = counting
    try:
        spec = engine.generate(reqs)
    finally:
        target.lm_head = head
    agg = engine.aggregate(spec)
    prefill_rows = len(reqs)  # one prefill call (same prompt length): the last position of each prompt
    assert sum(calls) == prefill_rows + agg.target_forwards + agg.accepted_draft_tokens
    assert agg.accepted_draft_tokens > 0 and max(calls) <= len(reqs)  # never a row per tree node (63 of them)
    assert spec == engine.generate(reqs)  # same outputs without the counting wrapper


def test_streaming_callback_receives_exactly_the_output(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("eagle-default"), dtype="float32", device="cpu")
    got: dict[int, list[list[int]]] = {0: [], 1: []}

    def on_tokens(i: int, toks: list[int]) -> bool:
        got[i].append(toks)
        return True

    reqs = [
        GenerationRequest([5, 17, 33], 30, SamplingParams(), []),
        GenerationRequest([6, 17, 33], 20, SamplingParams(), []),
    ]
    res = engine.generate(reqs, on_tokens=on_tokens)
    for i, r in enumerate(res):
        assert [t for chunk in got[i] for t in chunk] == r.output_ids
        assert any(len(chunk) > 1 for chunk in got[i])  # several tokens accepted in one step arrive together


@pytest.mark.parametrize(
    "tree", [None, static("chain-3"), static("eagle-default"), DynamicTree(3, 3, 8)],
    ids=["target-only", "chain-3", "eagle-25", "dynamic"],
)
def test_a_batch_step_is_one_target_forward(
    mimic_ckpt: Path, tree: DraftTree | DynamicTree | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch decodes together: each prefill group (one per prompt length) and each decoding step of the whole
    batch is ONE target forward. A step that raises is re-run one sequence at a time (engines/session.py
    `_isolated`), which gives the same tokens, so a bug only the batched path has shows in the forward count, not in
    the output: target-only and speculative steps, greedy and sampled requests, prompts of two lengths."""
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree or static("chain-3"), dtype="float32", device="cpu")
    reqs = [
        GenerationRequest([5, 17, 33, 101, 7], 14, SamplingParams(), []),
        GenerationRequest([9, 8, 7], 9, SamplingParams(temperature=0.8, seed=3), []),
        GenerationRequest([6, 17, 33, 101, 7], 11, SamplingParams(), []),
    ]
    spec = tree is not None
    expected = engine.generate(reqs, speculative=spec)
    target = engine._rt.target
    forward = target.forward
    calls: list[int] = []

    def counting(tokens: torch.Tensor, *a: object, **k: object) -> object:
        calls.append(tokens.shape[0])  # sequences in this forward
        return forward(tokens, *a, **k)

    monkeypatch.setattr(target, "forward", counting)
    session = engine.session(capacity=3, max_len=64, speculative=spec)
    for r in reqs:
        session.add(r)
    per_step: list[list[int]] = []
    while not session.done:
        before = len(calls)
        session.step()
        per_step.append(calls[before:])
    assert sorted(per_step[0]) == [1, 2], "the prefill: one forward per prompt length, of all its prompts"
    assert all(len(f) == 1 for f in per_step[1:]), f"a decoding step ran more than one target forward: {per_step}"
    if not spec:  # one token per step: the batch shrinks as the sequences reach their lengths
        longest = max(len(r.output_ids) for r in expected)
        assert [f[0] for f in per_step[1:]] == [sum(len(r.output_ids) > n for r in expected) for n in range(1, longest)]
    results = [session.pop(i) for i in range(3)]
    assert [r.output_ids for r in results] == [r.output_ids for r in expected]
    assert [r.finish_reason for r in results] == ["length"] * 3


def test_target_only_sampling_draws_each_token_from_the_targets_law_with_the_request_seed(mimic_ckpt: Path) -> None:
    """Target-only decoding of sampled and greedy requests in one batch (the prefill's first token and every step
    after it): token t is one draw with the request's seeded generator from target_probs (temperature, top-k, top-p)
    of the target's logits after the tokens so far, or their argmax when greedy. The logits here come from one
    prefill forward of the whole sequence (measure/lossless.py `next_logits`, not the decode loop; the forward is
    checked against Hugging Face in tests/test_engine_model.py), the draw law in tests/test_sampling_units.py."""
    from measure.lossless import next_logits

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("chain-3"), dtype="float32", device="cpu")
    sps = [SamplingParams(temperature=0.9, seed=11), SamplingParams(),
           SamplingParams(temperature=1.3, top_k=20, top_p=0.9, seed=4)]
    reqs = [GenerationRequest(p, 10, sp, []) for p, sp in zip(PROMPTS, sps)]
    results = engine.generate(reqs, speculative=False)

    def continuation(req: GenerationRequest, sp: SamplingParams) -> list[int]:
        gen = torch.Generator().manual_seed(sp.seed or 0)
        seq = list(req.prompt_ids)
        for _ in range(req.max_new_tokens):
            logits = next_logits(engine, seq)
            seq.append(int(logits.argmax()) if sp.greedy else draw(target_probs(logits, sp), gen))
        return seq[len(req.prompt_ids) :]

    for req, res in zip(reqs, results):
        assert res.output_ids == continuation(req, req.sampling), f"{req.sampling}"
        if not req.sampling.greedy:  # the draws matter: the same prompt decoded greedily goes elsewhere
            assert res.output_ids != continuation(req, SamplingParams()), f"{req.sampling}"


def test_a_speculative_step_before_any_prefill_is_refused(mimic_ckpt: Path) -> None:
    """engines/step.py `draft`: the drafter has no state until a prefill has run; drafting before one says so."""
    from core.laps import NO_LAPS
    from engines import step
    from engines.cache import Rows

    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("chain-3"), dtype="float32", device="cpu")
    session = engine.session(capacity=1, max_len=16)
    assert session.draft is not None and session.draft.state is None
    with pytest.raises(RuntimeError) as e:
        step.draft(session.target, session.draft, Rows.of([0], [0], torch.device("cpu")), NO_LAPS)
    assert str(e.value) == "a speculative step before any prefill: the drafter has no state yet"


def test_cancel_from_callback_stops_only_that_sequence(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("chain-3"), dtype="float32", device="cpu")
    reqs = [
        GenerationRequest([5, 17, 33], 30, SamplingParams(), []),
        GenerationRequest([6, 17, 33], 30, SamplingParams(), []),
    ]
    full = engine.generate(reqs)
    res = engine.generate(reqs, on_tokens=lambda i, toks: i != 0)
    assert res[0].finish_reason == "cancelled"
    assert res[0].output_ids == full[0].output_ids[:1]  # cancelled right after the first streamed chunk (prefill)
    assert res[1].finish_reason == "length" and res[1].output_ids == full[1].output_ids


def test_eos_and_max_tokens_cut_inside_an_accepted_path(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("eagle-default"), dtype="float32", device="cpu")
    [full] = engine.generate([GenerationRequest([5, 17, 33], 40, SamplingParams(), [])], speculative=False)
    eos = full.output_ids[12]
    cut = full.output_ids.index(eos)
    for spec in (False, True):
        [r] = engine.generate([GenerationRequest([5, 17, 33], 40, SamplingParams(), [eos])], speculative=spec)
        assert r.finish_reason == "eos" and r.output_ids == full.output_ids[: cut + 1]
        [r] = engine.generate([GenerationRequest([5, 17, 33], 7, SamplingParams(), [])], speculative=spec)
        assert r.finish_reason == "length" and r.output_ids == full.output_ids[:7]


def test_stop_string(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=static("eagle-default"), dtype="float32", device="cpu")
    tok = engine.tokenizer
    [full] = engine.generate([GenerationRequest([5, 17, 33], 30, SamplingParams(), [])], speculative=False)
    # A stop string made of the decoded tokens 9..10: generation must end with token 10.
    stop = tok.decode(full.output_ids[9:11])
    assert stop and stop not in tok.decode(full.output_ids[:10])
    [r] = engine.generate([GenerationRequest([5, 17, 33], 30, SamplingParams(), [], [stop])])
    assert r.finish_reason == "stop"
    assert r.output_ids == full.output_ids[:11]


def test_sampling_is_reproducible_with_a_seed(mimic_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DynamicTree(3, 3, 8), dtype="float32", device="cpu")
    sp = SamplingParams(temperature=0.9, top_k=50, top_p=0.95, seed=123)
    a = engine.generate([GenerationRequest([5, 17, 33], 25, sp, [])])
    b = engine.generate([GenerationRequest([5, 17, 33], 25, sp, [])])
    assert a[0].output_ids == b[0].output_ids and len(a[0].output_ids) == 25
    assert a[0].stats.accepted_draft_tokens > 0


def test_from_build_reads_reference_json(tmp_path: Path, eagle_ckpt: Path) -> None:
    import shutil

    from core.spec import ReferenceSpec, write_spec

    shutil.copytree(eagle_ckpt, tmp_path / "checkpoint")
    (tmp_path / "engine").mkdir()
    spec = ReferenceSpec(
        checkpoint_dir="checkpoint", tokenizer_dir="checkpoint/tokenizer", draft_type="eagle", eagle3_head_dir=None,
        random_head=True, tree_choices=static("chain-2").as_lists(), dynamic_tree=None, dtype="float32",
        device="cpu", tp=1, max_batch_size=2, max_input_len=32, max_seq_len=64,
    )
    write_spec(spec, tmp_path / "engine")
    engine = ReferenceEngine.from_build(tmp_path)
    assert engine.has_draft and engine.tree == static("chain-2") and engine.device == "cpu"
    [r] = engine.generate([GenerationRequest([5, 6, 7], 5, SamplingParams(), [])])
    assert len(r.output_ids) == 5
    with pytest.raises(ValueError, match="3 requests exceed the build's engine.max_batch_size=2"):
        engine.generate([GenerationRequest([5, 6, 7], 5, SamplingParams(), [])] * 3)
    with pytest.raises(ValueError, match="exceeds engine.max_seq_len=64; lower max_new_tokens"):
        engine.generate([GenerationRequest([5, 6, 7], 62, SamplingParams(), [])])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the engine runs on CPU otherwise)")
def test_cuda_greedy_equals_cpu(mimic_ckpt: Path) -> None:
    tree = static("eagle-default")
    cpu = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    gpu = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cuda")
    assert gpu.device == "cuda"
    reqs = requests()
    assert [r.output_ids for r in gpu.generate(reqs)] == [r.output_ids for r in cpu.generate(reqs)]
    sp = SamplingParams(temperature=0.8, seed=3)
    sampled = [GenerationRequest([5, 17, 33], 16, sp, [])]
    assert len(gpu.generate(sampled)[0].output_ids) == 16


def test_impossible_trees_are_rejected(eagle_ckpt: Path, small_vocab_ckpt: Path) -> None:
    with pytest.raises(ValueError, match="total_draft_tokens=30 exceeds the 20 candidates"):
        ReferenceEngine.from_checkpoint(eagle_ckpt, tree=DynamicTree(4, 2, 30), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="top 10 draft tokens per node but the draft vocabulary has 6"):
        ReferenceEngine.from_checkpoint(small_vocab_ckpt, tree=static("trtllm-default"), dtype="float32", device="cpu")
