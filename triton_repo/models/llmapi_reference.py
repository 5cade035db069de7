"""Triton python model `tensorrt_llm` of the llmapi layout, on the reference engine: the CPU mirror of TensorRT-LLM's
triton_backend/all_models/llmapi/tensorrt_llm/1/model.py. Same config.pbtxt inputs/outputs
(triton_repo/llmapi_contract.py), same model.yaml (read the same way: `triton_config.decoupled` without a default),
same wire behaviour:

- text in (`text_input` element 0, tokenized here with the tokenizer's special tokens, as the LLM API does), text out;
- streaming: each response carries the text generated SO FAR (upstream sends RequestOutput.outputs[0].text), the
  last one has the FINAL flag; not streaming: one response with the whole text;
- perf outputs, when `sampling_param_return_perf_metrics`: the speculative ones, sent as strings as upstream does
  (the reference engine has no KV-block or timing metrics, so those are not sent);
- `stop: true` cancels the requests sent with the same request id and the same `stop_key` request parameter (its
  owner's secret, models/ownership.py); a client cancellation ends the request with CANCELLED "Request cancelled
  by client"; ids and stop keys are bounded before any work;
- every input is bounded before the prompt is tokenized (one prompt per request, its bytes, stop strings);
- no sampling parameter given = greedy; max_tokens absent = 32 (SamplingParams' default).
It refuses with INVALID_ARGUMENT what TensorRT-LLM's one-model speculative path refuses (penalties without
enable_penalty, which this engine never has; cumulative logprobs: models/llmapi_refusals.py, the rule upstream's model
is held to under engine.backend pytorch too) and what the reference engine cannot do (best_of > 1, LoRA adapters).
The engine and its draft tree come from `<build_dir>/engine/reference.json`; model.yaml's speculative_config must
describe the same tree (checked at load); without a speculative_config the model decodes without speculation, as
the LLM API does. Requests are batched in flight by triton_repo/models/batcher.py.
"""

from __future__ import annotations

import contextlib
import os

from typing import Any, TYPE_CHECKING

import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

