"""Reference engine in 16 bits: logits against Hugging Face in the same dtype, builds that ask for bfloat16 run in
bfloat16, and the greedy agreement tools (measure/lossless.py).

Tolerance: the engine in a 16-bit dtype must be at least as close to HF in that dtype as HF in that dtype is to HF
in float32, max |logit difference| over every position of a prompt. That is the size of 16-bit rounding itself on
that model, so the bound holds on any hardware and says the engine adds no error beyond its dtype's rounding.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from core.trees import DraftTree, preset
from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from measure.lossless import Divergence, explain, first_divergence, next_logits

IDS = [(i * 37) % 300 + 3 for i in range(60)]


pytestmark = pytest.mark.usefixtures("one_thread")


def all_logits(engine: ReferenceEngine, ids: list[int]) -> torch.Tensor:
    """Logits at every position of `ids`: next_logits of each prefix would prefill len(ids) times; one prefill and
    the lm_head over every row gives the same rows."""
    from engines.cache import KVCache, Rows

    rt = engine._rt
    t, n = rt.target, len(ids)
    cache = KVCache.allocate(len(t.layers), 1, n + 1, t.kv_heads, t.head_dim, rt.dtype, rt.device)
    causal = torch.ones(n, n, dtype=torch.bool, device=rt.device).tril()[None]
    with torch.inference_mode():
        step = Rows.of([0], [0], rt.device).step(torch.arange(n, device=rt.device)[None], causal)
        hidden, _ = t.forward(torch.tensor([ids], device=rt.device), step, cache)
        return t.lm_head(hidden[0]).float().cpu()


def hf_logits(path: Path, ids: list[int], dtype: torch.dtype, device: str = "cpu") -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device).eval()
    with torch.inference_mode():
        return model(torch.tensor([ids], device=device)).logits[0].float().cpu()


def check_against_hf(hf_dir: Path, ckpt: Path, dtype: str, ids: list[int], device: str = "cpu") -> tuple[float, float]:
    dt = getattr(torch, dtype)
    engine = ReferenceEngine.from_checkpoint(ckpt, tree=None, dtype=dtype, device=device)
    assert engine.dtype == dt
    ours = all_logits(engine, ids)
    h16, h32 = hf_logits(hf_dir, ids, dt, device), hf_logits(hf_dir, ids, torch.float32, device)
    ours_err, hf_rounding = (ours - h16).abs().max().item(), (h16 - h32).abs().max().item()
    assert hf_rounding > 0  # the 16-bit run really rounded
    assert ours_err <= hf_rounding, f"engine {dtype} vs HF {dtype}: {ours_err} > HF {dtype} vs float32: {hf_rounding}"
    return ours_err, hf_rounding


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_tiny_16bit_logits_match_hf_in_the_same_dtype(tiny_target: Path, target_ckpt: Path, dtype: str) -> None:
    check_against_hf(tiny_target, target_ckpt, dtype, IDS)


def test_a_bfloat16_build_runs_in_bfloat16(tmp_path: Path, mimic_ckpt: Path) -> None:
    """reference.json dtype bfloat16 (a `target.dtype: bfloat16` build): KV caches, activations and drafter state
    in bfloat16; logits float32 (softmax, sampling and the acceptance rule work on float32)."""
    from core.spec import ReferenceSpec, write_spec

    shutil.copytree(mimic_ckpt, tmp_path / "checkpoint")
    (tmp_path / "engine").mkdir()
    write_spec(ReferenceSpec(
        checkpoint_dir="checkpoint", tokenizer_dir="checkpoint/tokenizer", draft_type="eagle", eagle3_head_dir=None,
        random_head=False, tree_choices=DraftTree.from_choices(preset("chain-3")).as_lists(), dynamic_tree=None,
        dtype="bfloat16", device="cpu", tp=1, max_batch_size=2, max_input_len=32, max_seq_len=64,
    ), tmp_path / "engine")
    engine = ReferenceEngine.from_build(tmp_path)
    assert engine.dtype == torch.bfloat16
    session = engine.session()
    session.add(GenerationRequest([5, 17, 33, 101, 7], 12, SamplingParams(), []))
    while not session.done:
        session.step()
    assert session.tcache.k[0].dtype == session.dcache.k[0].dtype == torch.bfloat16
    assert session.state.h.dtype == torch.bfloat16 and session.state.logits.dtype == torch.float32
    r = session.pop(0)
    assert len(r.output_ids) == 12 and r.stats.accepted_draft_tokens > 0
    assert next_logits(engine, [5, 17, 33]).dtype == torch.float32


def test_divergence_is_explained_by_the_logit_gap(mimic_ckpt: Path) -> None:
    """`explain` names the first differing position and the gap between the two chosen tokens in float32 and in the
    16-bit engine, after the common prefix."""
    tree = DraftTree.from_choices(preset("chain-3"))
    f32 = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="float32", device="cpu")
    b16 = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="bfloat16", device="cpu")
    prompt = [5, 17, 33, 101, 7]
    [ref] = f32.generate([GenerationRequest(prompt, 16, SamplingParams(), [])], speculative=False)
    out = ref.output_ids
    assert explain(f32, b16, prompt, out, out) is None and explain(f32, b16, prompt, out, out[:5]) is None
    other = out[:7] + [(out[7] + 1) % 320] + out[8:]
    d = explain(f32, b16, prompt, out, other)
    assert isinstance(d, Divergence) and d.index == 7 and (d.token_a, d.token_b) == (out[7], other[7])
    l32 = next_logits(f32, prompt + out[:7])
    assert d.gap_fp32 == pytest.approx(float(l32[out[7]] - l32[other[7]]))
    assert d.gap_fp32 > 0  # out[7] is the float32 argmax there
    assert d.rounding == pytest.approx(abs(d.gap_engine - d.gap_fp32))
    assert first_divergence(out, other) == 7


def test_bfloat16_eagle_agrees_with_bfloat16_target_only_on_a_tiny_model(mimic_ckpt: Path) -> None:
    """Where no two tokens are within rounding of each other the acceptance rule reproduces target-only decoding in
    bfloat16 too; the report of the SmolLM2 benchmark gives the measured agreement on real prompts."""
    tree = DraftTree.from_choices(preset("eagle-default"))
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=tree, dtype="bfloat16", device="cpu")
    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 30, SamplingParams(), []) for i in range(3)]
    plain, spec = engine.generate(reqs, speculative=False), engine.generate(reqs)
    assert [r.output_ids for r in spec] == [r.output_ids for r in plain]
    assert engine.aggregate(spec).tau > 1.2


@pytest.mark.slow
def test_smollm2_bfloat16_logits_match_hf_bfloat16(tmp_path: Path) -> None:
    """A bfloat16 checkpoint, as a `target.dtype: bfloat16` build converts it."""
    from builders.convert import convert_llama
    from sources.targets import smollm2_dir
    from engines.runtime import load_tokenizer

    convert_llama(smollm2_dir(), tmp_path / "ckpt", dtype="bfloat16")
    tok = load_tokenizer(tmp_path / "ckpt" / "tokenizer")
    ids = tok("The capital of France is Paris, and the capital of Italy is")["input_ids"]
    check_against_hf(smollm2_dir(), tmp_path / "ckpt", "bfloat16", ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the engine runs on CPU otherwise)")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_16bit_logits_match_hf_and_eagle_runs(
    tiny_target: Path, target_ckpt: Path, mimic_ckpt: Path, dtype: str
) -> None:
    check_against_hf(tiny_target, target_ckpt, dtype, IDS, device="cuda")
    engine = ReferenceEngine.from_checkpoint(mimic_ckpt, tree=DraftTree.from_choices(preset("eagle-default")),
                                             dtype=dtype, device="cuda")
    reqs = [GenerationRequest([5 + i, 17, 33, 101, 7], 30, SamplingParams(), []) for i in range(3)]
    spec = engine.generate(reqs)
    assert all(len(r.output_ids) == 30 for r in spec) and engine.aggregate(spec).tau > 1.2
