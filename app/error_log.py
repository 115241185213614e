"""Reading a pasted log: its bounded tail cleaned (ANSI colours, `[rank3]:` prefixes, a Chinese locale's
shell messages), the error it ends with, the versions it names, and a traceback cut off inside deepspeed.

The last exception line is the error; a message may run on a few lines. With none, the last exception the
text quotes in prose, else the last line that says something failed. Pure functions over text.
"""

from __future__ import annotations

import re
from functools import lru_cache

MAX_LOG_CHARS = 200_000  # the tail that is read; errors are at the end of a log
MAX_MESSAGE_CHARS = 2_000  # of the error message matched against the catalogue
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RANK = re.compile(r"^\s*\[(?:rank|Rank)\s*\d+\]:?\s?", re.M)
_EXC_LINE = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*(?:[A-Za-z_]\w*(?:Error|Exception|Exit|Warning)|Exception)|AssertionError)(?::\s?(.*))?$")
# an exception written inside prose or a chat message ("... get the `RuntimeError: Unable to ...` error")
# (a match starts where a name starts: from inside a long run of letters each start re-read the run, and a
# 200 kB line without spaces took 270 s)
_INLINE_EXC = re.compile(r"(?<![\w.])((?:[A-Za-z_]\w*\.)*(?:[A-Za-z_]\w*(?:Error|Exception)|Exception)):[ \t]+([^`\n]{8,})")
# a line that says something failed, for a log with no exception line: the last such line is its error
_FAILURE_LINE = re.compile(r"\b(?:error|failed|fatal|cannot|can't|unable|not found|no such file|not supported|mismatch|undefined symbol|"
                           r"segmentation fault|killed|abort(?:ed|s)?|exits with return code|timed? ?out|未找到|错误|失败)\b", re.I)
_NOT_A_FAILURE = re.compile(r"\[(?:INFO|WARNING|WARN|DEBUG)\]|^\s*#")
# what a log shows after its error that is not one: progress bars, traceback frames and their code lines
_NOT_AN_ERROR = re.compile(r"^\s*(?:\d+%\||File \"|Traceback \(most recent|[│╰╭❱])|^\s{4}")
# a traceback frame inside the deepspeed package, and the source line under it
_DS_FRAME = re.compile(r'^\s*File "[^"]*?/(deepspeed/[^"]+\.py)", line \d+, in (\w+)\s*$')
_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_VERSION = {"deepspeed": re.compile(r"deepspeed(?:\s+version)?[\s:=v(]+(\d+\.\d+\.\d+)", re.I),
            "torch": re.compile(r"torch(?:\s+version)?[\s:=v(]+(\d+\.\d+(?:\.\d+)?)", re.I)}
# the shell's and the C library's own messages as a Chinese-locale machine prints them (glibc's and
# bash's zh_CN translations), in English: the catalogue and the known causes are written in English
_LOCALISED = {
    "未找到命令": "command not found", "没有那个文件或目录": "No such file or directory", "权限不够": "Permission denied",
    "段错误": "Segmentation fault", "已杀死": "Killed", "地址已在使用": "Address already in use",
    "连接被拒绝": "Connection refused", "设备上没有空间": "No space left on device", "无法分配内存": "Cannot allocate memory",
    "连接超时": "Connection timed out", "没有到主机的路由": "No route to host", "核心已转储": "core dumped",
    "未预期的符号": "syntax error near unexpected token ", "附近有语法错误": "",
    "无法打开输入文件": "cannot open input file ",
}
_LOCALISED_RE = re.compile("|".join(map(re.escape, _LOCALISED)))


def clean_log(log: str) -> str:
    """The log's bounded tail without ANSI colours and `[rank3]:` prefixes, with the shell's and the C
    library's Chinese-locale messages in English."""
    return _clean_tail(log[-MAX_LOG_CHARS:])


@lru_cache(maxsize=8)  # an error question is read by the pasted-error rules and then by the doctor: cleaned once
def _clean_tail(tail: str) -> str:
    text = _RANK.sub("", _ANSI.sub("", tail))
    return _without_echoes(_LOCALISED_RE.sub(lambda m: _LOCALISED[m.group(0)], text))


