"""Public API of the reference engine: requests, results, statistics and `ReferenceEngine`.

Other parts of the project (Triton's reference model, the tree tuner, the FP8 check, the trainer, `engines.verify`)
depend on exactly these names and signatures.

    engine = ReferenceEngine.from_build(Path("build/demo"))
    req = GenerationRequest(prompt_ids=ids, max_new_tokens=64, sampling=SamplingParams(), stop_token_ids=[eos])
    [result] = engine.generate([req])
    result.output_ids, result.finish_reason, result.stats.tau
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from engines.trees import DraftTree, DynamicTree

FinishReason = Literal["eos", "stop", "length", "cancelled"]


@dataclass
class SamplingParams:
    """How the next token is chosen from the target's distribution.

    temperature 0 = greedy (argmax). Otherwise logits / temperature, then top-k (0 = off), then top-p (1.0 = off),
    then a categorical draw. `seed` seeds this request's own random generator (None = nondeterministic).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1] (1.0 = off)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass
class GenerationRequest:
    """One sequence to generate. Generation stops at the first of: a token in `stop_token_ids` (kept in the output,
    finish_reason "eos"), decoded output containing one of `stop_strings` (output ends with the token that completed
    it, finish_reason "stop"), `max_new_tokens` generated ("length")."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingParams
    stop_token_ids: list[int]
    stop_strings: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("GenerationRequest.prompt_ids is empty; give at least one token")
        if self.max_new_tokens < 1:
            raise ValueError(f"GenerationRequest.max_new_tokens={self.max_new_tokens} must be >= 1")


@dataclass
class RequestStats:
    """Per-request counters.

    generated_tokens: tokens in output_ids (including the one sampled from the prefill).
    target_forwards: target forward passes AFTER the prefill (one per decoding step; each verifies one draft tree).
    accepted_draft_tokens: draft tokens that were accepted and kept in the output.
    draft_tokens: draft tokens proposed to the target (tree nodes, root excluded), summed over steps.
    acceptance_by_depth: [d] = number of steps whose accepted path reached depth d+1.

    tau (average acceptance length) = (accepted_draft_tokens + target_forwards) / target_forwards, i.e. tokens
    gained per target forward after the prefill: every step yields its accepted draft tokens plus one token sampled
    from the target (the bonus/correction token). Target-only decoding has tau = 1 exactly. Tokens cut by a stop
    condition are not counted.
    """

    generated_tokens: int = 0
    target_forwards: int = 0
    accepted_draft_tokens: int = 0
    draft_tokens: int = 0
    acceptance_by_depth: list[int] = field(default_factory=list)

    @property
    def tau(self) -> float:
        if self.target_forwards == 0:
            return 0.0
        return (self.accepted_draft_tokens + self.target_forwards) / self.target_forwards

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens (TRT-LLM's `acceptance_rate` perf metric)."""
        return self.accepted_draft_tokens / self.draft_tokens if self.draft_tokens else 0.0


@dataclass
class GenerationResult:
    output_ids: list[int]  # generated tokens only (the prompt is not repeated)
    finish_reason: FinishReason
    stats: RequestStats


def aggregate_stats(stats: list[RequestStats]) -> RequestStats:
    """Sum of per-request counters; the aggregate tau is therefore forward-weighted (total tokens gained over total
    target forwards), not the mean of per-request taus."""
    total = RequestStats()
    depth = max((len(s.acceptance_by_depth) for s in stats), default=0)
    total.acceptance_by_depth = [0] * depth
    for s in stats:
        total.generated_tokens += s.generated_tokens
        total.target_forwards += s.target_forwards
        total.accepted_draft_tokens += s.accepted_draft_tokens
        total.draft_tokens += s.draft_tokens
        for d, n in enumerate(s.acceptance_by_depth):
            total.acceptance_by_depth[d] += n
    return total


def stats_dict(s: RequestStats) -> dict[str, Any]:
    """JSON-ready stats including the derived tau and acceptance rate."""
    return {
        "generated_tokens": s.generated_tokens,
        "target_forwards": s.target_forwards,
        "accepted_draft_tokens": s.accepted_draft_tokens,
        "draft_tokens": s.draft_tokens,
        "acceptance_by_depth": list(s.acceptance_by_depth),
        "tau": round(s.tau, 4),
        "acceptance_rate": round(s.acceptance_rate, 4),
    }


