"""Fit the answer's unit adapter (`app/query_adapter.py`, UNIT_ADAPTER_FILE) on tune questions only.

The retrieval adapter moves a question's vector toward the passages that answer such questions; this
one moves the searched vector once more, within the passages found, toward the units that hold the
answer. For each tune question whose first passages hold a unit with a gold phrase (the project's one
relevance rule): the adapted vector's cosines with every candidate unit, a softmax over them at
UNIT_TEMPERATURE, the cross-entropy of the gold units, plus UNIT_LAMBDA * |delta|^2, by full-batch
L-BFGS from zero run to convergence (deterministic; a few seconds on 2 cores).

Chosen by nested 5-fold cross-validation on tune (374 questions; the unit scorer refitted on adapter
cosines cross-fitted inside each training part), scored by the share of composed answers holding a
gold phrase: 0.7299 without the adapter; at temperature 0.05, lambda 0.03 / 0.1 / 0.3: 0.7460 /
0.7513 / 0.7433; at lambda 0.1, temperature 0.1: 0.7487; with the 200 training-only questions of
`eval/training/` added to the fit: 0.7460 (not used).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

UNIT_LAMBDA = 0.1
UNIT_TEMPERATURE = 0.05
MAX_ITERATIONS = 200


def fit_unit_delta(query_vectors: Sequence[np.ndarray], unit_vectors: Sequence[np.ndarray], labels: Sequence[np.ndarray], *,
                   lam: float = UNIT_LAMBDA, temperature: float = UNIT_TEMPERATURE) -> np.ndarray:
    """`query_vectors[i]`: the searched (unit-length) vector of question i; `unit_vectors[i]`: its candidate
    units' vectors, one row each; `labels[i]`: 1 where a unit holds a gold phrase. Questions without a
    gold unit teach nothing and are left out."""
    import torch

    keep = [i for i, y in enumerate(labels) if np.asarray(y).any()]
    if not keep:
        raise ValueError("no tune question has a unit holding its evidence: nothing to learn from")
    torch.manual_seed(0)
    dim = int(np.asarray(query_vectors[keep[0]]).shape[0])
    width = max(len(unit_vectors[i]) for i in keep)
    units = np.zeros((len(keep), width, dim), dtype=np.float32)
    valid = np.zeros((len(keep), width), dtype=bool)
    gold = np.zeros((len(keep), width), dtype=bool)
    for row, i in enumerate(keep):
        n = len(unit_vectors[i])
        units[row, :n] = unit_vectors[i]
        valid[row, :n] = True
        gold[row, :n] = np.asarray(labels[i], dtype=bool)
    q = torch.tensor(np.vstack([query_vectors[i] for i in keep]).astype(np.float32))
    u = torch.tensor(units)
    valid_t, gold_t = torch.tensor(valid), torch.tensor(gold)
    delta = torch.zeros(dim, dim, requires_grad=True)
    opt = torch.optim.LBFGS([delta], lr=1.0, max_iter=MAX_ITERATIONS, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        moved = torch.nn.functional.normalize(q + q @ delta, dim=1)
        logits = torch.einsum("nld,nd->nl", u, moved) / temperature
        every = torch.logsumexp(logits.masked_fill(~valid_t, -1e9), 1)
        answering = torch.logsumexp(logits.masked_fill(~gold_t, -1e9), 1)
        loss = (every - answering).mean() + lam * (delta ** 2).sum()
        loss.backward()
        return loss

    opt.step(closure)  # to convergence: the same minimum whatever the last bits of the inputs
    return delta.detach().numpy().astype(np.float32)
