"""BACO's importance estimation across layers (thesis §6.5, Eq. 6.6–6.9), adapted from Ansor's task scheduler.

Each layer i has an allocation t_i (units of mapping-search work spent on it) and a history g_i(t) of its
best EDP. The scheduler gives the next unit to argmax_i |∂f/∂t_i| with

  ∂f/∂t_i ≈ ∂f/∂g_i · (α·(g_i(t_i) − g_i(t_i − 1)) + (1 − α)·(g_i(t_i + 1) − g_i(t_i)))   (Eq. 6.7, Δt = 1)
  g_i(t_i + 1) ≈ min(g_i(t_i) − g_i(t_i)/t_i,  β · FLOPs_i² · min_{k∈Y(i)} g_k / FLOPs_k²)   (Eq. 6.8)

with ∂f/∂g_i = w_i, the layer's occurrence count (Eq. 6.6). The thesis prints "+ g_i/t_i" in the first
term; Ansor's original (and the only reading where g falls as t grows) is "−", used here. The similarity
term is Ansor's FLOPs / best-FLOPS rewritten for EDP: energy and latency both scale with FLOPs at the best
similar layer's efficiency, so EDP scales with FLOPs². Y(i) = layers of the same operator, kernel size and
stride. A layer whose last `patience` units brought no improvement is dropped (stalled).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ALPHA = 0.2
BETA = 2.0


@dataclass
class LayerState:
    weight: float
    flops: float
    group: tuple[object, ...]  # similarity key: layers in one group predict each other
    history: list[float] = field(default_factory=list)  # best EDP after each unit (t = len(history))
    stalled: int = 0
    dropped: bool = False

    @property
    def t(self) -> int:
        return len(self.history)


class ImportanceScheduler:
    def __init__(self, layers: list[LayerState], alpha: float = ALPHA, beta: float = BETA, patience: int = 3):
        self.layers, self.alpha, self.beta, self.patience = layers, alpha, beta, patience

    def record(self, i: int, best_edp: float) -> None:
        s = self.layers[i]
        if s.history and best_edp >= s.history[-1] * (1 - 1e-9):
            s.stalled += 1
            if s.stalled >= self.patience:
                s.dropped = True
        else:
            s.stalled = 0
        s.history.append(best_edp)

    def predicted_next(self, i: int) -> float:
        s = self.layers[i]
        g = s.history[-1]
        ideal = g - g / s.t
        similar = [o.history[-1] / (o.flops**2) for o in self.layers if o.group == s.group and o.history]
        by_similarity = self.beta * s.flops**2 * min(similar) if similar else ideal
        return min(ideal, by_similarity)

    def gradient(self, i: int) -> float:
        s = self.layers[i]
        g = s.history[-1]
        backward = g - s.history[-2] if s.t >= 2 else 0.0
        forward = self.predicted_next(i) - g
        return s.weight * (self.alpha * backward + (1 - self.alpha) * forward)

    def next_layer(self) -> int | None:
        """Warm-up first (every layer one unit), then the layer with the largest |∂f/∂t_i|; None when all
        layers are dropped."""
        for i, s in enumerate(self.layers):
            if s.t == 0:
                return i
        active = [i for i, s in enumerate(self.layers) if not s.dropped]
        if not active:
            return None
        return max(active, key=lambda i: abs(self.gradient(i)))

    def allocation(self) -> list[int]:
        return [s.t for s in self.layers]
