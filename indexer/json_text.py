"""The brackets of a JSON-like text outside its strings: the one scanner behind the API's nesting
limit (app/input_policy.py) and the repair of a config that stops before closing what it opened
(indexer/snippet_check.py)."""

from __future__ import annotations

from collections.abc import Iterator


def brackets(text: str) -> Iterator[str]:
    """Each `{ } [ ]` of the text in order, those inside double-quoted strings (escapes honoured) left out."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{}[]":
            yield ch
