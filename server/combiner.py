"""Flat combining: concurrent callers hand in work, and whoever runs next runs everyone's at once.

A request thread queues its item; if no pass is running it leads one over everything queued,
otherwise it sleeps until the running pass has done its item, or hands it the lead for the next
pass over what queued meanwhile. So under load one forward pass or one durable append serves
many requests, while a lone request runs immediately, with no timer to wait on. Each waiting
thread is woken exactly once (no convoy through a shared lock), which matters under the GIL.
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
        self.gate = threading.Lock()  # held until the slot is done or made the next leader
        self.gate.acquire()


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
        self._lock = threading.Lock()
        self._busy = False

    def submit(self, item: T) -> R:
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._queue.append(slot)
            lead = not self._busy
            self._busy = True
        if not lead:
            slot.gate.acquire()  # done by another's pass, or made the leader
        if not slot.done:
            self._lead()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]  # R may itself be None

    def _lead(self) -> None:
        """One pass over everything queued (this thread's own item included), then the lead
        goes to the oldest item that queued meanwhile, if any."""
        with self._lock:
            batch, self._queue = self._queue, []
        try:
            self._pass(batch)
        finally:
            with self._lock:
                following = self._queue[0] if self._queue else None
                self._busy = following is not None
            for slot in batch[1:]:
                slot.gate.release()  # the leader's own slot is batch[0]
            if following is not None:
                following.gate.release()

    def _pass(self, batch: list[_Slot[T, R]]) -> None:
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
