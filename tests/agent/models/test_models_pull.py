"""``model-manager pull``: the real command, a real Hub server, and the CSI path reading its work."""

from __future__ import annotations

import os
import pty
import sys
from pathlib import Path

import anyio
import pytest
from models_harness import FILES, Rig, manifest_of, publish, publish_request, unpublish

from agent.models.settings import settings_from
from gpustack_operator.main import options_for
from hub import testing

pytestmark = pytest.mark.anyio
CLI = os.path.join(os.path.dirname(sys.executable), "gpustack-operator")


def _env(**extra: str) -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    return {**clean, "HOME": "/nonexistent", **extra}


async def _pull(rig: Rig, *args: str, **env: str) -> tuple[int, str, str]:
    argv = [CLI, "mm", "pull", *args, "--cache-root", str(rig.settings.cache_root)]
    result = await anyio.run_process(
        argv, env=_env(HF_ENDPOINT=rig.endpoints.hub, **env), check=False
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


def _files(tree: Path) -> list[str]:
    return sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())


def _file_requests(hub: testing.FakeHub) -> list[testing.Seen]:
    return [s for s in hub.seen if "/api/" not in s.path]


@pytest.mark.usefixtures("mounts")
async def test_a_pulled_snapshot_is_mounted_by_the_csi_path_without_downloading(
    rig: Rig,
) -> None:
    record = rig.artifact("org/model", FILES)
    code, out, err = await _pull(rig, "org/model")
    fetched = len(_file_requests(rig.hub))

    hex_ = manifest_of(FILES).digest.removeprefix("sha256:")
    tree = rig.settings.cache_root / "published" / hex_ / "tree"
    assert code == 0, err
    assert err == ""  # piped: no progress line
    assert out == f"commit: {record.revision}\ndigest: sha256:{hex_}\npath: {tree}\n"
    assert {p: (tree / p).read_bytes() for p in FILES} == FILES
    assert os.stat(tree / "config.json").st_mode & 0o777 == 0o444
    assert fetched >= len(FILES)

    target = rig.target()
    async with rig.running() as plugin:
        await publish(plugin.socket, publish_request(record, target))  # OK at the first call
        data = (target / "model-00001.safetensors").read_bytes()
        jobs = len(plugin.materializer.jobs)
        await unpublish(plugin.socket, "csi-abc", target)
    assert data == FILES["model-00001.safetensors"]
    assert jobs == 0
    assert len(_file_requests(rig.hub)) == fetched


async def test_a_pull_lists_the_tree_once(rig: Rig) -> None:
    """The revision is resolved and the tree listed once: the materializer is handed that
    listing (and still checks it against the digest) instead of asking the Hub again."""
    rig.artifact("org/model", FILES)
    rig.hub.seen.clear()
    code, _, err = await _pull(rig, "org/model")

    assert code == 0, err
    pages = [s for s in rig.hub.seen if "/tree/" in s.path]
    assert len(pages) == 2  # one listing: the rig's Hub pages the tree 3 entries at a time


async def test_a_second_pull_finds_the_tree_and_fetches_nothing(rig: Rig) -> None:
    rig.artifact("org/model", FILES)
    first = await _pull(rig, "org/model")
    fetched = len(_file_requests(rig.hub))
    second = await _pull(rig, "org/model")
    assert first[0] == second[0] == 0
    assert first[1] == second[1]
    assert len(_file_requests(rig.hub)) == fetched


async def test_patterns_pull_the_digest_of_the_kept_files_only(rig: Rig) -> None:
    rig.artifact("org/model", FILES)
    code, out, err = await _pull(rig, "org/model", "--ignore-pattern", "*.safetensors")
    kept = {p: c for p, c in FILES.items() if not p.endswith(".safetensors")}
    assert code == 0, err
    assert f"digest: {manifest_of(kept).digest}\n" in out
    tree = Path(out.split("path: ")[1].strip())
    assert _files(tree) == sorted(kept)


async def test_corrupt_bytes_fail_in_one_line_and_publish_nothing(rig: Rig) -> None:
    rig.artifact("org/model", FILES)
    rig.hub.corrupt.add("model-00002.safetensors")
    code, out, err = await _pull(rig, "org/model")
    assert code == 1
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "IntegrityMismatch" in err
    assert list((rig.settings.cache_root / "published").iterdir()) == []


@pytest.mark.parametrize(
    ("args", "env", "needle"),
    [
        (("org/missing",), {}, "AccessDenied"),
        (("org/model", "--revision", "nope"), {}, "RevisionNotFound"),
        (("org/model",), {"HF_HUB_OFFLINE": "1"}, "HF_HUB_OFFLINE"),
    ],
)
async def test_refusals_fail_in_one_line(
    rig: Rig, args: tuple[str, ...], env: dict[str, str], needle: str
) -> None:
    rig.artifact("org/model", FILES)
    code, out, err = await _pull(rig, *args, **env)
    assert (code, out) == (1, "")
    assert len(err.strip().splitlines()) == 1 and needle in err, err