if TYPE_CHECKING:
    from triton_repo.models.batcher import Job

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
DEFAULT_MAX_TOKENS = 32


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from pathlib import Path

        import yaml

        from triton_repo import contract
        from triton_repo.models.common import draft_depth
        from triton_repo.models import batcher, capture, common, llmapi_io, llmapi_refusals, ownership, spec_metrics
        from triton_repo.models import step_profile, versions

        self.C, self.io, self.batcher_mod, self.ownership, self.common = contract, llmapi_io, batcher, ownership, common
        self.refusals = llmapi_refusals
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.environ.get("LLM_CONFIG_PATH", os.path.join(here, "model.yaml"))) as f:
            doc = yaml.safe_load(f)
        self.decoupled = bool(doc["triton_config"]["decoupled"])
        p = common.Params.of(args)
        self.engine = versions.engine_for(args, Path(p.path("build_dir")))  # this version's head (models/versions.py)
        self.spec = doc.get("speculative_config") or {}
        # No speculative_config: the LLM API decodes without speculation, and so does this mirror (the same engine,
        # target-only steps); scripts/spec_sweep.py serves such a copy as its baseline.
        speculative = bool(self.spec)
        if speculative:
            llmapi_io.check_tree(self.spec, self.engine.tree)
            llmapi_io.check_policy(self.spec, self.engine.policy)
        self.tokenizer = self.engine.tokenizer
        # The limits come from the engine's spec (reference.json), the one source; the Triton stage checked at build
        # time that model.yaml's copies (what TensorRT-LLM's LLM reads) agree with it.
        self.limits = limits = self.engine.limits
        profile = step_profile.for_llm_model(args["model_name"])  # $EAGLE_DEPLOY_STEP_PROFILE (off: None)
        session = self.engine.session(limits.max_batch_size, limits.max_seq_len, speculative=speculative,
                                      on_tokens=self._on_tokens if profile is None else profile.timed_send(
                                          self._on_tokens))
        if profile is not None:
            session.laps = profile.laps
        self.metrics = spec_metrics.SpecMetrics(
            pb_utils, args["model_name"], "reference", draft_depth(self.engine),
            self.engine.has_draft, spec_metrics.baseline_for(args), str(args.get("model_version", "")))
        self.capture = capture.Hook.of(pb_utils, args, "reference")  # opt-in store (models/capture.py)
        self.batcher = batcher.Batcher(session, lambda job: job.payload.request, self._finish,
                                       max_queue_size=p.int("max_queue_size"), on_count=self.metrics.counts,
                                       profile=profile)

    def execute(self, requests: list[pb_utils.InferenceRequest]) -> None:
        for r in requests:
            sender = r.get_response_sender()
            try:
                if problem := self.ownership.problem(r):  # an id or stop_key too long: nothing is kept of it
                    raise self.io.RequestError(problem)
                if self.io.flag(pb_utils, r, "stop"):
                    self._stop(r.request_id(), self.ownership.stop_key(r), sender)
                    continue
                refused = (self.refusals.refuse_adapter_inputs(pb_utils, r)
                           or self.refusals.refuse_speculative_sampling(pb_utils, r, self.spec))
                if refused is not None:
                    raise self.io.RequestError(refused)
                parsed = self.io.parse(pb_utils, r, self.tokenizer, self.limits, DEFAULT_MAX_TOKENS)
                if parsed.streaming and not self.decoupled:
                    raise self.io.RequestError("Streaming is only supported in decoupled mode.")
            except self.io.RequestError as e:
                sender.send(self.io.error(pb_utils, str(e)), flags=FINAL)
                continue
            except Exception as e:  # an input no check anticipated: refused without a traceback
                sender.send(self.io.error(pb_utils, self.common.unexpected(e)), flags=FINAL)
                continue
            job = self.batcher_mod.Job(payload=parsed, is_cancelled=sender.is_cancelled, streaming=parsed.streaming)
            job.request_id = r.request_id() or ""
            job.stop_key = self.ownership.stop_key(r)
            parsed.capture = self.capture.wanted(r)
            parsed.sender = sender
            refusal = self.batcher.admit(job)
            if refusal is not None:
                self.metrics.refused.increment(1)
                sender.send(self.io.error(pb_utils, refusal, self.C.UNAVAILABLE), flags=FINAL)
        return None

    def _stop(self, request_id: str, key: str | None, sender: pb_utils.InferenceResponseSender) -> None:
        """Reaches only the requests sent with this id and this stop_key (models/ownership.py)."""
        if not request_id:
            sender.send(self.io.error(pb_utils, "A request id must be provided for request cancellation"), flags=FINAL)
            return
        if key is None:
            sender.send(self.io.error(pb_utils, self.ownership.NO_KEY_MESSAGE), flags=FINAL)
            return
        for job in self.batcher.jobs():
            if job.request_id == request_id and self.ownership.owns(job.stop_key, key):
                job.cancelled = True
        sender.send(self.io.error(pb_utils, "Request cancelled by client", "CANCELLED"), flags=FINAL)

    def _on_tokens(self, slot: int, new_ids: list[int]) -> bool:
        """Stream the text so far after every step; False stops the sequence (the client is gone)."""
        job = self.batcher.job_in(slot)
        parsed = job.payload
        parsed.generated.extend(new_ids)
        self.metrics.tokens.increment(len(new_ids))
        if job.gone():
            return False
        if parsed.streaming and new_ids:
            try:
                parsed.sender.send(self.io.text_response(pb_utils, self.tokenizer, parsed.generated))
            except Exception:  # the client went away: stop this sequence
                job.cancelled = True
                return False
        return True

    def _finish(self, job: Job) -> None:
        parsed = job.payload
        self.metrics.finished(job)
        if job.error is not None:
            resp = self.io.error(pb_utils, job.error, job.error_code)
        elif job.cancelled or job.result.finish_reason == "cancelled":
            self.metrics.cancelled.increment(1)
            resp = self.io.error(pb_utils, "Request cancelled by client", "CANCELLED")
        else:
            self.capture.finished(parsed.capture, parsed.request, job.result)
            resp = self.io.final_response(pb_utils, self.tokenizer, parsed, job.result)
        with contextlib.suppress(Exception):  # the client is gone; nothing left to free
            parsed.sender.send(resp, flags=FINAL)

    def finalize(self) -> None:
        self.batcher.close()
        self.capture.close()
        self.metrics.close()  # an unloaded version stops exporting its series
