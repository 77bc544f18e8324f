"""Every ``gpustack-operator`` command in README.md and docs/ runs as written, where it can here.

Commands come from shell code blocks (continuation lines joined) and inline code spans; each is
cut at the first pipe, redirection or ``&&`` (what follows is another program). How each runs:

- ``dm detect``/``dm monitor``, ``dm preflight --dry-run``, ``bus schema``: as written (this
  host has no accelerator: they find nothing, which is still a complete run);
- ``bus watch``: against a test nats-server holding example state, with ``--once`` added (it
  otherwise follows the bus forever) and any ``--nats-url`` pointed at that server;
- ``help`` and ``completion``: as written (a page; a script bash must parse);
- ``standalone``: with ``--run-for`` and free ports added (it otherwise runs until Ctrl-C on
  fixed ports, which a ``standalone`` beside the tests holds), and a private state directory
  with a short path (its device plugins' sockets lie under it).

Skipped, each with its ``--help`` run instead (so its flags still have to parse):

- ``model-manager`` (the service): a CSI node plugin needs a kubelet to call it;
- ``model-manager manifest``: needs the Hugging Face Hub (tests/gpustack_operator/
  test_manifest_cli.py runs it against a local one);
- ``worker`` and ``dm serve``: need a cluster and a kubelet (``standalone`` runs both);
- ``dashboard`` and ``worker-gateway``: services that run until stopped (test_dashboard_*.py and
  tests/controlplane/gateway/test_gateway_gpustack.py runs the gateway as a GPUStack server does).

A command of a shape not listed fails the test, so a new kind of example gets a decision.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import ssl
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import anyio
import pytest
import yaml

from bus import connection, publishing, testing
from bus.metrics import BusMetrics

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("gpustack-operator"))
_SHELLS = ("bash", "sh", "shell", "console", "")
_FENCE = re.compile(r"```(\w*)\n(.*?)```", re.DOTALL)
_INLINE = re.compile(r"`(gpustack-operator [^`]+)`")
_START = re.compile(r"(?:^|\s)(gpustack-operator\s.*)$")
_END = re.compile(r"\s(?:\||>|&&|;|#)")
ALIASES = {"dm": "device-manager", "mm": "model-manager", "w": "worker", "wg": "worker-gateway"}
SKIPPED = {
    ("model-manager",): "a CSI node plugin needs a kubelet to call it",
    ("model-manager", "manifest"): "needs the Hugging Face Hub",
    ("worker",): "needs a cluster",
    ("device-manager", "serve"): "needs a kubelet",
    ("dashboard",): "a service that runs until stopped",
    ("worker-gateway",): "a service that runs until stopped",
}


def _commands() -> list[tuple[str, list[str]]]:
    """(where, argv without the program) of every documented command."""
    found: list[tuple[str, list[str]]] = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        lines = [
            line
            for lang, body in _FENCE.findall(text)
            if lang in _SHELLS
            for line in body.replace("\\\n", " ").splitlines()
        ]
        lines += _INLINE.findall(text)
        for line in lines:
            start = _START.search(line)
            if start is None:
                continue
            command = _END.split(start.group(1), maxsplit=1)[0]
            found.append((f"{path.name}: {command}", shlex.split(command)[1:]))
    return found


COMMANDS = _commands()


def _path(argv: list[str]) -> tuple[str, ...]:
    words = [w for w in argv if not w.startswith("-")]
    head = ALIASES.get(words[0], words[0]) if words else ""
    second = words[1] if len(words) > 1 else ""
    known_second = {"device-manager", "bus", "model-manager"}
    if head in known_second and second in ("detect", "monitor", "preflight", "serve", "watch",
                                            "schema", "manifest"):  # fmt: skip
        return head, second
    return (head,)


def test_the_docs_have_commands_to_run() -> None:
    paths = {_path(argv) for _, argv in COMMANDS}
    assert {("bus", "watch"), ("standalone",), ("device-manager", "detect")} <= paths


def _run(
    argv: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSTACK_", "NATS_"))}
    return subprocess.run(
        [CLI, *argv], capture_output=True, text=True, cwd=cwd, env={**environment, **(env or {})},
        timeout=180, check=False,
    )  # fmt: skip


def _with_url(argv: list[str], url: str) -> list[str]:
    out = list(argv)
    for i, word in enumerate(out):
        if word == "--nats-url" and i + 1 < len(out):
            out[i + 1] = url
        elif word.startswith("--nats-url="):
            out[i] = f"--nats-url={url}"
    return out


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_documented_command_runs(
    where: str, argv: list[str], tmp_path: Path, short_tmp_path: Path
) -> None:
    path = _path(argv)
    if path in SKIPPED:
        result = _run([*path, "--help"], tmp_path)
        assert result.returncode == 0, result.stderr
        pytest.skip(f"{' '.join(path)}: {SKIPPED[path]} (its --help ran)")
    if path == ("bus", "watch"):
        lines = anyio.run(_watch_once, argv, tmp_path)
        assert lines, where
        return
    if path == ("standalone",):
        argv = [*argv, "--run-for=1s", "--nats-port=0", "--worker-port=0",
                "--device-manager-port=0", "--model-manager-port=0", "--dashboard-port=0",
                f"--state-dir={short_tmp_path / 'state'}"]  # fmt: skip
    elif path in (("help",), ("completion",)):
        _builtin(where, argv, tmp_path)
        return
    elif path not in (
        ("device-manager", "detect"),
        ("device-manager", "monitor"),
        ("device-manager", "preflight"),
        ("bus", "schema"),
    ):
        pytest.fail(f"{where}: no rule for running {' '.join(path)} here; add one")
    if path == ("device-manager", "preflight"):
        assert "--dry-run" in argv, f"{where}: only a dry run may run here"
    result = _run(argv, tmp_path)
    assert result.returncode == 0, f"{where}\n{result.stderr}"
    assert "Traceback" not in result.stderr
    if path == ("bus", "schema"):
        assert "$defs" in json.loads(result.stdout)
    elif path[0] == "device-manager":
        assert isinstance(yaml.safe_load(result.stdout), (list, dict))


def _builtin(where: str, argv: list[str], tmp_path: Path) -> None:
    """``help``: its page on stdout; ``completion bash``: a script bash parses."""
    result = _run(argv, tmp_path)
    assert result.returncode == 0 and result.stderr == "", f"{where}\n{result.stderr}"
    if argv[:2] == ["completion", "bash"]:
        script = tmp_path / "completion.bash"
        script.write_text(result.stdout)
        subprocess.run(["bash", "-n", str(script)], check=True)
    else:
        assert "Usage:" in result.stdout


async def _watch_once(argv: list[str], tmp_path: Path) -> list[str]:
    """``bus watch … --once`` against a server holding the state of the documented node."""
    (tmp_path / "dashboard.token").write_text("unused: this server has no authorization\n")
    node = argv[argv.index("--node") + 1] if "--node" in argv else "gpu-node.example.com"
    async with testing.nats_server(tmp_path / "nats") as server:
        settings = testing.settings_for(server)
        async with (
            connection.connect(settings, retry=False) as conn,
            publishing.publisher(conn, settings=settings, metrics=BusMetrics()) as pub,
        ):
            for event in testing.example_events(node):
                pub.publish(event)
            await pub.wait_sent()
        here = [w.replace("…/", f"{tmp_path}/") for w in argv]  # the docs' "…/": the state dir
        once = _with_url(here, server.url) + ([] if "--once" in argv else ["--once"])
        result = await anyio.to_thread.run_sync(
            lambda: _run(once, tmp_path, {"NATS_URL": server.url})
        )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


# The docs' claims a run can check, beside their commands.

_NUMBERS = {"three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}


def _docs() -> dict[str, str]:
    return {p.name: p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]}


def test_the_crd_count_in_the_docs_is_deploy_crds() -> None:
    kustomization = yaml.safe_load((ROOT / "deploy" / "crds" / "kustomization.yaml").read_text())
    names = [
        yaml.safe_load((ROOT / "deploy" / "crds" / f).read_text())["metadata"]["name"]
        for f in kustomization["resources"]
    ]
    claims = [
        (where, word)
        for where, text in _docs().items()
        for word in re.findall(r"\b(\w+) CRDs\b", text)
        if word.lower() in _NUMBERS
    ]
    assert claims, "no CRD count left to check: drop this test or the claim"
    wrong = [(w, word) for w, word in claims if _NUMBERS[word.lower()] != len(names)]
    assert wrong == [], f"deploy/crds has {len(names)} CRDs"
    deploy = _docs()["deploy.md"]
    assert all(f"`{name}`" in deploy for name in names), "the worker's resourceNames list"


def test_standalone_serves_as_the_docs_say(short_tmp_path: Path) -> None:
    """docs/metrics.md: standalone's /metrics needs no token, its extension API answers 401;
    every counter a real scrape shows is documented under that name, ``_total`` included."""
    metrics_doc = (ROOT / "docs" / "metrics.md").read_text()
    assert "still answers 401" in " ".join(metrics_doc.split())
    argv = [CLI, "standalone", "--run-for=120s", "--simulate=nvidia-h200x8", "--nats-port=0",
            "--worker-port=0", "--device-manager-port=0", "--model-manager-port=0",
            "--dashboard-port=0", f"--state-dir={short_tmp_path / 'state'}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSTACK_", "NATS_"))}
    with subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env) as proc:
        try:
            urls = _banner_urls(proc)
            assert proc.stderr is not None  # drained from now on: a full pipe would stall it
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            worker, device = urls["worker metrics"], urls["device metrics"]
            assert _get(worker)[0] == 200 and _get(device)[0] == 200
            base = worker.removesuffix("/metrics")
            assert _get(f"{base}/apis/gpustack.ai/v1")[0] == 401
            scraped = _get(worker)[1] + _get(device)[1]
        finally:
            proc.terminate()
            proc.communicate(timeout=60)
    counters = set(re.findall(r"^# TYPE (gpustack_\w+) counter$", scraped, re.MULTILINE))
    assert len(counters) > 5
    documented = set(re.findall(r"`(gpustack_\w+)`", metrics_doc))
    assert counters - documented == set()


def _banner_urls(proc: subprocess.Popen[str]) -> dict[str, str]:
    """The banner's ``name: https://…`` lines, read until its ``stop:`` line."""
    assert proc.stderr is not None
    urls: dict[str, str] = {}
    for line in proc.stderr:
        found = re.match(r"\s+([\w ]+):\s+(https?://\S+)", line)
        if found:
            urls[found.group(1)] = found.group(2)
        if line.strip().startswith("stop:"):
            return urls
    raise AssertionError("standalone ended before its banner")


def _get(url: str) -> tuple[int, str]:
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, context=context, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
