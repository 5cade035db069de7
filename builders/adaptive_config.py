"""The `capture` and `refresh` sections of the build config: the adaptive loop (docs/adaptive.md). Capture makes the
served LLM model record the requests it finished into a bounded store (triton_repo/models/capture.py); refresh
fine-tunes a candidate head on them, gates it and publishes it as the next model version (adaptive/refresh.py). Its
own module: builders/config.py composes the sections, adaptive/ reads them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)


class CaptureConfig(_Strict):
    enabled: bool = Field(
        default=False,
        description="Record every finished request (prompt and output token ids, sampling parameters, per-request "
        "acceptance) into the capture store. Off by default: nothing a client sends is written anywhere unless "
        "this is true. A request opts out with the request parameter `eagle_capture: false`.",
    )
    dir: str | None = Field(
        default=None,
        description="The store's directory (created private to the server's user, mode 0700; files 0600). Unset: "
        "<output_dir>/capture. Relative paths are relative to the config file.",
    )
    max_bytes: int = Field(
        default=256 << 20, ge=1 << 16, le=1 << 40,
        description="Size bound of the store: once the sealed segments exceed it, the oldest are deleted.",
    )
    sample_rate: float = Field(
        default=1.0, gt=0, le=1, description="Fraction of the finished requests recorded (drawn per request).")
    segment_records: int = Field(
        default=64, ge=1, le=1 << 20,
        description="A segment is sealed (renamed into place, readable) after this many records; a crash loses at "
        "most the open segment.",
    )
    segment_seconds: float = Field(
        default=30.0, gt=0, le=86_400, description="... or this long after its first record, whichever comes first.")
    queue_size: int = Field(
        default=1024, ge=1, le=1 << 20,
        description="Records waiting for the writer thread. Serving never waits for the disk: a record that finds "
        "the queue full is dropped and counted in eagle_llm_capture_dropped_total.",
    )


class RefreshConfig(_Strict):
    max_requests: int = Field(
        default=200, ge=4, le=1 << 20,
        description="adaptive/refresh.py uses at most this many captured requests (the newest), train and held-out "
        "together.")
    held_out_fraction: float = Field(
        default=0.2, gt=0, lt=1, description="Share of the captured requests held out (split by request) for early "
        "stopping and the gate.")
    original_share: float = Field(
        default=0.5, ge=0, le=4,
        description="Conversations of the head's original training data (its recipe.yaml `data` section) mixed in "
        "per captured training request, against forgetting. 0 = captured traffic only.",
    )
    epochs: int = Field(
        default=8, ge=1, le=1000,
        description="Passes over the refresh training set the learning-rate schedule decays over (warmup, then "
        "linear to 0 at the last); the fine-tune may stop earlier (patience, train_seconds).")
    train_seconds: float = Field(
        default=420.0, gt=0, le=1e7,
        description="Time budget of the fine-tune (seconds, wall clock): no epoch after the first starts when the "
        "last epoch's duration would take it past this; the best epoch so far is the candidate. A resumed run gets "
        "the budget again.")
    threads: int = Field(
        default=0, ge=0, le=4096,
        description="CPU threads of the refresh (features, fine-tune, gate); 0 = every core this process may use. "
        "A refresh is an offline job: on a machine that also serves, give it fewer.")
    patience: int = Field(
        default=2, ge=1, le=1000,
        description="Stop after this many epochs without a better held-out acceptance (chain tau); the best epoch's "
        "head is the candidate.",
    )
    lr: float = Field(default=6e-4, gt=0, le=1, description="Peak learning rate of the fine-tune (AdamW).")
    batch_size: int = Field(default=4, ge=1, le=4096, description="Sequences per optimizer step.")
    max_seq_len: int = Field(
        default=512, ge=16, le=1 << 17, description="Captured sequences (prompt + output) are cut to this many tokens.")
    gate_max_new_tokens: int = Field(
        default=64, ge=2, le=1 << 16,
        description="Tokens the gate decodes per held-out request (greedy) with each head and the target alone.")
    gate: Literal["replay", "engine"] = Field(
        default="replay",
        description="How the gate measures both heads on the held-out captured requests. replay: from the target's "
        "features the refresh already computed (the captured outputs are the target's greedy outputs, so each "
        "draft tree's accepted length is known without running the target; the same figures as engine when the "
        "features are computed in the engine's dtype), plus gate_engine_requests requests decoded on the engine "
        "(candidate head vs the target alone) for losslessness. engine: every held-out request decoded on the "
        "reference engine with each head and with the target alone (python -m doctor gate; slower).",
    )
    gate_engine_requests: int = Field(
        default=4, ge=1, le=1 << 20,
        description="gate: replay only. Held-out greedy requests decoded on the reference engine with the candidate "
        "head and with the target alone: the candidate is lossless only if the outputs are identical.")
    gate_margin: float = Field(
        default=0.05, ge=0, le=10,
        description="The candidate is publishable only when its tau on the held-out captured requests beats the "
        "current head's by at least this much (and the doctor finds it healthy and lossless).",
    )
    seed: int = Field(default=0, ge=0, le=2**31 - 1, description="Seed of the split, the data order and the fine-tune.")
    keep_versions: int = Field(
        default=3, ge=1, le=1000,
        description="Retention: published versions kept in the model repository besides the build's own version 1 "
        "(the newest; rollback reaches back this far), and retired versions kept under BUILD/refresh/retired/. "
        "Older ones are deleted at each publish.")
    keep_runs: int = Field(
        default=2, ge=1, le=1000,
        description="Retention: refresh run directories kept under BUILD/refresh/ (the newest; their feature shards "
        "are the largest files a refresh writes). Older runs are deleted when a refresh starts and at each publish; "
        "a published head lives on in its version directory.")
    max_group_share: float = Field(
        default=0.1, gt=0, le=1,
        description="Cap on one prompt group's share of the captured training requests: near-duplicate prompts "
        "(the same normalized tokens, or most of their token 4-grams shared) form one group, which is held out or "
        "trained on as a whole, and at most this share of the training requests (at least one) comes from a group.")
    reference_prompts: str | None = Field(
        default=None,
        description="A JSONL file of prompts never captured ({\"prompt\": \"...\"} or {\"prompt_ids\": [...]} per "
        "line; relative paths are relative to the config file) the gate also scores: the candidate must not lose "
        "tau on them. Unset: docker/prompts.jsonl, the prompts shipped with the project.")
    reference_tolerance: float = Field(
        default=0.05, ge=0, le=10,
        description="The candidate passes the reference prompts when its tau there is at least the current head's "
        "minus this (and it is lossless there).")


def capture_rule(cfg: Any) -> list[str]:
    """(a BuildConfig) Capture needs a served model that records requests: the python LLM models of engine.backend
    reference (both layouts) and the current line's llmapi model of engine.backend pytorch (models/llmapi_bridge.py:
    the prompt and the tokens returned; the refresh recomputes the features from the target). The C++ tensorrtllm
    backend runs upstream code we do not change."""
    if not cfg.capture.enabled or cfg.engine.kind.reference_engine or cfg.engine.kind.llmapi_model:
        return []
    return [f"capture.enabled=true with engine.backend={cfg.engine.backend!r}: the served LLM model there is "
            "TensorRT-LLM's C++ backend (it records nothing); serve the current line (trtllm_version 1.4, "
            "engine.backend: pytorch), or set capture.enabled: false (docs/adaptive.md, 'On a GPU')"]
