"""Triton python model `tensorrt_llm` for engine.backend=reference: the tensorrt_llm model's I/O (contract.py
LLM_INPUTS / LLM_OUTPUTS) over this project's reference engine (`engines.api.ReferenceEngine.from_build`).

Decoupled (triton.streaming=true): every accepted chunk is sent as it comes (`output_ids` [1, 1, n]), then a final
response carrying the perf metrics when asked. Not decoupled: one response per request with the prompt + generated
ids (unless exclude_input_in_output), as the tensorrtllm backend does. Requests are batched in flight by
triton_repo/models/batcher.py over one engine session (engines.runtime.Session): a new request joins the running
batch at the next step, a finished or cancelled one leaves it. `output_ids` end with the end_id token when
generation stopped on it (the postprocessing model drops special tokens). A sequence leaves the batch at the next
step when its client cancels (called directly or through the BLS model) or when tensorrtllm_backend's `stop` request
names its request id (how clients cancel an ensemble request: docs/triton.md, "Cancellation").
"""


from __future__ import annotations

import secrets
import time
from typing import Any, TYPE_CHECKING

import triton_python_backend_utils as pb_utils
from eagle_bootstrap import project_on_path  # rendered next to this file (models/bootstrap.py)

if TYPE_CHECKING:
    from triton_repo.models.batcher import Job

    Sender = pb_utils.InferenceResponseSender

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        project_on_path(args)
        from pathlib import Path

        from triton_repo import contract
        from triton_repo.models.common import draft_depth
        from triton_repo.models import (batcher, capture, common, guard, llm_io, ownership, spec_metrics,
                                         step_profile, versions)

        self.C, self.common, self.io, self.batcher_mod, self.ownership = contract, common, llm_io, batcher, ownership
        p = common.Params.of(args)
        self.decoupled = p.bool("decoupled")
        self.guard, self.key = guard, guard.load_key(p.bool("internal_guard"), args["model_name"])
        self.refusal = guard.refusal(args["model_name"], p.str("entry_models"))
        # perf outputs (running totals + arrival_time_ns) on every response, as the C++ backend writes them: the
        # repository is wired like the engine flow, postprocessing counts them (models/perf_bridge.py)
        self.perf_every_response = p.bool("perf_every_response")
        # a secret per request on every streamed response, for postprocessing's stop relay (models/stop_relay.py)
        self.handles = llm_io.declares_handle(args)
        self.engine = versions.engine_for(args, Path(p.path("build_dir")))  # this version's head (models/versions.py)
        # The build's limits come from the engine's own spec (reference.json), the one source; the Triton stage
        # checked at build time that config.pbtxt's max_batch_size agrees with it.
        self.limits, self.vocab_size = self.engine.limits, self.engine.vocab_size
        self.tokenizer = self.engine.tokenizer
        self.metrics = spec_metrics.SpecMetrics(
            pb_utils, args["model_name"], p.str("llm_kind"), draft_depth(self.engine),
            self.engine.has_draft, spec_metrics.baseline_for(args), str(args.get("model_version", "")))
        self.capture = capture.Hook.of(pb_utils, args, p.str("llm_kind"))  # opt-in store (models/capture.py)
        # One session for the model's lifetime: its caches are allocated once for max_batch_size sequences of up to
        # max_seq_len tokens; slots are reused as requests come and go.
        profile = step_profile.for_llm_model(args["model_name"])  # $EAGLE_DEPLOY_STEP_PROFILE (off: None)
        self.session = session = self.engine.session(
            self.limits.max_batch_size, self.limits.max_seq_len, speculative=p.bool("speculative"),
            on_tokens=self._on_tokens if profile is None else profile.timed_send(self._on_tokens))
        if profile is not None:
            session.laps = profile.laps
        self.batcher = batcher.Batcher(
            session, lambda job: job.payload[0].request, self._finish, max_queue_size=p.int("max_queue_size"),
            deadline_s=float(p.str("request_deadline_s")), on_count=self.metrics.counts, profile=profile,
        )

    # ---- requests in ------------------------------------------------------------------------------------------
    def execute(self, requests: list[pb_utils.InferenceRequest]) -> list[pb_utils.InferenceResponse | None] | None:
        jobs: list[Job] = []
        # (sender when decoupled, the error response or None, the admitted job or None)
        replies: list[tuple[Sender | None, pb_utils.InferenceResponse | None, Job | None]] = []
        for r in requests:
            sender = r.get_response_sender() if self.decoupled else None
            try:
                if problem := self.ownership.problem(r):  # an id or stop_key too long: nothing is kept of it
                    raise self.common.RequestError(problem)
                # A stop reaches only the requests sent with its id and stop_key (_stop_job): our clients send it
                # themselves to cancel a non-streaming ensemble request, so it needs no internal secret.
                if self.io.is_stop_request(pb_utils, r):
                    replies.append((sender, self._stop_job(r.request_id(), self.ownership.stop_key(r)), None))
                    continue
                if self.key is not None and not self.guard.allowed(pb_utils, r, self.key):
                    raise self.common.RequestError(self.refusal)
                parsed = self.io.parse_request(
                    pb_utils, r, self.limits, self.vocab_size, self.tokenizer, self.decoupled
                )
            except self.common.RequestError as e:
                replies.append((sender, self.common.error_response(pb_utils, str(e), e.code), None))
                continue
            except Exception as e:  # an input no check anticipated: refused without a traceback
                replies.append((sender, self.common.error_response(pb_utils, self.common.unexpected(e)), None))
                continue
            parsed.capture = self.capture.wanted(r)
            if self.perf_every_response:
                parsed.arrival_ns = time.monotonic_ns()  # upstream's arrivalTime is a steady-clock time too
            # Decoupled: the request object is done once execute() returns; its sender keeps the cancel flag.
            cancelled = sender.is_cancelled if sender is not None else r.is_cancelled
            job = self.batcher_mod.Job(payload=(parsed, sender), is_cancelled=cancelled, streaming=parsed.streaming)
            if r.request_id():
                job.request_id = r.request_id()
            # the client's stop_key, or one made here when the config wires the handle: postprocessing presents it to
            # stop this request when its streaming client goes away (models/stop_relay.py)
            job.stop_key = self.ownership.stop_key(r) or (secrets.token_hex(16) if self.handles else None)
            refusal = self.batcher.admit(job)
            if refusal is not None:
                self.metrics.refused.increment(1)
                replies.append((sender, self.common.error_response(pb_utils, refusal, self.C.UNAVAILABLE), None))
            else:
                replies.append((sender, None, job))
                jobs.append(job)
        if self.decoupled:
            for sender, err, _job in replies:
                if err is not None and sender is not None:
                    sender.send(err, flags=FINAL)
            return None
        out: list[pb_utils.InferenceResponse | None] = []
        for _sender, err, admitted in replies:
            if admitted is None:  # refused: its error response
                out.append(err)
                continue
            admitted.done.wait()
            out.append(admitted.result)
        return out

    def _stop_job(self, request_id: str, key: str | None) -> pb_utils.InferenceResponse:
        """tensorrtllm_backend's stop request, reaching only the requests sent with this id and this stop_key
        (models/ownership.py); the same empty answer whether such a request was running or not."""
        if key is None:
            return self.common.error_response(pb_utils, self.ownership.NO_KEY_MESSAGE)
        for job in self.batcher.jobs():
            if job.request_id == request_id and self.ownership.owns(job.stop_key, key):
                job.cancelled = True
        return pb_utils.InferenceResponse(output_tensors=[])

    # ---- worker thread ----------------------------------------------------------------------------------------
    def _on_tokens(self, slot: int, new_ids: list[int]) -> bool:
        """Stream one step's accepted tokens; False stops the sequence (the client cancelled or is gone)."""
        job = self.batcher.job_in(slot)
        parsed, sender = job.payload
        self.metrics.tokens.increment(len(new_ids))
        if job.gone():
            return False
        if parsed.streaming and new_ids:
            tensors = self.io.ids_tensors(pb_utils, new_ids, job.stop_key if self.handles else None)
            if parsed.arrival_ns is not None and parsed.perf:
                st = self.session.slot(slot).stats  # this step already counted (engines/session.py)
                tensors += self.io.perf_tensors(pb_utils, st.accepted_draft_tokens, st.draft_tokens, parsed.arrival_ns)
            try:
                sender.send(pb_utils.InferenceResponse(output_tensors=tensors))
            except Exception:  # the client went away: stop this sequence
                job.cancelled = True
                return False
        return True

    def _finish(self, job: Job) -> None:
        parsed, sender = job.payload
        self.metrics.finished(job)
        if job.error is not None:
            resp = self.common.error_response(pb_utils, job.error, job.error_code)
        elif job.cancelled or (job.result is not None and job.result.finish_reason == "cancelled"):
            self.metrics.cancelled.increment(1)
            # A bare FINAL flag: an error response with code CANCELLED left the caller's (BLS) stub unable to
            # unload in python backend 24.10.
            resp = None if self.decoupled else self.common.error_response(pb_utils, "request cancelled", "CANCELLED")
        else:
            st = job.result.stats
            self.capture.finished(parsed.capture, parsed.request, job.result)
            resp = self.io.final_response(pb_utils, parsed, job.result.output_ids, st.accepted_draft_tokens,
                                          st.draft_tokens)
        if not self.decoupled:
            job.result = resp  # execute() returns it
            return
        try:
            if resp is None:
                sender.send(flags=FINAL)
            elif job.error is not None and job.request_id.startswith(self.C.BLS_REQUEST_ID_PREFIX):
                # To the BLS model: the error, then a bare FINAL. An error response carrying the FINAL flag, sent
                # from this thread after streamed chunks, never reached its response iterator (python backend 24.10:
                # it waited forever). The ensemble needs them together: sent apart, the ensemble request stayed in
                # flight and the server could not stop.
                sender.send(resp)
                sender.send(flags=FINAL)
            else:
                sender.send(resp, flags=FINAL)
        except Exception:
            pass  # the client is gone; nothing left to free

    def finalize(self) -> None:
        self.batcher.close()
        self.capture.close()
        self.metrics.close()  # an unloaded version stops exporting its series
