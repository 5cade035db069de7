"""Long build steps say what they do and how far (builders/convert/fp8.py generate_with_progress: the tau
measurements of quantized builds and the acceptance baseline), and give the same results as one batched run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builders.convert.fp8 import generate_with_progress


@pytest.mark.parametrize(("n", "batch"), [(1, 1), (5, 2), (4, 4)])
def test_progress_names_the_work_and_counts_the_prompts(eagle_ckpt: Path, capsys: pytest.CaptureFixture[str],
                                                        n: int, batch: int) -> None:
    from core.trees import DraftTree, preset
    from engines.api import GenerationRequest, ReferenceEngine, SamplingParams

    eng = ReferenceEngine.from_checkpoint(eagle_ckpt, tree=DraftTree.from_choices(preset("topk-2-2")),
                                          dtype="float32", device="cpu")
    reqs = [GenerationRequest(prompt_ids=[1, 5 + i, 9], max_new_tokens=6, sampling=SamplingParams(),
                              stop_token_ids=[]) for i in range(n)]
    got = generate_with_progress(eng, reqs, f"tau of ckpt ({n} prompts x 6 tokens, reference engine)",
                                 batch)
    err = capsys.readouterr().err
    assert f"tau of ckpt ({n} prompts x 6 tokens, reference engine): 100%" in err and f"{n}/{n}" in err
    assert [r.output_ids for r in got] == [r.output_ids for r in eng.generate(reqs, speculative=True)]


def test_tau_progress_names_what_the_checkpoint_holds(tmp_path: Path) -> None:
    from builders.convert.fp8 import checkpoint_label

    cases = {"a": {"quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}},
             "b": {"quantization": {"quant_algo": None, "kv_cache_quant_algo": None}}, "c": {}}
    for name, cfg in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    assert checkpoint_label(tmp_path / "a") == "the FP8 target with an FP8 KV cache"
    assert checkpoint_label(tmp_path / "b") == checkpoint_label(tmp_path / "c") == "the 16-bit target"
    assert checkpoint_label(tmp_path / "missing") == "missing"
