"""``standalone``: embedded NATS + device agent + worker with the bus-KV sink, one process."""

from __future__ import annotations

import base64
import functools
import io
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import anyio
import msgspec
import pytest

from bus import connection, errors, kv, state, testing
from bus.settings import BusSettings
from gpustack_operator import buscli, buswatching, standalone
from gpustack_operator.main import options_for

pytestmark = pytest.mark.anyio


def _settings(tmp_path: Path) -> standalone.StandaloneSettings:
    """Every port free (none of standalone's defaults: one may run beside the tests), and a short
    state directory (``short_tmp_path``: the device plugins' sockets lie under it)."""
    argv = [f"--state-dir={tmp_path / 'state'}", "--nats-port=0", "--worker-port=0",
            "--device-manager-port=0", "--model-manager-port=0", "--dashboard-port=0",
            "--simulate=nvidia-h200x8",
            "--node-name=laptop.example", "--monitor-period=0.5s", "--no-fast-failed",
            "--bind-address=127.0.0.1"]  # fmt: skip
    return standalone.settings_from(options_for(("standalone",), argv))


def test_every_endpoint_is_open_on_loopback_by_default(tmp_path: Path) -> None:
    """No Kubernetes API to review tokens with: loopback, no auth, unless told otherwise."""
    built = standalone.settings_from(options_for(("standalone",), [f"--state-dir={tmp_path}"]))
    endpoints = [built.agent.https, built.models.https, built.worker.https]
    assert {(e.bind_address, e.auth) for e in endpoints} == {("127.0.0.1", "none")}
    wide = ["--bind-address=0.0.0.0", f"--state-dir={tmp_path}"]
    built = standalone.settings_from(options_for(("standalone",), wide))
    assert {(e.bind_address, e.auth) for e in (built.agent.https, built.worker.https)} == {
        ("0.0.0.0", "none")
    }


async def test_devices_reach_the_kv_ledger_through_the_worker(short_tmp_path: Path) -> None:
    tmp_path = short_tmp_path
    settings = _settings(tmp_path)
    banners, banner_reader = anyio.create_memory_object_stream[str](1)
    # Both ends closed by the test, whatever happens: an unclosed stream end is a
    # ResourceWarning at its garbage collection, which fails whichever later test it lands in.
    with banners, banner_reader:
        async with anyio.create_task_group() as tg:
            url = await tg.start(functools.partial(standalone.run, settings, out=banners))
            banner = await banner_reader.receive()
            auth = tmp_path / "state" / "nats" / "auth"
            # The worker's own credential (an administrator's, on this machine).
            bus = BusSettings.for_tests(
                url, nkey_seed_file=str(auth / "worker.nk"), inbox_prefix="_INBOX.worker"
            )
            async with connection.connect(bus, retry=False) as conn:
                ledger = await kv.open_bucket(conn, kv.LEDGER_BUCKET)

                async def devices_written() -> bool:
                    return any("laptop" in k for k in await ledger.keys("devices.>"))

                await testing.eventually(devices_written, timeout_s=20)
                (key,) = [k for k in await ledger.keys("devices.>") if "laptop" in k]
                found = await ledger.get(key)
                assert found is not None
                body = json.loads(found[0])
                groups = body["spec"]["groups"]
                assert groups[0]["id"] == "nvidia-h200" and len(groups[0]["accelerators"]) == 8
                retained = await state.snapshot(conn, bus, node="laptop.example", kind="devices")
                assert retained, "the devices spec is retained on the bus too"

                async def store_reported() -> bool:
                    keys = [k for k in await ledger.keys("nodemodelstores.>") if "laptop" in k]
                    found = await ledger.get(keys[0]) if keys else None
                    status = json.loads(found[0]).get("status", {}) if found else {}
                    return "capacity" in status

                # The model agent's cache state reaches NodeModelStore.status via the worker.
                await testing.eventually(store_reported, timeout_s=20)
                await _the_banners_watch_command_works_as_printed(banner)
                await _mib_slice_folds_on_the_simulated_h200(banner)
                await _the_workload_webhook_is_served_beside_the_pod_ones(banner)
            tg.cancel_scope.cancel()
    assert f"bus watch --nats-url {url} --nats-token-file {auth / 'dashboard.token'}" in banner


