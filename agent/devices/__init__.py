"""Accelerator detection and monitoring: the per-vendor backends and what they share.

Everything here is synchronous and side-effect free on the host (pure reads): the one-shot
commands call it directly, the device agent calls a whole pass through ``anyio.to_thread``.
"""
