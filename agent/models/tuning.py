"""Download and bookkeeping constants of the model cache, shared by the plugin and ``mm pull``.

A module of its own so the one-shot's download path imports no service stack (the plugin's
settings module pulls in the bus and the HTTPS server).
"""

from __future__ import annotations

from typing import Final

import msgspec

__all__ = ["Tuning"]

MiB: Final = 1024 * 1024


class Tuning(msgspec.Struct, frozen=True, kw_only=True):
    """Download and bookkeeping constants; tests shrink them, production keeps the defaults."""

    segment_bytes: int = 64 * MiB
    """Files larger than this are fetched in byte-range segments of this size."""
    window: int = 4
    """Segments of one file in flight at a time (in file order)."""
    files_per_attempt: int = 16
    chunk_bytes: int = MiB
    """Bytes written and hashed per step: bounds memory per stream."""
    small_bytes: int = MiB
    """Files of at most this size are fetched whole in one request and written, hashed and
    closed in one worker-thread call, with no resume state (a resume rehashes them)."""
    sync_behind_bytes: int = 16 * MiB
    """A large file is fdatasynced (in the background) after every this many bytes written,
    so its final fsync has little left to wait for."""
    checkpoint_bytes: int = 256 * MiB
    """A file's resume state is fsynced and saved every this many bytes."""
    retries: int = 5
    """Consecutive failures of one segment before the attempt fails (progress resets it)."""
    retry_delay_s: float = 1.0
    """Delay before retry n is ``n * retry_delay_s`` (at most 10 s)."""
    backoff_first_s: float = 60.0
    backoff_max_s: float = 3600.0
    collect_every_s: float = 300.0
    collect_idle_s: float = 600.0
    """A published tree unreferenced for less than this is not collected."""
    report_every_s: float = 30.0
    """Progress (not state changes) goes on the bus at most this often..."""
    report_step: float = 0.05
    """...and only when a download moved at least this fraction of its size."""
    resync_s: float = 300.0
    """An unchanged models state is published again this often, so the bus's retained state
    (which expires after ``--nats-state-max-age``) never loses a live node's cache."""
    waiter_window_s: float = 300.0
    """An attempt nobody asked about for this long is cancelled (partial files stay)."""
    publish_wait_s: float = 100.0
    """NodePublishVolume holds a call for a download at most this long (kubelet's CSI timeout
    is 2 minutes): a download that ends in time mounts at once, with no event at all..."""
    publish_margin_s: float = 5.0
    """...and never past the caller's gRPC deadline less this, so the ABORTED answer (still
    downloading, kubelet retries) reaches the caller before it gives up."""