OnTokens = Callable[[int, list[int]], bool]


class ReferenceEngine:
    """PyTorch EAGLE engine over a TRT-LLM checkpoint (loading: engines/runtime.py; the loop: engines/decode.py)."""

    def __init__(self, runtime: Any) -> None:
        from engines.runtime import Runtime

        if not isinstance(runtime, Runtime):
            raise TypeError("ReferenceEngine is built with ReferenceEngine.from_build or from_checkpoint")
        self._rt = runtime

    # ---- construction -------------------------------------------------------------------------------------------
    @classmethod
    def from_build(cls, build_dir: Path, device: str | None = None) -> ReferenceEngine:
        """Load what `<build_dir>/engine/reference.json` (engines.spec) describes. `device` overrides the spec's."""
        from engines.runtime import runtime_from_spec
        from engines.spec import read_spec

        build_dir = Path(build_dir)
        spec = read_spec(build_dir)
        return cls(runtime_from_spec(spec, build_dir, device=device))

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint_dir: Path,
        *,
        tree: DraftTree | DynamicTree | None,
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
        drafts over, e.g. the most frequent ones (engines/draft_vocab.py); outputs are unchanged.
        """
        from engines.runtime import Runtime

        return cls(
            Runtime.load(Path(checkpoint_dir), tree=tree, dtype=dtype, device=device, eagle3_head_dir=eagle3_head_dir,
                         draft_vocab=draft_vocab)
        )

    def with_tree(self, tree: DraftTree | DynamicTree) -> ReferenceEngine:
        """This engine's weights (shared, not copied) drafting with another tree."""
        return ReferenceEngine(self._rt.with_tree(tree))

    def with_draft_vocab(self, ids: list[int]) -> ReferenceEngine:
        """This engine's weights (shared) with its EAGLE-1/2 head drafting over the target tokens `ids` only."""
        return ReferenceEngine(self._rt.with_draft_vocab(ids))

    # ---- properties ---------------------------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer from `<checkpoint>/tokenizer`."""
        return self._rt.tokenizer

    @property
    def device(self) -> str:
        return str(self._rt.device)

    @property
    def dtype(self) -> Any:
        """The compute dtype (a torch.dtype)."""
        return self._rt.dtype

    def describe_tree(self) -> str:
        t = self._rt.tree
        if t is None:
            return "no tree (target-only)"
        kind = "static" if hasattr(t, "paths") else f"dynamic top_k={t.top_k}"  # type: ignore[union-attr]
        return f"{kind} tree, {t.size} draft tokens, depth {t.depth}"

    @property
    def has_draft(self) -> bool:
        return self._rt.drafter is not None and self._rt.tree is not None

    @property
    def random_head(self) -> bool:
        """True when the checkpoint says its head is randomly initialized (acceptance ~0: label results)."""
        return self._rt.random_head

    @property
    def tree(self) -> DraftTree | DynamicTree | None:
        return self._rt.tree

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
        return self._rt.generate(requests, speculative=speculative, on_tokens=on_tokens)

    def session(
        self,
        capacity: int | None = None,
        max_len: int | None = None,
        *,
        speculative: bool = True,
        on_tokens: OnTokens | None = None,
    ) -> Any:
        """An in-flight batch (engines.session.Session): `add(request) -> slot` at any time, `step()` prefills the
        new requests or advances every active sequence by one step, `cancel(slot)`, `finished`, `pop(slot) ->
        GenerationResult`, `done`. A request's tokens do not depend on when it joined (greedy: identical to running
        it alone). `capacity` (sequence slots) and `max_len` (prompt + output tokens per slot) default to the
        build's engine.max_batch_size and engine.max_seq_len."""
        limits = self._rt.limits
        if (capacity is None or max_len is None) and limits is None:
            raise ValueError("capacity and max_len are required for an engine loaded without a build (from_checkpoint)")
        return self._rt.open_session(
            capacity if capacity is not None else limits.max_batch_size,  # type: ignore[union-attr]
            max_len if max_len is not None else limits.max_seq_len,  # type: ignore[union-attr]
            speculative=speculative, on_tokens=on_tokens,
        )  # fmt: skip

    @staticmethod
    def aggregate(results: list[GenerationResult]) -> RequestStats:
        return aggregate_stats([r.stats for r in results])