async def test_bad_command_lines_exit_2(rig: Rig) -> None:
    for argv in (["mm", "pull"], ["mm", "pull", "../etc"], ["mm", "pull", "a/b", "--cache-root=x"]):
        result = await anyio.run_process([CLI, *argv], env=_env(), check=False)
        assert result.returncode == 2, argv
        assert len(result.stderr.decode().strip().splitlines()) == 1


@pytest.mark.parametrize(
    "endpoint", ["http://[::1", "http://hub:99999", "http://hub:port", "ftp://hub"]
)
async def test_a_malformed_endpoint_exits_2_in_one_line(endpoint: str) -> None:
    commands = (
        ["mm", "pull", "org/model", "--cache-root", "/nonexistent"],
        ["mm", "manifest", "org/model"],
    )
    for argv in commands:
        given = (([*argv, "--hf-endpoint", endpoint], _env()), (argv, _env(HF_ENDPOINT=endpoint)))
        for args, env in given:
            result = await anyio.run_process([CLI, *args], env=env, check=False)
            err = result.stderr.decode()
            assert result.returncode == 2, (args, err)
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


async def test_the_token_comes_from_the_legacy_variable(rig: Rig) -> None:
    rig.artifact("org/private", FILES, token="s3cret")
    denied = await _pull(rig, "org/private")
    code, _, err = await _pull(rig, "org/private", HUGGING_FACE_HUB_TOKEN="s3cret")
    assert denied[0] == 1 and "AccessDenied" in denied[2]
    assert code == 0, err


async def test_a_terminal_gets_a_progress_line_on_stderr(rig: Rig) -> None:
    rig.artifact("org/model", FILES)
    leader, follower = pty.openpty()
    try:
        argv = [CLI, "mm", "pull", "org/model", "--cache-root", str(rig.settings.cache_root)]
        result = await anyio.run_process(
            argv, env=_env(HF_ENDPOINT=rig.endpoints.hub), stderr=follower, check=False
        )
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert result.returncode == 0
    assert result.stdout.decode().startswith("commit: ")
    assert b"sha256:" in drawn and drawn.endswith(b"\r\x1b[K")


def test_the_model_agent_reads_the_hugging_face_environment(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("from-login\n")
    env = {"HF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1", "HTTPS_PROXY": "http://p:3128"}
    s = settings_from(options_for(("model-manager",), [], env))
    assert s.hub_token == "from-login"
    assert s.hub_env.offline and s.hub_env.https_proxy == "http://p:3128"
    legacy = settings_from(options_for(("model-manager",), [], {"HUGGING_FACE_HUB_TOKEN": "old"}))
    assert legacy.hub_token == "old"


async def test_the_one_shot_loads_no_service_stack() -> None:
    code = (
        "import sys, agent.models.pull; print(' '.join(sorted(m for m in ('nats', "
        "'prometheus_client', 'aiohttp', 'aiofiles', 'grpclib', 'kubernetes_asyncio', "
        "'bus.connection', 'kit.serving', 'kit.httpsettings', 'kit.listening', 'kit.gating', "
        "'kit.tls') if m in sys.modules)))"
    )
    result = await anyio.run_process([sys.executable, "-c", code], check=True)
    assert result.stdout.decode().strip() == ""


async def test_a_whole_pull_through_the_console_script_imports_no_service_stack(
    rig: Rig,
) -> None:
    """Not only the module: the command as run, start to exit (the launcher, its flags and
    logging, the pull, the seal, the output), loads none of the service stacks, YAML, the
    Kubernetes client or the metrics library, each of which would cost the one-shot's start;
    nor the standard modules it needs only on other paths (``fractions`` for a quantity,
    ``tempfile``/``shutil`` for a temporary file or a deleted tree, ``json`` for a JSON log
    line), each several ms of a start-up that is most of a small pull."""
    rig.artifact("org/model", FILES)
    forbidden = (
        "yaml", "prometheus_client", "kubernetes_asyncio", "aiohttp", "yarl", "grpclib",
        "nats", "aiofiles", "bus.connection", "kit.serving", "kit.httpsettings", "kit.listening",
        "kit.gating", "kit.tls", "controlplane",
        "fractions", "tempfile", "shutil", "json",
    )  # fmt: skip
    code = (
        "import atexit, sys\n"
        f"bad = {forbidden!r}\n"
        "atexit.register(lambda: print('loaded:', *sorted(m for m in bad if m in sys.modules),"
        " file=sys.stderr))\n"
        "sys.argv[0] = 'gpustack-operator'\n"
        "import gpustack_operator.main as m\n"
        "m.console()\n"
    )
    argv = [sys.executable, "-c", code, "mm", "pull", "org/model"]
    argv += ["--cache-root", str(rig.settings.cache_root)]
    result = await anyio.run_process(argv, env=_env(HF_ENDPOINT=rig.endpoints.hub), check=False)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    assert result.stdout.decode().startswith("commit: ")
    assert err.strip().splitlines()[-1] == "loaded:"
