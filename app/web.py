"""The web page at `/`: ask, read the cited passages and checked snippets, validate a config.

Static files only (app/static/: HTML, CSS, JS, no external CDN); the page calls `POST /ask`,
`POST /validate-config` and `GET /readyz` of the same service.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).resolve().parent / "static"


def mount_web(app: FastAPI) -> None:
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")
