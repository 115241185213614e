"""Fetch DeepSpeed's docs: download the repository tarball for a ref and keep only the docs.

httpx streaming with a progress bar, a timeout, retries with backoff, a size and sha256 check, and
a cache folder that only ever holds complete downloads and complete extractions (temp + rename).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx
from tqdm import tqdm

from app.errors import SourceUnavailable

CURRENT = "CURRENT"


class FetchError(SourceUnavailable):
    """The docs could not be fetched or the download is not what it should be."""


@dataclass(frozen=True)
class FetchResult:
    ref: str
    docs_dir: Path
    sha256: str
    bytes: int
    from_cache: bool


def _keep(member: PurePosixPath) -> bool:
    """Inside the tarball's top folder: docs/, blogs/**/README.md and the top README.md."""
    parts = member.parts[1:]
    if not parts:
        return False
    if parts[0] == "docs":
        return True
    if parts[0] == "blogs" and parts[-1] == "README.md":
        return True
    return parts == ("README.md",) or parts == ("LICENSE",)


def _download(url: str, dest: Path, *, timeout_s: float, retries: int, progress: bool) -> tuple[str, int]:
    last: Exception | None = None
    for attempt in range(1, retries + 1):
        part = dest.with_name(dest.name + ".part")
        try:
            h = hashlib.sha256()
            size = 0
            with httpx.stream("GET", url, timeout=timeout_s, follow_redirects=True) as resp:
                if resp.status_code == 404:
                    raise FetchError(f"{url} was not found (404): is the ref right?")
                resp.raise_for_status()
                expected = int(resp.headers.get("content-length", 0)) or None
                with part.open("wb") as f, tqdm(total=expected, unit="B", unit_scale=True, desc="docs tarball", disable=not progress) as bar:
                    for block in resp.iter_bytes(1 << 16):
                        f.write(block)
                        h.update(block)
                        size += len(block)
                        bar.update(len(block))
            if expected is not None and size != expected:
                raise FetchError(f"download cut short: {size} of {expected} bytes")
            os.replace(part, dest)
            return h.hexdigest(), size
        except FetchError:
            part.unlink(missing_ok=True)
            raise
        except (httpx.HTTPError, OSError) as exc:
            part.unlink(missing_ok=True)
            last = exc
            if attempt < retries:
                time.sleep(min(2 ** (attempt - 1), 8) * 0.5)
    raise FetchError(f"could not download {url} after {retries} tries: {last}")


def _extract_docs(tarball: Path, dest: Path) -> int:
    """Extract the kept members into a temp folder beside dest, then rename it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.extracting-", dir=dest.parent))
    count = 0
    try:
        with tarfile.open(tarball, "r:*") as tar:
            for member in tar:
                name = PurePosixPath(member.name)
                if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                    continue
                if not _keep(name) or member.isdir():
                    continue
                target = tmp.joinpath(*name.parts[1:])
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                if src is None:
                    continue
                with src, target.open("wb") as out:
                    shutil.copyfileobj(src, out)
                count += 1
        if not (tmp / "docs").is_dir():
            raise FetchError(f"{tarball.name} has no docs/ folder: not a DeepSpeed source tarball")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except (tarfile.TarError, EOFError, OSError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise FetchError(f"{tarball.name} is not a readable tarball: {exc}") from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return count


def fetch_docs(
    cache_dir: Path,
    ref: str,
    url_template: str,
    *,
    sha256: str | None = None,
    timeout_s: float = 30.0,
    retries: int = 3,
    progress: bool = True,
    force: bool = False,
) -> FetchResult:
    """Download (or reuse) the docs for `ref` and make them the default docs dir."""
    docs_root = cache_dir / "docs"
    dest = docs_root / ref
    meta_file = docs_root / f"{ref}.json"
    if dest.is_dir() and meta_file.is_file() and not force:
        meta = json.loads(meta_file.read_text())
        if sha256 is None or meta.get("sha256") == sha256:
            _set_current(docs_root, ref)
            return FetchResult(ref, dest, meta["sha256"], meta["bytes"], from_cache=True)
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    tarball = downloads / f"deepspeed-{ref}.tar.gz"
    url = url_template.format(ref=ref)
    digest, size = _download(url, tarball, timeout_s=timeout_s, retries=retries, progress=progress)
    if sha256 is not None and digest != sha256.lower():
        tarball.unlink(missing_ok=True)
        raise FetchError(f"checksum mismatch for {url}: got {digest}, expected {sha256}")
    _extract_docs(tarball, dest)
    tmp_meta = meta_file.with_suffix(".json.tmp")
    tmp_meta.write_text(json.dumps({"ref": ref, "url": url, "sha256": digest, "bytes": size}))
    os.replace(tmp_meta, meta_file)
    _set_current(docs_root, ref)
    return FetchResult(ref, dest, digest, size, from_cache=False)


def _set_current(docs_root: Path, ref: str) -> None:
    tmp = docs_root / f".{CURRENT}.tmp"
    tmp.write_text(ref)
    os.replace(tmp, docs_root / CURRENT)


def current_docs_dir(cache_dir: Path) -> Path | None:
    """The fetched docs that `dsqa corpus fetch` made the default, if any."""
    marker = cache_dir / "docs" / CURRENT
    if not marker.is_file():
        return None
    path = cache_dir / "docs" / marker.read_text().strip()
    return path if (path / "docs").is_dir() else None
