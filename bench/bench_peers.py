"""Peer delivery benchmark: a digest pulled from a peer model agent vs from the Hub, same code.

Run: ``.venv/bin/python bench/bench_peers.py [--files 4 --size-mib 256 --runs 5]``.

One synthetic repository is served from memory by :mod:`fasthub` in its own process (as in
``bench_models.py``); an untimed materialization publishes it into a *seed* cache, which a
peer server (:mod:`agent.models.peerserver`, ``sendfile`` from the page cache) serves in a
second process, admitting the benchmark's own peer key. Two contenders, interleaved run by run,
each a fresh child process, each the in-process materializer (:mod:`agent.models.materializing`)
from an empty cache to a published tree (every byte hashed, fsync, atomic publish):

- **hub**: its files from the Hub stand-in (a resolve answered by a redirect to a CDN path);
- **peer**: the same digest from the peer server, with the Hub endpoint pointed at a closed
  port, so a single Hub request would fail the run: the figure is of a pull that never touches
  the Hub. The tree must come out with ``source: Peer``.

Reported: median and best wall time, throughput, the contender's CPU (user + system) and peak
RSS, and the serving process's CPU during the run. ``BENCH_SMOKE=1``: tiny sizes, one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MiB = 1024 * 1024
SMOKE = os.environ.get("BENCH_SMOKE", "") not in ("", "0")
REPO = "bench/peers"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def materialize(endpoint: str, commit: str, dest: str, offer: str | None, seed: str) -> str:
    """Publish the repository's digest into ``dest`` (from ``offer``'s peer when given, else
    the Hub); returns the published tree's source."""
    import anyio

    from agent.models import downloading, layout, materializing, peerclient, peering
    from agent.models.errors import Materializing
    from agent.models.metrics import ModelMetrics
    from agent.models.tuning import Tuning
    from bus import jwt, peers
    from hub import client as hub_client

    digest = os.environ["BENCH_DIGEST"]
    hex_ = digest.removeprefix("sha256:")

    async def main() -> str:
        directory = peering.Directory("bench")
        if offer is not None:
            directory.on_message(peers.subject("seed"), offer.encode())
            assert directory.holders(hex_), "the seed's offer was not taken"
        async with (
            hub_client.client(hub_client.HubSettings(endpoint=endpoint)) as hub,
            peerclient.pull(directory, node="bench", key=jwt.NKey(seed)) as pull,
        ):
            cache = layout.Cache.open(Path(dest))

            async def reserve(_: str, __: int) -> None:
                return None

            done = anyio.Event()
            m = materializing.Materializer(
                cache, hub, downloading.Limits(8, 0), tuning=Tuning(), metrics=ModelMetrics(),
                changed=lambda: None if hex_ in m.jobs else done.set(),
                peers=pull if offer is not None else None,
            )  # fmt: skip
            async with anyio.create_task_group() as tg:
                await tg.start(m.run, reserve)
                try:
                    m.ensure(hex_, materializing.Source(REPO, commit, None))
                except Materializing:
                    pass
                await done.wait()
                tg.cancel_scope.cancel()
            marker = cache.marker(hex_)
            assert marker is not None, cache.load_digest(hex_)
            return marker.source

    return anyio.run(main)


def serve_peer(cache_root: str, public_key: str) -> None:
    """Child: serve ``cache_root``'s published trees to the node ``bench`` (``public_key``);
    print the offer as one JSON line; serve until stdin closes."""
    import anyio
    import anyio.to_thread

    from agent.models import layout, peering, peerserver
    from bus import peers

    async def main() -> None:
        cache = layout.Cache.open(Path(cache_root))
        directory = peering.Directory("seed")
        client = peers.PeerOffer(node="bench", url="http://127.0.0.1:1", key=public_key)
        directory.on_message(peers.subject("bench"), peers.encode_offer(client))
        directory.clock = lambda: 0.0  # the benchmark's offer never lapses
        settings = peering.PeerSettings(port=0, bind_address="127.0.0.1", address="127.0.0.1")
        server = peerserver.PeerServer("seed", cache, directory, settings)
        async with peerserver.serve(server) as endpoint:
            key = peering.new_key()
            offer = peers.PeerOffer(
                node="seed",
                url=f"http://127.0.0.1:{endpoint.port}",
                key=key.public_key,
                digests=tuple(cache.published_hexes()),
            )
            print(peers.encode_offer(offer).decode(), flush=True)
            await anyio.to_thread.run_sync(sys.stdin.read)

    try:
        import uvloop

        anyio.run(main, backend_options={"loop_factory": uvloop.new_event_loop})
    except ImportError:
        anyio.run(main)


