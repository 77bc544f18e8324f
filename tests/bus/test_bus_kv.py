"""Key-value buckets against a real nats-server: the reads agents rely on, and JetStream's
internal names kept inside the bus."""

from __future__ import annotations

import io
import shutil
import tokenize
from pathlib import Path

import anyio
import pytest

from bus import connection, kv, testing
from bus.embedded import ServerProcess
from bus.errors import StateUnavailable

pytestmark = [pytest.mark.anyio, pytest.mark.every_loop]  # I/O of its own

ROOT = Path(__file__).resolve().parents[2]


async def test_last_values_returns_live_keys_and_their_last_values(
    conn: connection.Connection,
) -> None:
    calls: list[tuple[str, str]] = []
    bucket = await kv.open_bucket(
        conn, kv.AGENTS_BUCKET, observe=lambda verb, result: calls.append((verb, result))
    )
    dotted = kv.artifact_key("team", "llm.v1")  # escaped: still one key token
    await bucket.put(kv.artifact_key("team", "a"), b"first")
    await bucket.put(kv.artifact_key("team", "a"), b"second")
    await bucket.put(dotted, b"dotted")
    await bucket.put(kv.artifact_key("team", "empty"), b"")
    await bucket.put(kv.artifact_key("team", "gone"), b"soon deleted")
    await bucket.delete(kv.artifact_key("team", "gone"))
    await bucket.put(kv.nms_key("node-1"), b"not an artifact")
    calls.clear()

    got = await bucket.last_values("artifacts.>")

    assert sorted(got) == [
        (kv.artifact_key("team", "a"), b"second"),
        (kv.artifact_key("team", "empty"), b""),  # a live empty value is not a tombstone
        (dotted, b"dotted"),
    ]
    assert kv.unescape(dotted.split(".")[2]) == "llm.v1"
    assert calls == [("kv_last", "ok")]
    assert await bucket.last_values("nms.>") == [(kv.nms_key("node-1"), b"not an artifact")]
    assert sorted(k for k, _ in await bucket.last_values()) == sorted(await bucket.keys())


async def test_last_values_of_an_empty_prefix_is_empty(conn: connection.Connection) -> None:
    bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
    await bucket.put(kv.nms_key("node-1"), b"x")

    assert await bucket.last_values("artifacts.>") == []


async def test_last_values_of_a_missing_bucket_is_state_unavailable(
    conn: connection.Connection,
) -> None:
    calls: list[tuple[str, str]] = []
    bucket = kv.Bucket(conn, "NO_SUCH_BUCKET", observe=lambda v, r: calls.append((v, r)))

    with pytest.raises(StateUnavailable):
        await bucket.last_values("artifacts.>")
    assert calls == [("kv_last", "error")]


async def test_a_bucket_lost_with_the_servers_store_is_created_again(
    server: ServerProcess,
) -> None:
    """NATS restarted with an empty store: the connection's reconnect hooks run, and a bucket
    it ensured before answers again (re-created, empty) instead of failing forever."""
    async with connection.connect(testing.settings_for(server)) as conn:
        bucket = await kv.open_bucket(conn, kv.AGENTS_BUCKET)
        await bucket.put("a", b"1")
        reconnected = anyio.Event()

        async def hook() -> None:
            reconnected.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(conn.every_reconnect, hook)
            server.kill()
            await server.stop()
            shutil.rmtree(server.store_dir / "js")
            await server.start()
            with anyio.fail_after(5):
                await reconnected.wait()
            tg.cancel_scope.cancel()
        assert await bucket.get("a") is None  # lost with the store; the bucket is back
        await bucket.put("a", b"2")
        assert await bucket.last_values() == [("a", b"2")]
        stranger = kv.Bucket(conn, "NEVER_ENSURED")  # only what was ensured is re-created
        with pytest.raises(StateUnavailable):
            await stranger.last_values()


def _string_literals(path: Path) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
    return [(t.start[0], t.string) for t in tokens if t.type == tokenize.STRING]


def test_no_module_outside_the_bus_names_jetstream_kv_internals() -> None:
    """A bucket's stream (``KV_<bucket>``) and subjects (``$KV.<bucket>.<key>``) are how this
    nats-server version stores keys; only ``bus`` may depend on that."""
    internals = ("KV_", "$KV.")
    this = Path(__file__).resolve()
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for top in (
            "agent",
            "bench",
            "controlplane",
            "gpustack_operator",
            "hub",
            "kit",
            "proto",
            "tests",
        )
        for path in sorted((ROOT / top).rglob("*.py"))
        if path != this
        for line, text in _string_literals(path)
        if any(name in text for name in internals)
    ]

    assert offenders == []
    assert any(  # the check sees what it looks for
        any(name in text for name in internals)
        for _, text in _string_literals(ROOT / "bus" / "jetstream.py")
    )
