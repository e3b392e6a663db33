"""The process's CPU memory allocation, set for big tensors that are allocated and freed over and over.

A CPU run allocates, fills and frees the same big tensors many times a second: each training step's
batch and softmax tensors, each evaluation block's [4096, I] float32 scores (hundreds of MB at tens of
thousands of items), the graph filter's sparse products. With glibc's defaults every allocation over its mmap
threshold is mapped fresh from the kernel and unmapped when freed, and freed heap above the trim
threshold goes back too, so each reuse pays one page fault per 4 KB page, which can cost more than the
matmul that fills the block. Two switches, both process-wide:

- ``THP_MEM_ALLOC_ENABLE=1`` (torch's own, c10/core/alloc_cpu.cpp): tensors of 2 MB and more are
  madvised to transparent huge pages, one fault per 2 MB (the kernel's THP mode must be ``madvise``
  or ``always``). torch reads it once, at its first allocation: this must run before torch is imported.
- glibc's ``mallopt``: the mmap threshold fixed at 32 MB (glibc's cap) and the trim threshold at 1 GB,
  so blocks under 32 MB are reused from the heap instead of going back to the kernel after each step.

What they buy, the same rankings faster: docs/performance.md, "The CPU allocator"
(``python scripts/bench_cpu_memory.py`` measures it). A variable the user set
(``THP_MEM_ALLOC_ENABLE``, ``GLIBC_TUNABLES`` or ``MALLOC_*``) wins over either switch. Only the
entry points call this (``recsys.train``, ``recsys.evaluate``, ``recsys.export``), and only when run as
programs: importing recsys, or them, changes nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

from recsys.utils.logs import FILE_ONLY

THP_VARIABLE = "THP_MEM_ALLOC_ENABLE"
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc refuses more (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD_BYTES = 1 << 30


def _user_tuned_malloc() -> bool:
    return "malloc" in os.environ.get("GLIBC_TUNABLES", "") or any(k.startswith("MALLOC_") for k in os.environ)


def tune_cpu_allocator() -> list[str]:
    """Applies both switches (module docstring) where the user has not set them; returns what it set."""
    applied = []
    if THP_VARIABLE not in os.environ:
        os.environ[THP_VARIABLE] = "1"
        applied.append(f"{THP_VARIABLE}=1")
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc" and not _user_tuned_malloc():
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mmap_set = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        trim_set = libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
        if mmap_set and trim_set:  # mallopt returns 1 on success
            applied.append("mallopt: mmap threshold 32 MB, trim threshold 1 GB")
    return applied


def log_cpu_allocator(logger: logging.Logger, applied: list[str]) -> None:
    """The run's log (file only) says what ``tune_cpu_allocator`` set."""
    logger.info("CPU allocator: %s", applied or "as set by the environment", extra=FILE_ONLY)