def child(kind: str, endpoint: str, commit: str, dest: str) -> None:
    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    offer = os.environ["BENCH_OFFER"] if kind == "peer" else None
    if kind == "peer":
        endpoint = f"http://127.0.0.1:{closed_port()}"  # no Hub: one request would fail it
    source = materialize(endpoint, commit, dest, offer, os.environ["BENCH_SEED"])
    elapsed = time.perf_counter() - start
    usage = resource.getrusage(resource.RUSAGE_SELF)
    cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime
    result = {"seconds": elapsed, "rss_mib": usage.ru_maxrss / 1024, "cpu_s": cpu}
    print(json.dumps({**result, "source": source}))


def listed_digest(endpoint: str, commit: str) -> str:
    """The repository's manifest digest, as the Hub stand-in lists it."""
    import anyio

    from hub import client as hub_client
    from hub import resolving

    async def main() -> str:
        async with hub_client.client(hub_client.HubSettings(endpoint=endpoint)) as hub:
            return (await resolving.listing(hub, REPO, commit, token=None)).digest

    return anyio.run(main)


def cpu_of(pid: int) -> float:
    """User + system seconds of process ``pid`` so far (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(kind: str, endpoint: str, work: Path, env: dict[str, str], server: int) -> dict[str, float]:
    dest = work / kind
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run(["sync"], check=False)
    served = cpu_of(server)
    out = subprocess.run(
        [sys.executable, __file__, "--child", kind, endpoint, env["BENCH_COMMIT"], str(dest)],
        check=True, capture_output=True, text=True, env=env,
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    expected = "Peer" if kind == "peer" else "Hub"
    assert result.pop("source") == expected, f"{kind}: the tree's source is not {expected}"
    result["server_cpu_s"] = cpu_of(server) - served
    shutil.rmtree(dest, ignore_errors=True)
    return {k: float(v) for k, v in result.items()}


def report(size: int, results: dict[str, list[dict[str, float]]]) -> None:
    for kind, runs in results.items():
        walls = sorted(r["seconds"] for r in runs)
        median = walls[len(walls) // 2]
        cpu = sorted(r["cpu_s"] for r in runs)[len(runs) // 2]
        served = sorted(r["server_cpu_s"] for r in runs)[len(runs) // 2]
        rss = max(r["rss_mib"] for r in runs)
        print(
            f"  {kind:5} median {median:.2f} s ({size / MiB / median:.0f} MiB/s), best "
            f"{walls[0]:.2f} s; CPU {cpu:.2f} s; peak RSS {rss:.0f} MiB; server CPU {served:.2f} s"
        )


def start(argv: list[str]) -> tuple[subprocess.Popen[str], str]:
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    return process, process.stdout.readline()


def stop(process: subprocess.Popen[str]) -> None:
    if process.stdin is not None:
        process.stdin.close()
    process.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--size-mib", type=int, default=1 if SMOKE else 256)
    parser.add_argument("--runs", type=int, default=1 if SMOKE else 5)
    parser.add_argument("--child", nargs=4)
    parser.add_argument("--serve-peer", nargs=2)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    if args.serve_peer:
        serve_peer(*args.serve_peer)
        return
    from bus import jwt

    per_file = args.size_mib * MiB // args.files
    work = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=os.environ.get("BENCH_DIR")))
    spec = f"{REPO}:{args.files}x{per_file}"
    hub, line = start(
        [sys.executable, str(Path(__file__).parent / "bench_models.py"), "--serve", spec]
    )
    peer: subprocess.Popen[str] | None = None
    try:
        info = json.loads(line)
        digest = listed_digest(info["hub"], info["commit"])
        key = jwt.NKey.generate("user")
        env = {**os.environ, "BENCH_COMMIT": info["commit"], "BENCH_DIGEST": digest}
        env["BENCH_SEED"] = key.seed
        seed = work / "seed"
        subprocess.run(
            [sys.executable, __file__, "--child", "hub", info["hub"], info["commit"], str(seed)],
            check=True, env=env, capture_output=True,
        )  # fmt: skip
        peer, env["BENCH_OFFER"] = start(
            [sys.executable, __file__, "--serve-peer", str(seed), key.public_key]
        )
        env["BENCH_OFFER"] = env["BENCH_OFFER"].strip()
        size = args.size_mib * MiB
        print(
            f"{args.files} x {per_file / MiB:g} MiB; median and best of {args.runs} runs, "
            f"interleaved; load average {os.getloadavg()[0]:.2f}"
        )
        results: dict[str, list[dict[str, float]]] = {"hub": [], "peer": []}
        for _ in range(args.runs):
            results["hub"].append(run("hub", info["hub"], work, env, hub.pid))
            results["peer"].append(run("peer", info["hub"], work, env, peer.pid))
        report(size, results)
        print(f"  load average after: {os.getloadavg()[0]:.2f}")
    finally:
        stop(hub)
        if peer is not None:
            stop(peer)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
