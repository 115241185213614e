"""Query expansion for Chinese questions through a bilingual glossary of DeepSpeed terms.

The docs are English and no multilingual model loads offline, so a Chinese question is rewritten
into English search terms: every glossary term found in it (longest match first) adds its English
expansion, and the identifiers already written in Latin script (ZeRO-3, PipelineModule) are kept.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_CJK = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
_LATIN_RUN = re.compile(r"[A-Za-z0-9_.\-/+]+(?:\s+[A-Za-z0-9_.\-/+]+)*")


def has_cjk(text: str) -> bool:
    return bool(_CJK.search(text))


@dataclass(frozen=True)
class Glossary:
    terms: dict[str, str]  # Chinese term -> English expansion

    @classmethod
    def load(cls, path: Path | None) -> Glossary:
        terms: dict[str, str] = {}
        if path is None or not path.is_file():
            return cls(terms)
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip() or line.lstrip().startswith("#") or "\t" not in line:
                continue
            zh, en = line.split("\t", 1)
            zh, en = zh.strip(), en.strip()
            if zh and en:
                terms[zh] = f"{terms[zh]} {en}" if zh in terms else en
        return cls(terms)

    def matches(self, text: str) -> list[str]:
        """Glossary terms found in text, longest first, without overlaps."""
        found: list[str] = []
        taken = [False] * len(text)
        for term in sorted(self.terms, key=len, reverse=True):
            start = text.find(term)
            while start != -1:
                span = range(start, start + len(term))
                if not any(taken[i] for i in span):
                    for i in span:
                        taken[i] = True
                    found.append(term)
                start = text.find(term, start + 1)
        return found

    def expand(self, question: str) -> str:
        """English search text for a question; questions without CJK come back unchanged."""
        if not has_cjk(question):
            return question
        latin = " ".join(m.group(0) for m in _LATIN_RUN.finditer(question))
        english = " ".join(dict.fromkeys(self.terms[t] for t in self.matches(question)))
        return f"{latin} {english}".strip()
