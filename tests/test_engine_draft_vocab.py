"""Reference engine, restricted draft vocabulary for EAGLE-1/2 heads (measure/draft_vocab.py, Eagle1Drafter.
restrict_vocab): the head proposes only tokens of the list, greedy outputs stay identical to target-only decoding,
and what it costs in tau is measured, not assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from core.trees import DraftTree, DynamicTree, preset
from engines import step
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from measure.draft_vocab import DraftVocabError, count_tokens, ranked, read_draft_vocab, write_draft_vocab

PROMPTS = [[5, 17, 33, 101, 7], [9, 8, 7], [6, 17, 33, 101, 7]]


pytestmark = pytest.mark.usefixtures("one_thread")


def reqs() -> list[GenerationRequest]:
    return [GenerationRequest(p, 40, SamplingParams(), []) for p in PROMPTS]


def test_ranking_counts_and_file_round_trip(tmp_path: Path, tiny_target: Path) -> None:
    counts = torch.tensor([5, 0, 9, 5, 1])
    assert ranked(counts, 3) == [2, 0, 3]  # most frequent first; equal counts: smaller id first
    with pytest.raises(DraftVocabError, match="size 6 must be in 1..5"):
        ranked(counts, 6)
    from engines.runtime import load_tokenizer

    tok = load_tokenizer(tiny_target)
    c = count_tokens(tok, ["hello world", "hello"], len(tok))
    hello = tok("hello", add_special_tokens=False)["input_ids"]
    assert int(c.sum()) == len(tok("hello world", add_special_tokens=False)["input_ids"]) + len(hello)
    assert all(int(c[i]) >= 2 for i in hello)

    f = tmp_path / "dv.json"
    write_draft_vocab(f, [2, 0, 3], counts, "test")
    doc = json.loads(f.read_text())
    assert doc["token_ids"] == [2, 0, 3] and doc["coverage"] == round(19 / 20, 6) and doc["counted_tokens"] == 20
    assert read_draft_vocab(f) == [2, 0, 3] and read_draft_vocab(f, 2) == [2, 0]
    with pytest.raises(DraftVocabError, match="holds 3 ids; a draft vocabulary of 4 needs 1..3"):
        read_draft_vocab(f, 4)
    (tmp_path / "bad.json").write_text('{"ids": [1]}')
    with pytest.raises(DraftVocabError, match="not a draft vocabulary file.*python -m measure.draft_vocab"):
        read_draft_vocab(tmp_path / "bad.json")


def _drafted_tokens(engine: ReferenceEngine, requests: list[GenerationRequest]) -> tuple[list, set[int]]:
    """Outputs, and every token the head proposed (the non-root nodes of every verified tree)."""
    seen: set[int] = set()
    verify = step.verify

    def recording(s, rows, tree):
        seen.update(tree.tokens[:, 1:].flatten().tolist())
        return verify(s, rows, tree)

    step.verify = recording
    try:
        return engine.generate(requests), seen
    finally:
        step.verify = verify


@pytest.mark.parametrize(
    "tree", [DraftTree.from_choices(preset("chain-3")), DraftTree.from_choices(preset("eagle-default")),
             DynamicTree(4, 4, 16)], ids=["chain-3", "eagle-25", "dynamic"],
)
def test_restricted_head_drafts_only_listed_tokens_and_outputs_stay_identical(mimic_ckpt: Path, tree) -> None:
    full = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    plain = [r.output_ids for r in full.generate(reqs(), speculative=False)]
    full_spec = full.generate(reqs())
    assert [r.output_ids for r in full_spec] == plain
    # The 160 ids the target's own outputs use most, then the rest by id: a frequency list as the CLI makes it.
    counts = torch.bincount(torch.tensor([t for o in plain for t in o]), minlength=320)
    ids = ranked(counts, 160)
    restricted = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu", draft_vocab=ids)
    out, drafted = _drafted_tokens(restricted, reqs())
    assert [r.output_ids for r in out] == plain
    assert drafted and drafted <= set(ids)
    tau_full, tau_restricted = full.aggregate(full_spec).tau, restricted.aggregate(out).tau
    assert tau_restricted > 1.2 and tau_full > 1.2  # the frequent tokens keep most of the acceptance


def test_a_list_without_the_target_tokens_accepts_nothing_and_changes_nothing(mimic_ckpt: Path) -> None:
    """The target decides: a head that can only propose tokens the target never picks gets tau exactly 1, and the
    output is still target-only decoding's."""
    tree = DraftTree.from_choices(preset("chain-3"))
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    plain = [r.output_ids for r in engine.generate(reqs(), speculative=False)]
    used = {t for o in plain for t in o}
    never = [i for i in range(320) if i not in used][:50]
    blind = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu", draft_vocab=never)
    out = blind.generate(reqs())
    assert [r.output_ids for r in out] == plain
    agg = blind.aggregate(out)
    assert agg.accepted_draft_tokens == 0 and agg.tau == 1.0 and agg.draft_tokens == 3 * agg.target_forwards