def _without_echoes(text: str) -> str:
    """The text without the tracebacks Python prints under "Exception ignored in:" (a destructor's, such as a
    half-built DeepSpeedEngine's `__del__` after `deepspeed.initialize` failed: an echo of the error before it),
    unless no other exception line is left."""
    if "Exception ignored in" not in text:
        return text
    lines = text.splitlines()
    echo: set[int] = set()
    for end, line in enumerate(lines):
        if _exception_line(line) and (start := _echo_start(lines, end)) is not None:
            echo.update(range(start, end + 1))
    kept = [ln for i, ln in enumerate(lines) if i not in echo]
    return "\n".join(kept) if any(_exception_line(ln) for ln in kept) else text


def _echo_start(lines: list[str], end: int) -> int | None:
    """Where the "Exception ignored in" block that exception line `end` closes starts, or None."""
    i = end - 1
    while i >= 0 and (lines[i].startswith((" ", "\t")) or not lines[i].strip()):
        i -= 1  # the frames and their source lines
    if i >= 0 and lines[i].startswith("Traceback (most recent"):
        i -= 1
    return i if i >= 0 and lines[i].startswith("Exception ignored in") else None


def _exception_line(line: str) -> re.Match[str] | None:
    """The exception line's match (its type and message), or None: also for a traceback frame or its indented source."""
    return None if line.startswith(("  File ", "    ")) else _EXC_LINE.match(line)


def extract_error(log: str) -> tuple[str, str]:
    """(exception type, message) of the error a log ends with, as `diagnose` reads it (without diagnosing):
    the last exception line, whose message may run on a few lines."""
    return last_error(clean_log(log))


def without_traceback(log: str) -> str:
    """A pasted text without its traceback's machinery: the "Traceback" header, the frames and their source lines,
    progress bars (what is left: the error line and the words written around it)."""
    return "\n".join(ln for ln in clean_log(log).splitlines() if not _NOT_AN_ERROR.match(ln))


def last_error(text: str) -> tuple[str, str]:
    lines = text.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if m := _exception_line(lines[i]):
            message = (m.group(2) or "").strip()
            more = []  # the message's own further lines: up to a blank line, an indented code line or a frame
            for ln in lines[i + 1:i + 4]:
                if not ln.strip() or ln.lstrip().startswith("[") or _NOT_AN_ERROR.match(ln):
                    break
                more.append(ln.strip())
            return m.group(1).rsplit(".", 1)[-1], " ".join([message, *more]).strip()[:MAX_MESSAGE_CHARS]
    inline = list(_INLINE_EXC.finditer(text))
    if inline:  # no exception line of its own: the last one the text quotes
        m = inline[-1]
        return m.group(1).rsplit(".", 1)[-1], m.group(2).strip().rstrip("'\"")[:MAX_MESSAGE_CHARS]
    tail = [ln.strip() for ln in lines if ln.strip() and ln.isprintable() and not _NOT_AN_ERROR.match(ln)]
    tail = tail or [ln.strip() for ln in lines if ln.strip() and ln.isprintable()]
    # the last line saying something failed (not a logged warning, a comment or a bare label), else the last line
    failing = [ln for ln in tail if _FAILURE_LINE.search(ln) and not _NOT_A_FAILURE.search(ln) and len(ln.split()) > 2]
    return "", ((failing or tail)[-1][:MAX_MESSAGE_CHARS] if tail else "")


def prose_lines(text: str, n: int = 3) -> str:
    """The first `n` lines the writer put around the error (a comment, the set-up, the command run): not indented,
    not traceback frames or their header, not timestamped or bracketed log records."""
    prose = [ln.strip().lstrip("#").strip() for ln in text.splitlines()
             if ln.strip() and not ln.startswith((" ", "\t", "File ", "Traceback", "["))]
    return " ".join(prose[:n])


def deepspeed_frames(text: str) -> list[tuple[str, str]]:
    """The (file, function) of each traceback frame inside the deepspeed package, in the log's order."""
    return [(m.group(1), m.group(2)) for ln in text.splitlines() if (m := _DS_FRAME.match(ln))]


def cut_off_frame(text: str) -> tuple[str, str, str] | None:
    """A traceback pasted without its exception line, ending in a frame of deepspeed: (the frame's file,
    its function, the function its last line calls, '' when none); None for any other text."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    for back in (1, 2):  # the frame line, then (usually) its source line
        if len(lines) >= back and (m := _DS_FRAME.match(lines[-back])):
            calls = _CALL.findall(lines[-1]) if back == 2 else []
            return m.group(1), m.group(2), calls[-1] if calls else ""
    return None


def versions_in(log: str) -> dict[str, str]:
    found = {}
    for name, pattern in _VERSION.items():
        m = pattern.search(log[-MAX_LOG_CHARS:])
        if m:
            found[name] = m.group(1)
    return found
