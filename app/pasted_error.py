"""How a question quotes an error: whether it is little but the message, a pasted log, or a message with nothing
asked beside it but its cause or fix. Pure reading of the text; `app/coverage_overrides.py` decides what such a
question is answered with.
"""

from __future__ import annotations

import re

from app.error_log import extract_error, without_traceback

# a question that is little but the message ("I get ValueError: <message>"): the message holds this share of its words
PASTED_SHARE = 0.6


def asks(question: str) -> bool:
    """Whether a question has a question mark (a pasted message or log has none)."""
    return _ASKS.search(question) is not None


_ASKS = re.compile(r"[?？]")


def asks_only_for_a_fix(question: str) -> bool:
    """Whether the words beside the error message a question quotes ask for nothing but its cause or fix ("How do I
    fix this?", "... when I run my script, why?", "怎么解决"): at most FIX_OTHER_WORDS words outside FIX_WORDS."""
    own = without_traceback(question)
    exception, message = extract_error(question)
    if (trailing := _TRAILING_ASK.search(message)) is not None:  # a message read to its line's end takes the ask with it
        message = message[:trailing.start()]
    if not message or len(message) >= len(own.strip()):
        return False  # no message, or nothing beside it
    beside = own.replace(message, " ")
    if exception:  # its class is part of the message, not of what is asked
        beside = re.sub(rf"[\w.]*{re.escape(exception)}:?", " ", beside)
    if not _WORD.search(beside):
        return False  # nothing is asked beside the message
    for phrase in _FIX_PHRASES_ZH:
        beside = beside.replace(phrase, " ")
    return sum(w not in FIX_WORDS for w in _WORD.findall(beside.lower())) <= FIX_OTHER_WORDS


FIX_OTHER_WORDS = 1
_WORD = re.compile(r"[A-Za-z']+|[\u3400-\u9fff]")
_TRAILING_ASK = re.compile(r"(?:[.,;!]\s*|\s+(?=[\u3400-\u9fff]))[^.,;!?？]*[?？]\s*$")
FIX_WORDS = frozenset(
    "how do does did i i'm we can could should would to fix fixing solve solved resolve this it that error errors issue "
    "problem why what whats what's mean means meaning any idea ideas help please happen happens happened happening get "
    "gets got getting see seeing saw when run running ran my our the a an is are was am script code training train job "
    "with on in and or anyone thanks thank you there way keep keeps kept fail fails failed failing here hit hitting "
    "shows show occurs occur causes cause caused reason wrong going on me".split())
_FIX_PHRASES_ZH = ("怎么解决", "如何解决", "怎么办", "怎么处理", "什么原因", "是什么原因", "为什么", "求助", "请问", "报错", "报", "出现",
                   "运行", "训练", "时候", "的时候", "了", "的", "我", "在", "时", "吗", "呢")


def little_but_message(question: str) -> bool:
    """Whether a question is little but the error message it quotes: the message of its error line holds PASTED_SHARE
    of its words (a pasted traceback's frames are no words of it: a whole traceback was answered from the docs), or it
    is a pasted log that neither asks nor speaks to anyone ("Current loss scale already at minimum - cannot decrease
    scale anymore. Exiting run.", a launcher's output ending in a traceback; not "my run stops with ..."): 612 of the
    636 tune-only error logs read so, none of the labelled questions."""
    own = without_traceback(question)
    words, said = len(own.split()), len(extract_error(question)[1].split())
    if said < words and said >= PASTED_SHARE * words:  # an error line with a few words around it
        return True
    return not asks(question) and not speaks(own)


def pasted_log(question: str) -> bool:
    """Whether a question is a pasted log: lines of output (more than one) that neither ask nor speak to anyone, its
    error line perhaps without an exception class ("[Errno 2] No such file or directory: '/usr/local/cuda/bin/nvcc'",
    a hostfile and the launcher's complaint); no labelled question has more than one line."""
    return "\n" in question.strip() and not asks(question) and not speaks(without_traceback(question))


def speaks(text: str) -> bool:
    """Whether a text has the words of someone writing about a message (I, my, how, why; 我, 怎, 吗), not only those of
    the message (which may say "you", "please", "should")."""
    return _SPEAKS.search(text) is not None


_SPEAKS = re.compile(r"\b(?:i|i'm|i've|me|my|we|our|us|how|what|why|anyone|help|idea|thanks?)\b|我|怎|如何|为什么|吗|呢", re.I)
