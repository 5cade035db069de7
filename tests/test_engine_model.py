"""Reference engine, target model: logits and greedy outputs from converted TRT-LLM checkpoints equal Hugging Face's.

Tolerances: float32 tiny models — max |logit difference| <= 1e-4 (same math, different op order in fused qkv);
SmolLM2-135M float32 — <= 2e-3 (30 layers of accumulated float32 rounding; logits are O(10)).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from engines.api import GenerationRequest, ReferenceEngine, SamplingParams
from engines.checkpoint import CheckpointError
from engines.cache import make_step
from engines.session import Session

PROMPT = [5, 17, 33, 101, 7, 9, 250, 3, 64, 128, 200, 11]


pytestmark = pytest.mark.usefixtures("one_thread")


def engine_logits(engine: ReferenceEngine, ids: list[int]) -> torch.Tensor:
    """Full-prompt logits from one prefill forward of the engine's target."""
    rt = engine._rt
    s = Session(rt, [GenerationRequest(ids, 1, SamplingParams(), [])], False, None)
    p = len(ids)
    step = make_step(torch.tensor([0]), torch.zeros(1, dtype=torch.long), torch.arange(p)[None],
                     torch.ones(p, p, dtype=torch.bool).tril()[None])
    hidden, _ = rt.target.forward(torch.tensor([ids]), step, s.tcache)
    return rt.target.lm_head(hidden)[0]


def hf_model(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def test_tiny_logits_match_hf(tiny_target: Path, target_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    ours = engine_logits(engine, PROMPT)
    with torch.inference_mode():
        ref = hf_model(tiny_target)(torch.tensor([PROMPT])).logits[0]
    assert ours.shape == ref.shape == (len(PROMPT), 320)
    assert (ours - ref).abs().max().item() <= 1e-4


def test_tied_llama3_rope_logits_match_hf(tiny_dir: Path, tiny_target_tied: Path) -> None:
    """Tied embeddings + llama3 rope scaling; positions beyond original_max_position_embeddings (64) exercise the
    scaled frequencies."""
    from builders.convert import convert_llama

    ckpt = tiny_dir / "ckpt_tied"
    convert_llama(tiny_target_tied, ckpt, dtype="float32")
    assert json.loads((ckpt / "config.json").read_text())["rotary_scaling"]["rope_type"] == "llama3"
    engine = ReferenceEngine.from_checkpoint(ckpt, tree=None, dtype="float32", device="cpu")
    ids = [(i * 37) % 300 + 3 for i in range(90)]
    ours = engine_logits(engine, ids)
    with torch.inference_mode():
        ref = hf_model(tiny_target_tied)(torch.tensor([ids])).logits[0]
    assert (ours - ref).abs().max().item() <= 1e-4


def test_target_only_greedy_matches_hf_generate_and_batching(tiny_target: Path, target_ckpt: Path) -> None:
    engine = ReferenceEngine.from_checkpoint(target_ckpt, tree=None, dtype="float32", device="cpu")
    hf = hf_model(tiny_target)
    prompts = [PROMPT, [9, 8, 7], PROMPT[:5] * 3]
    with torch.inference_mode():
        expected = [
            hf.generate(torch.tensor([p]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)[
                0, len(p) :
            ].tolist()
            for p in prompts
        ]
    reqs = [GenerationRequest(p, 24, SamplingParams(), []) for p in prompts]
    results = engine.generate(reqs, speculative=False)  # one batch, different prompt lengths
    assert [r.output_ids for r in results] == expected
    for r in results:
        assert r.finish_reason == "length"
        assert r.stats.generated_tokens == 24 and r.stats.target_forwards == 23 and r.stats.tau == 1.0


@pytest.mark.slow
def test_smollm2_logits_match_hf(tmp_path: Path) -> None:
    from builders.convert import convert_llama
    from sources.targets import smollm2_dir

    hf_dir = smollm2_dir()
    convert_llama(hf_dir, tmp_path / "ckpt", dtype="float32")
    engine = ReferenceEngine.from_checkpoint(tmp_path / "ckpt", tree=None, dtype="float32", device="cpu")
    ids = engine.tokenizer("The capital of France is Paris, and the capital of Italy is")["input_ids"]
    ours = engine_logits(engine, ids)
    hf = hf_model(hf_dir)
    with torch.inference_mode():
        ref = hf(torch.tensor([ids])).logits[0]
        expected = hf.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, pad_token_id=0)[0, len(ids) :]
    assert (ours - ref).abs().max().item() <= 2e-3
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))
    [res] = engine.generate(
        [GenerationRequest(ids, 16, SamplingParams(), [engine.tokenizer.eos_token_id])], speculative=False
    )
    assert res.output_ids == expected.tolist()[: len(res.output_ids)]


def test_missing_tensor_is_named(tmp_path: Path, target_ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    shutil.copytree(target_ckpt, bad)
    t = load_file(str(bad / "rank0.safetensors"))
    del t["transformer.layers.1.mlp.gate.weight"]
    save_file(t, str(bad / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match=r"transformer\.layers\.1\.mlp\.gate\.weight' is missing"):
        ReferenceEngine.from_checkpoint(bad, tree=None, dtype="float32", device="cpu")


def test_unknown_tensor_is_an_error(tmp_path: Path, target_ckpt: Path) -> None:
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "extra"
    shutil.copytree(target_ckpt, bad)
    t = load_file(str(bad / "rank0.safetensors"))
    t["transformer.layers.9.attention.qkv.weight"] = torch.zeros(2, 2)
    save_file(t, str(bad / "rank0.safetensors"))
    with pytest.raises(CheckpointError, match="does not know"):
        ReferenceEngine.from_checkpoint(bad, tree=None, dtype="float32", device="cpu")


def test_tp_checkpoint_without_process_group_says_how_to_launch(tmp_path: Path, tiny_target: Path) -> None:
    from builders.convert import convert_llama

    convert_llama(tiny_target, tmp_path / "tp2", dtype="float32", tp=2)
    with pytest.raises(RuntimeError, match="tp_size=2.*torchrun --nproc-per-node 2"):
        ReferenceEngine.from_checkpoint(tmp_path / "tp2", tree=None, dtype="float32", device="cpu")


def test_tree_without_head_is_an_error(target_ckpt: Path) -> None:
    from core.trees import DraftTree, preset

    with pytest.raises(CheckpointError, match="holds no EAGLE head"):
        ReferenceEngine.from_checkpoint(target_ckpt, tree=DraftTree.from_choices(preset("chain-2")), dtype="float32")
