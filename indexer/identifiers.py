"""Identifier parts <-> words: what the short parts of DeepSpeed's names mean in plain English.

Config keys, API names and flags are built from abbreviations (`grad_accum_dtype`, `ckpt`,
`dp/tp/pp`), while users describe them in words ("gradient accumulation data type"). The table
below maps an abbreviated part to its words; the tokenizer adds those words wherever the part
appears, on the index side and the query side alike, so each side meets the other. Every part
listed occurs in the names of the installed deepspeed's config catalogue or public API (a test
keeps it so): the table describes DeepSpeed's vocabulary, not any question set.
"""

from __future__ import annotations

ABBREVIATIONS: dict[str, str] = {
    "accum": "accumulation",
    "aio": "asynchronous io",
    "async": "asynchronous",
    "attn": "attention",
    "avg": "average",
    "bf16": "bfloat16",
    "ckpt": "checkpoint",
    "comm": "communication",
    "comms": "communication",
    "dim": "dimension",
    "dist": "distributed",
    "dp": "data parallel",
    "dtype": "data type",
    "ep": "expert parallel",
    "fp16": "float16 half precision",
    "fp32": "float32 full precision",
    "grad": "gradient",
    "grads": "gradients",
    "init": "initialize initialization",
    "io": "input output",
    "lr": "learning rate",
    "ltd": "layer token drop",
    "max": "maximum",
    "mem": "memory",
    "min": "minimum",
    "moe": "mixture experts",
    "mp": "model parallel",
    "num": "number",
    "optim": "optimizer",
    "param": "parameter",
    "params": "parameters",
    "pp": "pipeline parallel",
    "prof": "profiler",
    "rng": "random number generator",
    "seq": "sequence",
    "sp": "sequence parallel",
    "tp": "tensor parallel",
}


def expansion(part: str) -> list[str]:
    """The plain words an identifier part stands for ([] when it is not an abbreviation)."""
    words = ABBREVIATIONS.get(part.lower())
    return words.split() if words else []
