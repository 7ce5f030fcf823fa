"""Float64 NumPy activations, the independent references of the MLP tests."""
from __future__ import annotations

import math

import numpy as np

_erf = np.vectorize(math.erf)


def gelu64(x: np.ndarray) -> np.ndarray:
    """The exact GELU ``x·Φ(x)``, ``Φ(x) = (1 + erf(x/√2))/2`` (Hendrycks & Gimpel 2016, eq. 1), in float64."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def gelu64_grad(x: np.ndarray) -> np.ndarray:
    """``Φ(x) + x·φ(x)``."""
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def silu64(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def silu64_grad(x: np.ndarray) -> np.ndarray:
    s = 1.0 / (1.0 + np.exp(-x))
    return s * (1.0 + x * (1.0 - s))
