"""Single-process numpy references (float64) for the msrun tests."""
from __future__ import annotations

import numpy as np


def tp_mlp(d: dict) -> dict[str, np.ndarray]:
    """L = Σ (tanh(x W1ᵀ) W2ᵀ) ⊙ r and its gradients, by hand."""
    x, w1, w2, r = (d[k].astype(np.float64) for k in ("x", "w1", "w2", "r"))
    a = np.tanh(x @ w1.T)
    y = a @ w2.T
    dh = (r @ w2) * (1 - a * a)
    return {"loss": float((y * r).sum()), "dx": dh @ w1,
            "dw1": dh.reshape(-1, w1.shape[0]).T @ x.reshape(-1, w1.shape[1]),
            "dw2": r.reshape(-1, w2.shape[0]).T @ a.reshape(-1, w2.shape[1])}


def vocab_ce(d: dict) -> dict[str, np.ndarray]:
    """Masked-mean CE of an untied embedding + LM head, and its gradients."""
    emb, head = d["emb"].astype(np.float64), d["head"].astype(np.float64)
    ids, labels = d["ids"], d["labels"]
    h = emb[ids]
    z = h @ head.T
    z = z - z.max(-1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
    m = d["mask"] * (labels != -100)
    safe = np.maximum(labels, 0)
    onehot = np.eye(emb.shape[0])[safe]
    ce = -np.log((p * onehot).sum(-1))
    dz = (p - onehot) * (m / m.sum())[..., None]
    demb = np.zeros_like(emb)
    np.add.at(demb, ids.reshape(-1), (dz @ head).reshape(-1, emb.shape[1]))
    return {"loss": float((ce * m).sum() / m.sum()), "demb": demb,
            "dhead": dz.reshape(-1, head.shape[0]).T @ h.reshape(-1, head.shape[1])}
