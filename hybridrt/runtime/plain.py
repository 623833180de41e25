"""PlainStepper: a state batch as numpy arrays, fed and fetched with session.run each step
(Model.stepper with io_binding=False; runtime.bound's BoundStepper is the default)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..graphs.feeds import zero_states
from ..graphs.manifest import Manifest
from .state import StepOptions, Stepper, _fit


class PlainStepper(Stepper):
    """States as numpy arrays, fed and fetched with session.run each step."""

    def __init__(
        self, session: Any, manifest: Manifest, batch: int, capacity: int, options: StepOptions | None = None
    ) -> None:
        super().__init__(session, manifest, batch, capacity, options)
        self._states = list(zero_states(self.pasts, batch, self.capacity).values())

    def forward(self, ids: np.ndarray, all_logits: bool = False, last: int = 1) -> np.ndarray:
        feeds = self._feeds(ids, all_logits, last)
        feeds.update((s.name, x) for s, x in zip(self.pasts, self._states))
        logits, *self._states = self.session.run(None, feeds)
        return logits if all_logits or last > 1 else logits[:, -1]

    # session.run returns new arrays, so a mark keeps references (set_row copies before writing).
    def _mark(self) -> Any:
        return list(self._states)

    def _restore(self, data: Any) -> None:
        self._states = [_fit(x, s, self.capacity) for s, x in zip(self.pasts, data)]

    def grow(self, need: int, keep: bool = True) -> None:
        super().grow(need, keep)
        self._states = [_fit(x, s, self.capacity) for s, x in zip(self.pasts, self._states)]

    def _arrays(self) -> list[np.ndarray]:
        return self._states

    def _replace(self, states: list[np.ndarray]) -> None:
        self._states = [np.ascontiguousarray(x) for x in states]

    def fresh(self, batch: int) -> Stepper:
        return PlainStepper(self.session, self.manifest, batch, self.capacity, self.options)

    def set_row(self, row: int, states: list[np.ndarray], length: int) -> None:
        self._states = [x.copy() for x in self._states]  # marks keep the old arrays
        for s, x, new in zip(self.pasts, self._states, states):
            x[row] = _fit(new, s, self.capacity)[0]
        self.lengths[row] = length

    def _reorder(self, index: np.ndarray) -> None:
        self._states = [x[index] for x in self._states]
