"""Request and response models of the HTTP API (pydantic), shared by every front end."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, field_validator

MAX_QUESTION_CHARS = 2000
MAX_K = 20


class AskRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="The question, English or Chinese.")
    k: int = Field(default=5, ge=1, le=MAX_K, description="How many passages to return.")
    topic: str | None = Field(default=None, max_length=64, description="Only passages of this topic (e.g. zero, pipeline).")
    source: str | None = Field(default=None, pattern="^(docs|api|config|notes)$", description="Only passages from this source.")
    checked_only: StrictBool = Field(default=False, description="Only return snippets that ran or whose static check passed.")
    stream: StrictBool = Field(default=False, description="Reply as server-sent events: passages, answer deltas, the final reply.")

    @field_validator("k", mode="before")
    @classmethod
    def _whole_number(cls, v: object) -> object:
        """A JSON integer (4 or 4.0), never a boolean or a string."""
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ValueError("Input should be a valid integer")
        if isinstance(v, float):
            if not v.is_integer():
                raise ValueError("Input should be a valid integer")
            return int(v)
        return v

    @field_validator("question")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("question must not be blank")
        return v.strip()


class Passage(BaseModel):
    id: str
    text: str
    path: str
    url: str
    title: str
    heading: str
    score: float
    source: str


class SnippetOut(BaseModel):
    id: str
    language: str
    kind: str
    code: str
    source_url: str
    status: str  # ran | checked | template | fails | not_checked (indexer/snippet_status.py)
    label: str = ""  # the status in words: "ran", "checked", "not checked"...
    reason: str = ""  # the static check's reason
    stamp: str = ""  # what was done to it: the latest real run, or the static check
    requires: list[str] = []  # the notes' requires= tags (gpu, multi-gpu, nvme...)
    chunk_id: str = ""  # the passage the snippet came from


class AskResponse(BaseModel):
    answer: str
    covered: bool
    passages: list[Passage]
    snippets: list[SnippetOut]
    index: dict[str, Any]
    timings_ms: dict[str, float]
    query: str = ""


class DiagnoseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    log: str = Field(min_length=1, max_length=1_000_000, description="A DeepSpeed log or traceback (its tail is read).")
