"""Public API of the reference engine: `ReferenceEngine` and the value types it takes and returns.

Other parts of the project (Triton's reference model, the tree tuner, the FP8 check, the trainer, `measure.verify`)
depend on exactly these names and signatures.

    engine = ReferenceEngine.from_build(Path("build/demo"))
    req = GenerationRequest(prompt_ids=ids, max_new_tokens=64, sampling=SamplingParams(), stop_token_ids=[eos])
    [result] = engine.generate([req])
    result.output_ids, result.finish_reason, result.stats.tau
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from core.spec import read_spec
from core.speculation import SpeculationPolicy
from core.trees import Tree
from core.types import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    Limits,
    OnTokens,
    RequestStats,
    SamplingParams,
    aggregate_stats,
    stats_dict,
)
from engines.fp8_generic import SCALES_FILE as FP8_SCALES_FILE
from engines.runtime import Runtime, load_tokenizer, runtime_from_spec
from engines.session import Session, generate, open_session
from engines.text_model import load_causal_lm, text_model_of

__all__ = [
    "FP8_SCALES_FILE",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "Limits",
    "OnTokens",
    "ReferenceEngine",
    "RequestStats",
    "SamplingParams",
    "aggregate_stats",
    "load_causal_lm",
    "load_tokenizer",
    "stats_dict",
    "text_model_of",
]


class ReferenceEngine:
    """PyTorch EAGLE engine over a TRT-LLM checkpoint (loading: engines/runtime.py; the batch: engines/session.py;
    the step: engines/step.py)."""

    def __init__(self, runtime: Runtime) -> None:
        if not isinstance(runtime, Runtime):
            raise TypeError("ReferenceEngine is built with ReferenceEngine.from_build or from_checkpoint")
        self._rt = runtime

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_build(cls, build_dir: Path, device: str | None = None,
                   eagle3_head_dir: Path | None = None) -> ReferenceEngine:
        """Load what `<build_dir>/engine/reference.json` (core.spec) describes. `device` overrides the spec's;
        `eagle3_head_dir` drafts with another normalized EAGLE-3 head (a published head version: docs/adaptive.md)."""
        build_dir = Path(build_dir)
        spec = read_spec(build_dir)
        if eagle3_head_dir is not None:
            spec = spec.model_copy(update={"eagle3_head_dir": str(Path(eagle3_head_dir).resolve())})
        return cls(runtime_from_spec(spec, build_dir, device=device))

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_dir: Path,
        *,
        tree: Tree | None,
        dtype: str,
        device: str = "auto",
        eagle3_head_dir: Path | None = None,
        draft_vocab: list[int] | None = None,
    ) -> ReferenceEngine:
        """Load a TRT-LLM checkpoint dir (config.json + rank{r}.safetensors, tokenizer in `<dir>/tokenizer`).

        `tree` None = target-only decoding (the checkpoint may still hold a head; it is not used). An
        `EagleForCausalLM` checkpoint carries its EAGLE-1/2 head; an EAGLE-3 head is a separate normalized dir
        (`eagle3_head_dir`). A tp>1 checkpoint must be loaded in every rank of an initialized torch.distributed
        group of that size (see engines/parallel.py). `draft_vocab` (EAGLE-1/2 heads): the target token ids the head
        drafts over, e.g. the most frequent ones (measure/draft_vocab.py); outputs are unchanged.
        """
        return cls(
            Runtime.load(Path(checkpoint_dir), tree=tree, dtype=dtype, device=device, eagle3_head_dir=eagle3_head_dir,
                         draft_vocab=draft_vocab)
        )

    def with_tree(self, tree: Tree) -> ReferenceEngine:
        """This engine's weights (shared, not copied) drafting with another tree."""
        return ReferenceEngine(self._rt.with_tree(tree))

    def with_policy(self, policy: SpeculationPolicy | None) -> ReferenceEngine:
        """This engine's weights and tree with each step's draft length following `policy` (engines/schedule.py:
        draft_len_schedule, max_concurrency, acceptance-rate switch); None = always the whole tree."""
        return ReferenceEngine(self._rt.with_policy(policy))

    @property
    def policy(self) -> SpeculationPolicy | None:
        return self._rt.policy

    def with_draft_vocab(self, ids: list[int]) -> ReferenceEngine:
        """This engine's weights (shared) with its EAGLE-1/2 head drafting over the target tokens `ids` only."""
        return ReferenceEngine(self._rt.with_draft_vocab(ids))

    # ---- properties ---------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer from `<checkpoint>/tokenizer`."""
        return self._rt.tokenizer

    @property
    def kernels(self) -> tuple[str, ...]:
        """What multiplies the weights on this machine, one line per layout (per shape where chosen by measurement
        at load: engines/kernel_choice.py)."""
        return self._rt.kernels

    @property
    def device(self) -> str:
        return str(self._rt.device)

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype (a torch.dtype)."""
        return self._rt.dtype

    def describe_tree(self) -> str:
        d = self._rt.drafting
        return "no tree (target-only)" if d is None else d.describe()

    @property
    def vocab_size(self) -> int:
        """Token ids the target accepts: 0 .. vocab_size - 1."""
        return self._rt.target.lm_head.vocab_size

    @property
    def limits(self) -> Limits:
        """The build's request limits (its reference.json); an engine loaded without a build has none."""
        if self._rt.limits is None:
            raise ValueError("this engine was loaded without a build (from_checkpoint): it has no build limits")
        return self._rt.limits

    @property
    def has_draft(self) -> bool:
        return self._rt.drafter is not None and self._rt.drafting is not None

    @property
    def random_head(self) -> bool:
        """True when the checkpoint says its head is randomly initialized (acceptance ~0: label results)."""
        return self._rt.random_head

    @property
    def tree(self) -> Tree | None:
        return None if self._rt.drafting is None else self._rt.drafting.tree

    # ---- generation ---------------------------------------------------------------------------------------------
    def generate(
        self,
        requests: list[GenerationRequest],
        *,
        speculative: bool = True,
        on_tokens: OnTokens | None = None,
    ) -> list[GenerationResult]:
        """Generate for a batch of requests (run together; each accepts a different number of tokens per step).

        `speculative` False = target-only decoding. `on_tokens(request_index, new_token_ids)` is called whenever
        tokens of a request are accepted (streaming); returning False cancels that request (finish_reason
        "cancelled") and frees its cache rows.
        """
        return generate(self._rt, requests, speculative=speculative, on_tokens=on_tokens)

    def session(
        self,
        capacity: int | None = None,
        max_len: int | None = None,
        *,
        speculative: bool = True,
        on_tokens: OnTokens | None = None,
    ) -> Session:
        """An in-flight batch (engines.session.Session): `add(request) -> slot` at any time, `step()` prefills the
        new requests or advances every active sequence by one step, `cancel(slot)`, `finished`, `pop(slot) ->
        GenerationResult`, `done`. A request's tokens do not depend on when it joined (greedy: identical to running
        it alone). `capacity` (sequence slots) and `max_len` (prompt + output tokens per slot) default to the
        build's engine.max_batch_size and engine.max_seq_len."""
        limits = self._rt.limits
        if capacity is None or max_len is None:
            if limits is None:
                raise ValueError("capacity and max_len are required for an engine loaded without a build "
                                 "(from_checkpoint)")
            capacity = limits.max_batch_size if capacity is None else capacity
            max_len = limits.max_seq_len if max_len is None else max_len
        return open_session(self._rt, capacity, max_len, speculative=speculative, on_tokens=on_tokens)

    @staticmethod
    def aggregate(results: list[GenerationResult]) -> RequestStats:
        return aggregate_stats([r.stats for r in results])
