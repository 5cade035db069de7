"""The token choice and acceptance rules of engines/step.py and decode.py in seconds, against definitions written here:
the filtered target distribution (temperature, top-k, top-p as TensorRT-LLM / HF apply them), greedy verification, and
sibling rejection's exact law: child i of a node is accepted with probability prod_{j<i} (1 - p_j / m_j) * p_i / m_i
(m = the mass left after the earlier rejections), and the token the node emits is distributed as p.
tests/test_engine_sampling.py checks the same law end to end with a chi-square test on a model (minutes); these run
the function itself many times (fixed seeds)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from engines.decode import choose
from engines.step import draw, greedy_node, sampling_node, target_probs
from core.types import SamplingParams


def reference_probs(logits: list[float], t: float, k: int, p: float) -> list[float]:
    """temperature -> keep the k largest (ties at the k-th kept) -> softmax -> keep the smallest most-likely prefix
    whose mass reaches p -> renormalize."""
    x = [v / t for v in logits]
    if 0 < k < len(x):
        kth = sorted(x, reverse=True)[k - 1]
        x = [v if v >= kth else -math.inf for v in x]
    top = max(x)
    e = [math.exp(v - top) if v != -math.inf else 0.0 for v in x]
    probs = [v / sum(e) for v in e]
    if p < 1.0:
        order = sorted(range(len(x)), key=lambda i: -probs[i])
        kept, mass = set(), 0.0
        for i in order:
            if mass >= p:
                break
            kept.add(i)
            mass += probs[i]
        probs = [q if i in kept else 0.0 for i, q in enumerate(probs)]
        probs = [q / sum(probs) for q in probs]
    return probs


@pytest.mark.parametrize("seed", range(8))
def test_target_probs_matches_the_definition(seed: int) -> None:
    rng = random.Random(seed)
    v = rng.randint(2, 12)
    logits = [rng.gauss(0, 2) for _ in range(v)]
    for t, k, p in [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 3, 1.0), (1.0, 0, 0.6), (0.9, 4, 0.8), (2.0, v, 0.95),
                    (1.0, 1, 1.0), (0.5, 0, 0.01)]:
        got = target_probs(torch.tensor(logits), SamplingParams(temperature=t, top_k=k, top_p=p)).tolist()
        want = reference_probs(logits, t, k, p)
        assert got == pytest.approx(want, abs=1e-6), (t, k, p)
    batch = torch.tensor([logits, logits[::-1]])  # rows are independent
    sp = SamplingParams(temperature=0.8, top_k=3, top_p=0.9)
    assert target_probs(batch, sp)[1].tolist() == pytest.approx(reference_probs(logits[::-1], 0.8, 3, 0.9), abs=1e-6)


def test_greedy_choice_and_greedy_verification() -> None:
    logits = torch.tensor([0.1, 3.0, -1.0, 2.9])
    assert choose(logits, SamplingParams(), torch.Generator()) == 1
    tokens = [7, 4, 1, 3]  # node 0 is the root; its children 1..3 carry tokens 4, 1, 3
    assert greedy_node(1, [1, 2, 3], tokens) == 2
    assert greedy_node(3, [1, 2, 3], tokens) == 3
    assert greedy_node(5, [1, 2, 3], tokens) is None
    assert greedy_node(4, [], tokens) is None  # a leaf accepts nothing


def law(p: list[float], kid_tokens: list[int]) -> tuple[list[float], list[float]]:
    """(P(child i accepted) for each child, P(token emitted when every child is rejected)) by the definition."""
    left = list(p)
    reach = 1.0
    accept = []
    for x in kid_tokens:
        m = sum(left)
        a = left[x] / m if m > 0 else 0.0
        accept.append(reach * a)
        reach *= 1 - a
        left[x] = 0.0
    m = sum(left)
    residual = [reach * q / m if m > 0 else 0.0 for q in left]
    return accept, residual


@pytest.mark.parametrize(
    ("logits", "kids", "sp"),
    [
        ([2.0, 1.0, 0.5, -1.0, 0.0], [0, 1, 4], SamplingParams(temperature=1.0)),
        ([0.2, 1.5, 0.4, 0.9, -0.3], [3, 2], SamplingParams(temperature=0.8, top_k=3)),
        ([1.0, 0.9, 0.8, 0.7, 0.6], [4, 0, 1], SamplingParams(temperature=1.2, top_p=0.7)),
    ],
)
def test_sibling_rejection_follows_its_exact_law(logits: list[float], kids: list[int], sp: SamplingParams) -> None:
    p = target_probs(torch.tensor(logits), sp).tolist()
    tokens = [99] + kids  # node i + 1 holds kids[i]
    accept, residual = law(p, kids)
    n = 3000
    gen = torch.Generator().manual_seed(1)
    child_count = [0] * len(kids)
    token_count = [0] * len(logits)
    residual_count = [0] * len(logits)
    for _ in range(n):
        child, tok = sampling_node(torch.tensor(logits), list(range(1, len(kids) + 1)), tokens, sp, gen)
        if child is not None:
            assert tok is None
            child_count[child - 1] += 1
            token_count[tokens[child]] += 1
        else:
            assert tok is not None
            residual_count[tok] += 1
            token_count[tok] += 1

    def close(count: int, prob: float) -> bool:  # within 5 standard deviations of the binomial
        return abs(count - n * prob) <= 5 * math.sqrt(n * prob * (1 - prob)) + 1

    assert all(close(c, a) for c, a in zip(child_count, accept)), (child_count, [round(n * a) for a in accept])
    assert all(close(c, r) for c, r in zip(residual_count, residual)), (
        residual_count,
        [round(n * r) for r in residual],
    )
    assert all(close(c, q) for c, q in zip(token_count, p)), ("the emitted token must follow p", token_count, p)
    assert all(residual_count[x] == 0 for x in kids), "a rejected child's token is never drawn afterwards"


def test_sibling_rejection_edge_cases() -> None:
    gen = torch.Generator().manual_seed(0)
    one_hot = torch.tensor([-1e9, 5.0, -1e9, -1e9])
    sp = SamplingParams(temperature=1.0)
    for _ in range(50):  # the only possible token is always accepted; an impossible one never
        assert sampling_node(one_hot, [1, 2], [0, 2, 1], sp, gen) == (2, None)
        assert sampling_node(one_hot, [1], [0, 3], sp, gen) == (None, 1)
    assert sampling_node(one_hot, [], [0], sp, gen) == (None, 1)  # a leaf: a draw from p
    for _ in range(20):  # both children rejected for sure: the draw comes from the one token left
        assert sampling_node(torch.tensor([-1e9, -1e9, 0.0]), [1, 2], [0, 0, 1], sp, gen) == (None, 2)


def test_draw_uses_the_requests_generator() -> None:
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    a = [draw(p, torch.Generator().manual_seed(s)) for s in range(30)]
    b = [draw(p, torch.Generator().manual_seed(s)) for s in range(30)]
    assert a == b and len(set(a)) > 1
    assert draw(torch.tensor([0.0, 0.0, 1.0]), torch.Generator()) == 2
    sp = SamplingParams(temperature=1.0, seed=3)
    assert choose(torch.tensor([0.0, 0.0, 50.0]), sp, torch.Generator().manual_seed(0)) == 2


def test_top_p_off_and_top_p_boundary() -> None:
    """top_p=1.0 is off: even a token of probability 1e-13 keeps it (a filter over float32 cumulative sums would
    zero it); top_p exactly reached by a prefix keeps that prefix only (4 equal tokens, top_p 0.5: two of them)."""
    p = target_probs(torch.tensor([0.0, -30.0]), SamplingParams(temperature=1.0, top_p=1.0))
    assert float(p[1]) > 0.0
    q = target_probs(torch.tensor([0.0, 0.0, 0.0, 0.0]), SamplingParams(temperature=1.0, top_p=0.5))
    assert sorted(q.tolist()) == [0.0, 0.0, 0.5, 0.5]


def test_every_draw_uses_the_requests_generator() -> None:
    """Seeded requests are reproducible: choose's draw, sibling rejection's uniform draws and its residual draw all
    use the request's generator (never the global one)."""
    logits = torch.tensor([0.3, 0.1, 0.0, -0.2, 0.25])
    sp = SamplingParams(temperature=1.0)

    def run(seed: int) -> list:
        gen = torch.Generator().manual_seed(seed)
        out: list = [choose(logits, sp, gen) for _ in range(20)]
        out += [sampling_node(logits, [1, 2], [9, 0, 4], sp, gen) for _ in range(40)]
        out += [sampling_node(torch.tensor([-1e9, 0.0, 0.1, 0.2]), [1], [9, 0], sp, gen) for _ in range(20)]
        return out

    torch.manual_seed(1)
    a = run(5)
    torch.manual_seed(2)  # another global state must not matter
    assert run(5) == a
    assert run(6) != a