def test_bad_draft_vocabularies_are_refused(mimic_ckpt: Path, eagle3_ckpt: Path, target_ckpt: Path) -> None:
    tree = DraftTree.from_choices(preset("chain-2"))
    with pytest.raises(ValueError, match=r"distinct target token ids in 0..319 .*out of range: \[320\]"):
        ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu", draft_vocab=[1, 320])
    with pytest.raises(ValueError, match="1 repeated"):
        ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu", draft_vocab=[1, 1, 2])
    with pytest.raises(ValueError, match="an EAGLE-3 head drafts over its own vocabulary"):
        ReferenceEngine.from_checkpoint(eagle3_ckpt, tree=tree, dtype="float32", device="cpu",
                                        eagle3_head_dir=eagle3_ckpt / "eagle3", draft_vocab=[1, 2])
    with pytest.raises(ValueError, match="this engine has no head"):
        ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu", draft_vocab=[1, 2])
    with pytest.raises(ValueError, match="top 10 draft tokens per node but the draft vocabulary has 4"):
        ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset("trtllm-default")),
                                        dtype="float32", device="cpu", draft_vocab=[1, 2, 3, 4])


def test_with_tree_and_with_draft_vocab_share_the_weights(mimic_ckpt: Path) -> None:
    chain = DraftTree.from_choices(preset("chain-3"))
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=chain, dtype="float32", device="cpu")
    other = engine.with_tree(DraftTree.from_choices(preset("eagle-default")))
    assert other.tree == DraftTree.from_choices(preset("eagle-default")) and engine.tree == chain
    assert other._rt.target is engine._rt.target and other._rt.drafter is engine._rt.drafter
    ids = list(range(0, 320, 2))
    small = engine.with_draft_vocab(ids)
    d, d0 = small._rt.drafter, engine._rt.drafter
    assert d.layers is d0.layers and d.lm_head.vocab_size == 160 and d0.lm_head.vocab_size == 320
    loaded = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=chain, dtype="float32", device="cpu", draft_vocab=ids)
    assert [r.output_ids for r in small.generate(reqs())] == [r.output_ids for r in loaded.generate(reqs())]
    assert small.aggregate(small.generate(reqs())).tau == loaded.aggregate(loaded.generate(reqs())).tau
    with pytest.raises(ValueError, match="already restricted"):
        small.with_draft_vocab(ids)


def test_config_field_reaches_reference_json(tmp_path: Path) -> None:
    """draft.draft_vocab (EAGLE-1/2 on the reference backend): the file's ids are recorded in reference.json; the
    other combinations are config errors naming the fix; a relative path is relative to the config file."""
    import yaml

    from builders.config import ConfigError, load_config
    from builders.engine.reference import reference_spec

    write_draft_vocab(tmp_path / "dv.json", [7, 3, 5], torch.tensor([0, 0, 0, 2, 0, 3, 0, 4]), "test")
    base = {
        "name": "dv",
        "trtllm_version": "1.1",
        "output_dir": "out",
        "target": {"model": "/models/target", "dtype": "bfloat16"},
        "draft": {"type": "eagle", "model": "/models/head", "draft_vocab": "dv.json"},
        "tree": {"choices": "chain-3"},
        "engine": {"backend": "reference", "max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
    }
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(yaml.safe_dump(base))
    cfg = load_config(cfg_file)
    assert cfg.draft.draft_vocab == str(tmp_path / "dv.json")
    spec = reference_spec(cfg, random_head=False)
    assert spec.draft_vocab == [7, 3, 5] and spec.dtype == "bfloat16"
    with pytest.raises(ConfigError) as e:
        load_config(cfg_file, ["draft.type=eagle3", "engine.backend=pytorch"])
    text = str(e.value)
    assert "draft.draft_vocab is for draft.type=eagle; an EAGLE-3 head drafts over its own vocabulary" in text
    assert "draft.draft_vocab needs engine.backend reference (TensorRT-LLM's pytorch backend" in text
