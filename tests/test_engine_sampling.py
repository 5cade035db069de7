"""Speculative SAMPLING preserves the target distribution (EAGLE's sibling-rejection scheme, docs in
engines/step.py; SafeAILab eagle/model/utils.py `evaluate_posterior`).

On a 6-token-vocabulary target with a head that drafts its likely tokens, we sample 3 tokens for thousands of seeds
with EAGLE and compare the joint distribution of (x1, x2, x3) — x2 and x3 come from one speculative step, so they
go through acceptance, sibling rejection and the residual draw — against the exact distribution computed from the
Hugging Face model's logits, with a chi-square goodness-of-fit test. A control shows the test has power: the same
samples are rejected against the target at another temperature.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, DynamicTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.step import target_probs

PROMPT = [1, 2, 3, 4]
N = 3000
K = 3


pytestmark = pytest.mark.usefixtures("one_thread")


def exact_joint(hf_dir: Path, sp: SamplingParams, vocab: int) -> dict[tuple[int, ...], float]:
    """P(x1..xK | prompt) from HF logits, with the same temperature / top-k / top-p transform."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    seqs = list(itertools.product(range(vocab), repeat=K))
    with torch.inference_mode():  # all continuations have the same length: one batched forward
        logits = model(torch.tensor([PROMPT + list(seq) for seq in seqs])).logits.double()
    out: dict[tuple[int, ...], float] = {}
    for n, seq in enumerate(seqs):
        p = 1.0
        for j, x in enumerate(seq):
            p *= float(target_probs(logits[n, len(PROMPT) - 1 + j], sp)[x])
        out[seq] = p
    return out


def chi_square_p(counts: dict[tuple[int, ...], int], probs: dict[tuple[int, ...], float], n: int) -> float:
    """Pearson chi-square p-value; cells with expected count < 5 are pooled into one."""
    stat, df, pool_obs, pool_exp = 0.0, -1, 0, 0.0
    for cell, p in probs.items():
        e, o = p * n, counts.get(cell, 0)
        if e < 5:
            pool_obs, pool_exp = pool_obs + o, pool_exp + e
            continue
        stat += (o - e) ** 2 / e
        df += 1
    if pool_exp > 0:
        stat += (pool_obs - pool_exp) ** 2 / pool_exp
        df += 1
    # Survival function of chi2(df): regularized upper incomplete gamma Q(df/2, stat/2).
    return float(
        torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64))
    )


@pytest.mark.parametrize(
    "tree, sp",
    [
        (DraftTree.from_choices(preset("topk-2-2")), SamplingParams(temperature=1.5)),
        (DynamicTree(2, 2, 4), SamplingParams(temperature=1.2, top_k=4, top_p=0.9)),
    ],
    ids=["topk-2-2-t1.5", "dynamic-t1.2-topk4-topp0.9"],
)
def test_speculative_sampling_matches_target_distribution(
    small_vocab_ckpt: Path, small_vocab_pair: tuple[Path, Path], tree: DraftTree | DynamicTree, sp: SamplingParams
) -> None:
    engine = ReferenceEngine.from_checkpoint(small_vocab_ckpt, tree=tree, dtype="float32", device="cpu")
    reqs = [
        GenerationRequest(PROMPT, K, SamplingParams(sp.temperature, sp.top_k, sp.top_p, seed=s), []) for s in range(N)
    ]
    results = engine.generate(reqs)
    agg = engine.aggregate(results)
    assert agg.accepted_draft_tokens > N // 4  # the test goes through acceptance, not just residual draws
    assert agg.target_forwards < N * (K - 1)  # and multi-token steps happen
    counts: dict[tuple[int, ...], int] = {}
    for r in results:
        counts[tuple(r.output_ids)] = counts.get(tuple(r.output_ids), 0) + 1
    assert sum(counts.values()) == N
    probs = exact_joint(small_vocab_pair[0], sp, vocab=6)
    assert abs(sum(probs.values()) - 1) < 1e-5  # float32 logits
    p_value = chi_square_p(counts, probs, N)
    assert p_value > 1e-3, f"speculative samples do not follow the target distribution (p={p_value:.2e})"
    # Power control: the same samples against a visibly different distribution must be rejected.
    other = exact_joint(small_vocab_pair[0], SamplingParams(sp.temperature * 1.6, sp.top_k, sp.top_p), vocab=6)
    assert chi_square_p(counts, other, N) < 1e-6


def test_target_probs_filters() -> None:
    logits = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0])
    p = target_probs(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(p, torch.tensor([0.7311, 0.2689, 0, 0, 0]), atol=1e-4)
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert p.tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]  # the top token alone holds >= 50%
    # softmax = [.563, .207, .126, .076, .028]: the mass before the 3rd token is .77 < .8, so it is kept.
    p = target_probs(logits, SamplingParams(temperature=1.0, top_p=0.8))
    assert (p > 0).tolist() == [True, True, True, False, False]
    assert abs(float(p.sum()) - 1) < 1e-6
