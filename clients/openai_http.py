"""The load tester's client of an OpenAI-compatible HTTP endpoint (an NVIDIA Dynamo frontend, `trtllm-serve`, vLLM,
...): `POST {base}/completions` or, with --chat, `POST {base}/chat/completions` (the server applies the chat
template), streamed as server-sent events with `stream: true`.

The same exchange as the gRPC client (`prepare` a request once per prompt, `complete` it with its GenerationStats
filled), so the load generator (clients/load.py) and the reports are shared. Output tokens are the server's own count:
the request asks for `stream_options: {"include_usage": true}` and the usage's `completion_tokens` is taken (without
it, the client's --tokenizer counts the text). TTFT is the arrival of the first chunk that carries text.

A cancelled request or one past its deadline closes its connection, which is how an OpenAI server learns that a
client went away. Failures carry a countable status: UNAVAILABLE (refused / connection lost), DEADLINE_EXCEEDED,
HTTP_<code> (the server refused the request) or SERVER_ERROR (an error event inside the stream)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp

from clients.request import GenerationStats, note_response
from clients.transport import DEFAULT_TIMEOUT_S, GenerationError

CONNECT_TIMEOUT_S = 30.0
EXAMPLE_URL = "http://127.0.0.1:8000/v1"


class OpenAIError(ValueError):
    """The endpoint cannot be load-tested as given (unreachable, not an OpenAI API, unknown model): say what to do."""


@dataclass(frozen=True)
class OpenAIRequest:
    """A ready-to-send request: its path under the base URL and its JSON body (resent as is, also concurrently)."""

    path: str
    body: dict[str, Any]
    stream: bool


def check_url(url: str) -> str:
    """The base URL without a trailing slash; refuses what cannot be one."""
    if not url.startswith(("http://", "https://")):
        raise OpenAIError(f"--openai-url {url!r}: expected the API's base URL, e.g. {EXAMPLE_URL}")
    return url.rstrip("/")


async def served_models(session: aiohttp.ClientSession, base: str) -> list[str]:
    """The model ids `GET {base}/models` lists; OpenAIError when the server cannot be reached or is no OpenAI API."""
    try:
        async with session.get(f"{base}/models", timeout=aiohttp.ClientTimeout(total=CONNECT_TIMEOUT_S)) as r:
            text = await r.text()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        raise OpenAIError(f"--openai-url {base}: cannot reach the server ({type(e).__name__}: {e}); start it, or "
                          f"pass the base URL it prints, e.g. {EXAMPLE_URL}") from e
    try:
        data = json.loads(text)["data"] if status == 200 else None
        models = [str(m["id"]) for m in data] if isinstance(data, list) else None
    except (ValueError, KeyError, TypeError):
        models = None
    if models is None:
        raise OpenAIError(f"--openai-url {base}: GET {base}/models answered HTTP {status} {text[:120]!r}, not an "
                          f"OpenAI model list; pass the base URL of an OpenAI-compatible API (it ends in /v1, e.g. "
                          f"{EXAMPLE_URL}), or --url host:port for a Triton gRPC endpoint")
    return models


def pick_model(base: str, models: list[str], wanted: str | None) -> str:
    if wanted is not None and wanted in models:
        return wanted
    if wanted is None and len(models) == 1:
        return models[0]
    listed = ", ".join(models) or "none"
    if wanted is not None:
        raise OpenAIError(f"--model {wanted!r}: {base} serves no such model (it serves: {listed}); pass one of them")
    raise OpenAIError(f"{base} serves {len(models)} models ({listed}): pass --model NAME")


class UsageCounter:
    """Output tokens as the server counted them (`usage.completion_tokens`); used only when a response had none."""

    name = "server usage (completion_tokens)"

    def count(self, text: str) -> int:
        raise GenerationError("NO_USAGE", "the server reported no usage.completion_tokens; pass --tokenizer DIR "
                                          "(the target's Hugging Face directory) to count output tokens")


class OpenAIClient:
    """asyncio client: one HTTP connection pool, any number of requests in flight (no client-side limit)."""

    def __init__(self, base: str, model: str, *, chat: bool, timeout_s: float, session: aiohttp.ClientSession) -> None:
        self.url, self.model, self.chat, self.timeout_s = base, model, chat, timeout_s
        self._session = session

    @classmethod
    async def connect(cls, url: str, model: str | None, *, chat: bool,
                      timeout_s: float = DEFAULT_TIMEOUT_S) -> OpenAIClient:
        base = check_url(url)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        try:
            name = pick_model(base, await served_models(session, base), model)
        except BaseException:
            await session.close()
            raise
        return cls(base, name, chat=chat, timeout_s=timeout_s, session=session)

    def prepare(self, prompt: str, max_tokens: int, *, stream: bool, **sampling: Any) -> OpenAIRequest:
        if max_tokens < 1:
            raise ValueError(f"max_tokens={max_tokens}: must be >= 1")
        body: dict[str, Any] = {"model": self.model, "max_tokens": max_tokens, "stream": stream, **sampling}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.chat:
            body["messages"] = [{"role": "user", "content": prompt}]
            return OpenAIRequest("/chat/completions", body, stream)
        body["prompt"] = prompt
        return OpenAIRequest("/completions", body, stream)

    async def complete(self, req: OpenAIRequest, stats: GenerationStats) -> str:
        """Send `req` and return its whole text; fills `stats` (arrivals, end, the server's output token count)."""
        pieces: list[str] = []
        try:
            async with asyncio.timeout(stats.start + self.timeout_s - time.perf_counter()):
                async with self._session.post(self.url + req.path, json=req.body) as r:
                    if r.status != 200:
                        raise GenerationError(f"HTTP_{r.status}", (await r.text())[:500])
                    if req.stream:
                        async for line in r.content:
                            self._event(line, pieces, stats)
                    else:
                        self._payload(await r.json(content_type=None), pieces, stats, time.perf_counter())
        except TimeoutError as e:
            raise GenerationError("DEADLINE_EXCEEDED", "no complete response before the client deadline") from e
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
            raise GenerationError("UNAVAILABLE", f"{type(e).__name__}: {e}") from e
        if stats.responses == 0 and stats.output_tokens is None:
            raise GenerationError("NO_RESPONSE", "the server ended the response without text or usage")
        stats.end = time.perf_counter()
        return "".join(pieces)

    def _event(self, raw: bytes, pieces: list[str], stats: GenerationStats) -> None:
        line = raw.decode("utf-8", errors="replace").strip()
        if not line.startswith("data:"):
            return  # blank separators, `event:` and comment lines
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        try:
            payload = json.loads(data)
        except ValueError as e:
            raise GenerationError("SERVER_ERROR", f"not a JSON event: {data[:200]!r}") from e
        self._payload(payload, pieces, stats, time.perf_counter())

    @staticmethod
    def _payload(payload: Any, pieces: list[str], stats: GenerationStats, now: float) -> None:
        """One chunk (streamed) or the whole response: its text, and the usage when it carries one."""
        if not isinstance(payload, dict) or "error" in payload:
            raise GenerationError("SERVER_ERROR", json.dumps(payload)[:500])
        for choice in payload.get("choices") or ():
            text = choice.get("text") or (choice.get("delta") or choice.get("message") or {}).get("content") or ""
            if text:
                note_response(stats, now)
                pieces.append(text)
        usage = payload.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            stats.output_tokens = usage["completion_tokens"]

    async def close(self) -> None:
        await self._session.close()
