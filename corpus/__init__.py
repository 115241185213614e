"""Our own knowledge: best-practice notes and the Chinese-English glossary (data files)."""

from pathlib import Path

CORPUS_DIR = Path(__file__).resolve().parent
NOTES_DIR = CORPUS_DIR / "notes"
GLOSSARY_ZH = CORPUS_DIR / "glossary_zh.tsv"