async def _the_banners_watch_command_works_as_printed(banner: str) -> None:
    """Run ``bus watch`` with the arguments the banner prints: it reads the retained state."""
    (line,) = [ln for ln in banner.splitlines() if "bus watch" in ln]
    argv = shlex.split(line.split("gpustack-operator bus watch", 1)[1])
    watch = buscli.watch_settings(options_for(("bus", "watch"), [*argv, "--output=json"]))
    out = io.BytesIO()  # the watch writes bytes, as stdout's buffer takes them
    with anyio.move_on_after(20):
        async with anyio.create_task_group() as tg:
            tg.start_soon(functools.partial(
                buswatching.watch, settings=watch.bus, node=None, subject=None, fmt="json", out=out
            ))  # fmt: skip
            await testing.eventually(lambda: _true(b'"kind":"devices"' in out.getvalue()))
            tg.cancel_scope.cancel()
    assert b'"node":"laptop.example"' in out.getvalue()
    # The dashboard's credential reads; it cannot publish, nor does connecting without one work.
    async with connection.connect(watch.bus, retry=False) as conn:
        with pytest.raises(errors.PublishFailed):
            await conn.publish_acked("gpustack.v1.node.laptop%2Eexample.health", b"{}")
    anonymous = msgspec.structs.replace(watch.bus, token_file=None)
    with pytest.raises(errors.NotConnected):
        async with connection.connect(anonymous, retry=False):
            pass


async def _true(value: bool) -> bool:
    return value


def test_generated_credentials_are_readable_by_their_owner_only(tmp_path: Path) -> None:
    (tmp_path / "auth").mkdir(mode=0o755)
    (tmp_path / "auth" / "dashboard.token").write_text("old")
    (tmp_path / "auth" / "dashboard.token").chmod(0o644)
    creds = standalone.generate_credentials(tmp_path / "auth", "laptop.example")
    assert stat.S_IMODE((tmp_path / "auth").stat().st_mode) == 0o700
    files = sorted(p.name for p in (tmp_path / "auth").iterdir())
    assert files == [
        "dashboard.token",
        "device-manager.token",
        "issuer.nk",
        "model-manager.token",
        "worker.nk",
    ]
    for f in (tmp_path / "auth").iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    token = (tmp_path / "auth" / "dashboard.token").read_text().strip()
    assert token != "old" and creds.tokens[creds.identities["dashboard"]] == token
    assert (tmp_path / "auth" / "issuer.nk").read_text().strip() == creds.issuer.seed
    again = standalone.generate_credentials(tmp_path / "auth", "laptop.example")
    assert again.issuer.public_key != creds.issuer.public_key  # fresh at every start


async def _mib_slice_folds_on_the_simulated_h200(banner: str) -> None:
    """The worker's webhooks answer from the ledger the simulated cards reached."""
    (line,) = [ln for ln in banner.splitlines() if "pod webhooks:" in ln]
    mutate_url = line.split()[2].rstrip(",")
    limits = {"nvidia.com/gpu.sliced": "1", "nvidia.com/gpu.sliced.memory-mib": "71885"}
    obj = {"spec": {"nodeSelector": {"acceleratable.feature.gpustack.ai/nvidia-h200": "true"},
                    "containers": [{"name": "c", "resources": {"limits": limits}}]}}  # fmt: skip
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "u1", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                          "operation": "CREATE", "object": obj}}  # fmt: skip

    async def folded() -> bool:
        async with (
            aiohttp.ClientSession() as session,
            session.post(mutate_url, json=review, ssl=False) as r,
        ):
            response = (await r.json())["response"]
        ops = json.loads(base64.b64decode(response.get("patch", "W10=")))
        units = [op["value"] for op in ops if op["path"].endswith("gpu.sliced.units")]
        return units == ["799994"]  # floor(71885 x 1.6e6 / 143771), VRAM from the ledger

    await testing.eventually(folded, timeout_s=10)


async def _the_workload_webhook_is_served_beside_the_pod_ones(banner: str) -> None:
    """Under ``standalone`` (no cluster) the Workload webhook answers (no queue of ours: allowed
    untouched) and checks the review as the Pod ones do: a ConfigMap as a Workload is a 400."""
    (pods,) = [ln for ln in banner.splitlines() if "pod webhooks:" in ln]
    url = pods.split()[2].rstrip(",").replace("/pods/mutate", "/workloads/mutate")
    assert f"workload hook:   {url}" in banner  # the same HTTPS port as the Pod webhooks
    kind = {"group": "kueue.x-k8s.io", "version": "v1beta2", "kind": "Workload"}
    workload = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                "spec": {"queueName": "team", "podSets": []}}  # fmt: skip
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "b"}}
    answers = []
    for obj in (workload, config_map):
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "w1", "kind": kind, "operation": "CREATE", "object": obj}}  # fmt: skip
        async with (
            aiohttp.ClientSession() as session,
            session.post(url, json=review, ssl=False) as r,
        ):
            answers.append((r.status, await r.read()))
    assert answers[0][0] == 200
    assert msgspec.json.decode(answers[0][1])["response"] == {"uid": "w1", "allowed": True}
    assert answers[1] == (400, b"request.object is a ConfigMap, not the Workload the review names")


