"""The OpenAI-compatible chat endpoint behind generated answers: one `httpx.Client` for the life of
the service, a whole reply or a stream of deltas, and the citation check a reply must pass.

The endpoint is a third-party service: tests replace it at its HTTP boundary (`httpx.MockTransport`
or a local server). Every failure raises `UpstreamFailed`; the ask core then answers extractively.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import httpx

from app.errors import UpstreamFailed

SYSTEM_PROMPT = (
    "You answer questions about the DeepSpeed training library using only the numbered passages. "
    "Cite every claim with the passage number in brackets, like [2]. Start from the draft answer "
    "when it is right; keep config keys and code names exactly as written. If the passages do not "
    "answer the question, say so. Answer in the language of the question."
)
_CITE = re.compile(r"\[(\d+)\]")


@dataclass(frozen=True)
class Numbered:
    """One passage as the model sees it."""

    n: int
    title: str
    heading: str
    text: str


def messages_for(question: str, draft: str, passages: Sequence[Numbered]) -> list[dict[str, str]]:
    context = "\n\n".join(f"[{p.n}] {p.title} > {p.heading}\n{p.text}" for p in passages)
    user = f"Passages:\n{context}\n\nDraft answer (extracted from the passages):\n{draft}\n\nQuestion: {question}"
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def citation_problem(text: str, numbers: Sequence[int]) -> str:
    """Why a generated answer cannot be shown ('' when it can): it is empty, cites nothing, or cites a
    passage that was not given."""
    if not text.strip():
        return "the endpoint returned an empty answer"
    cited = {int(n) for n in _CITE.findall(text)}
    if not cited:
        return "the generated answer cites no passage"
    unknown = sorted(cited - set(numbers))
    if unknown:
        return f"the generated answer cites passage(s) {unknown} that were not given"
    return ""


class LlmClient:
    """Chat completions against `url` (a base like http://host:8080/v1, or the full path)."""

    def __init__(self, url: str, model: str, *, api_key: str | None = None, timeout_s: float = 20.0,
                 http: httpx.Client | None = None) -> None:
        endpoint = url.rstrip("/")
        self.endpoint = endpoint if endpoint.endswith("/chat/completions") else endpoint + "/chat/completions"
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http if http is not None else httpx.Client(timeout=timeout_s)
        self.http.headers.update(headers)
        self.timeout = httpx.Timeout(timeout_s)

    def close(self) -> None:
        self.http.close()

    def complete(self, messages: list[dict[str, str]]) -> str:
        body = {"model": self.model, "messages": messages, "temperature": 0}
        try:
            resp = self.http.post(self.endpoint, json=body, timeout=self.timeout)
            resp.raise_for_status()
            text = resp.json()["choices"][0]["message"]["content"]
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamFailed(f"LLM endpoint failed: {exc}") from exc
        if not isinstance(text, str):
            raise UpstreamFailed("LLM endpoint returned no text")
        return text.strip()

    def stream(self, messages: list[dict[str, str]]) -> Iterator[str]:
        """The reply's text deltas as the endpoint sends them (its own server-sent events)."""
        body = {"model": self.model, "messages": messages, "temperature": 0, "stream": True}
        try:
            with self.http.stream("POST", self.endpoint, json=body, timeout=self.timeout) as resp:
                resp.raise_for_status()
                for line in resp.iter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        return
                    delta = json.loads(data)["choices"][0].get("delta", {}).get("content")
                    if delta:
                        yield delta
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            raise UpstreamFailed(f"LLM endpoint failed: {exc}") from exc
