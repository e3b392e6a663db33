"""Batches built ahead of the training step on a background thread, handed over in order.

On an accelerator (``device`` a CUDA device) the thread builds on a CUDA stream of its own, so the builder's
kernels and its read-backs (``recsys.data.ragged.gather_ranges`` sizes its results) wait only for the loader's
work, never for the training step's; each batch is handed over with the event recorded after it, and its memory
is marked as used by the consumer's stream, so the allocator does not reuse it while the step still reads it.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator

import torch

from recsys.data.batch import Batch


class Prefetched:
    """Iterate ``source`` on a daemon thread through a queue of at most ``depth`` items.

    The order and contents are those of ``source``; an error surfaces at the batch that raised it; dropping the
    iterator (or ``close``) stops the thread.
    """

    _DONE = object()

    def __init__(self, source: Iterator[Batch], depth: int, device: torch.device | None = None) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._finished = False
        on_cuda = device is not None and device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if on_cuda else None
        self._thread = threading.Thread(target=self._run, args=(source,), name="TrainBatches-prefetch", daemon=True)
        self._thread.start()

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _run(self, source: Iterator[Batch]) -> None:
        stream = self._stream
        try:
            with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
                for batch in source:
                    ready = None
                    if stream is not None:
                        ready = torch.cuda.Event()
                        ready.record(stream)
                    if not self._put((batch, ready)):
                        return
            self._put((self._DONE, None))
        except BaseException as e:  # handed to the consumer, raised at this batch
            self._put((self._DONE, e))

    def __iter__(self) -> Prefetched:
        return self

    def __next__(self) -> Batch:
        if self._finished:
            raise StopIteration
        item, extra = self._queue.get()
        if item is self._DONE:
            self._finished = True
            self.close()
            if extra is not None:
                raise extra
            raise StopIteration
        if extra is not None:  # built ahead, so normally long done: a wait only when the loader falls behind
            extra.synchronize()
            item.record_stream(torch.cuda.current_stream())
        return item

    def close(self) -> None:
        """Stop the thread and wait for it (a daemon thread left inside a torch op at interpreter exit aborts it)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def __del__(self) -> None:
        self._stop.set()
