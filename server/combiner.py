"""Flat combining: concurrent callers hand in work, and whoever runs next runs everyone's at once.

A request thread queues its item and takes the pass; if another thread's pass already took the
item, it just collects the result. So under load one forward pass or one durable append serves
many requests, while a lone request runs immediately, with no timer to wait on.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    def __init__(self, item: T) -> None:
        self.item = item
        self.done = False
        self.result: R | None = None
        self.error: BaseException | None = None


class Combiner(Generic[T, R]):
    """Runs ``run(items) -> results`` (one result per item, in order) on queued items together.

    Args:
        run: does the work for a batch.
        retry_alone: says whether an error of ``run`` left nothing done, so each item can be
            rerun by itself and one bad item fails only its own caller; otherwise every caller
            of the batch gets the error.
    """

    def __init__(
        self,
        run: Callable[[list[T]], list[R]],
        retry_alone: Callable[[BaseException], bool] = lambda error: True,
    ) -> None:
        self._run = run
        self._retry_alone = retry_alone
        self._queue: list[_Slot[T, R]] = []
        self._queue_lock = threading.Lock()
        self._pass_lock = threading.Lock()
        self.passes = 0

    def submit(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._queue_lock:
            self._queue.append(slot)
        with self._pass_lock:
            if not slot.done:
                with self._queue_lock:
                    batch, self._queue = self._queue, []
                self._pass(batch)
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]  # R may itself be None

    def _pass(self, batch: list[_Slot[T, R]]) -> None:
        self.passes += 1
        try:
            results = self._run([slot.item for slot in batch])
            for slot, result in zip(batch, results, strict=True):
                slot.result = result
        except BaseException as error:
            if len(batch) == 1 or not self._retry_alone(error):
                for slot in batch:
                    slot.error = error
            else:
                for slot in batch:  # one bad item must not fail the others
                    self._pass([slot])
        finally:
            for slot in batch:
                slot.done = True
