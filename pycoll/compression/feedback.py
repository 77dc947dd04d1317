"""Error feedback: carry what compression lost into the next call, so errors cancel instead of adding up.

With ``allreduce(x, compression=c, residual=r)`` every rank adds its residual to the values it reads
from ``x`` before they are encoded, and stores what each of its encodes lost as the new residual. The
result of step t is then exactly ``sum_r (x_r + r_r[t-1]) - sum_r r_r[t]`` (for ``op="avg"`` divided by
the world size), so the running sum of results differs from the exact running sum by the current
residuals only: the error stays bounded however many steps run.
"""

from __future__ import annotations

import numpy as np


class ErrorFeedback:
    """Error-feedback state for one tensor (pass it as ``residual=``).

    Holds a float32 residual shaped like the tensor, created as zeros on first use and re-created when
    the tensor's size changes. Keep one per tensor (e.g. per gradient bucket).
    """

    def __init__(self) -> None:
        self.residual: np.ndarray | None = None

    def residual_for(self, count: int) -> np.ndarray:
        if self.residual is None or self.residual.size != count:
            self.residual = np.zeros(count, dtype=np.float32)
        return self.residual

    def reset(self) -> None:
        """Forget what was carried (e.g. after the model was re-initialized)."""
        if self.residual is not None:
            self.residual[:] = 0

    def __getstate__(self) -> dict:
        return {"residual": self.residual}

    def __setstate__(self, state: dict) -> None:
        self.residual = state["residual"]