def test_the_command_stops_cleanly_on_sigint_and_leaves_no_server(short_tmp_path: Path) -> None:
    tmp_path = short_tmp_path
    cli = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
    with subprocess.Popen(
        [
            cli,
            "standalone",
            "--simulate",
            "amd-rx7800xt-x2",
            "--state-dir",
            str(tmp_path),
            "--nats-port",
            "0",
            "--worker-port",
            "0",
            "--device-manager-port",
            "0",
            "--model-manager-port",
            "0",
            "--dashboard-port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stderr is not None
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "stop:" in line:
                break
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, "".join(seen)
    conf = str(tmp_path / "nats")
    leftovers = subprocess.run(["pgrep", "-f", conf], capture_output=True, text=True, check=False)
    assert leftovers.stdout == "", "the embedded nats-server outlived the command"


def test_the_model_agent_in_standalone_follows_the_hugging_face_environment(
    tmp_path: Path,
) -> None:
    env = {"HUGGING_FACE_HUB_TOKEN": "hf_legacy", "HF_HUB_OFFLINE": "1", "NO_PROXY": "hub.lan"}
    built = standalone.settings_from(options_for(("standalone",), [f"--state-dir={tmp_path}"], env))
    assert built.models.hub_token == "hf_legacy"
    assert built.models.hub_env.offline and built.models.hub_env.no_proxy == ("hub.lan",)


def _server_pids(store: Path) -> list[int]:
    """The pids of every nats-server that ran on ``store`` (each leaves ``<name>_<pid>.ports``)."""
    return sorted(int(p.stem.rsplit("_", 1)[1]) for p in store.glob("*_*.ports"))


def _reaped(pid: int) -> bool:
    """Gone from the process table: a ``<defunct>`` child keeps its ``/proc`` entry."""
    return not Path(f"/proc/{pid}").exists()


async def test_a_dead_nats_server_is_reaped_and_started_again_on_its_port(
    short_tmp_path: Path,
) -> None:
    """The embedded server is killed: standalone reaps it (no ``<defunct>`` left), starts it
    again on the same port with the same store, and the device agent publishes there again."""
    tmp_path = short_tmp_path
    settings = _settings(tmp_path)
    store = tmp_path / "state" / "nats"
    async with anyio.create_task_group() as tg:
        url = await tg.start(standalone.run, settings)
        admin = BusSettings.for_tests(
            url, nkey_seed_file=str(store / "auth" / "worker.nk"), inbox_prefix="_INBOX.worker"
        )
        async with connection.connect(admin, retry=False) as conn:

            async def samples() -> set[bytes]:
                found = await state.snapshot(conn, admin, node="laptop.example", kind="samples")
                return {data for _, data in found}

            await testing.eventually(lambda: _true(bool(_server_pids(store))))
            await testing.eventually(functools.partial(_sampled, samples, set()), timeout_s=20)
            before = await samples()
            (first,) = _server_pids(store)
            os.kill(first, signal.SIGKILL)
            await testing.eventually(lambda: _true(_reaped(first)), timeout_s=20)
            await testing.eventually(lambda: _true(len(_server_pids(store)) == 2), timeout_s=30)
            # The store survived (the devices retained before the kill are there), and a sample
            # the device agent took after the restart reaches the server on the same URL.
            await testing.eventually(functools.partial(_sampled, samples, before), timeout_s=60)
            assert await state.snapshot(conn, admin, node="laptop.example", kind="devices")
        tg.cancel_scope.cancel()


async def _sampled(samples: Callable[[], Awaitable[set[bytes]]], before: set[bytes]) -> bool:
    """A retained sample not in ``before`` (none while the server does not answer)."""
    try:
        return bool(await samples() - before)
    except errors.BusError:
        return False


def test_a_state_directory_too_long_for_the_agents_sockets_exits_2_naming_the_path(
    tmp_path: Path,
) -> None:
    """Which sockets the device agent binds depends on what it detects, so the check is at the
    bind; it still is the directory setting's fault (exit 2, one line, no traceback)."""
    state = tmp_path / ("d" * 60) / ("e" * 40)
    cli = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")
    argv = [cli, "standalone", "--simulate=nvidia-h200x8", f"--state-dir={state}",
            "--nats-port=0", "--worker-port=0", "--device-manager-port=0",
            "--model-manager-port=0", "--dashboard-port=0", "--bind-address=127.0.0.1"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    errors_ = [line for line in done.stderr.splitlines() if line.startswith("E")]
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = errors_
    assert f"standalone: {state}/" in line and "a unix socket path of" in line
