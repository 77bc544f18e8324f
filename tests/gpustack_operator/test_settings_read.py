"""Every flag a command accepts is read by its settings builder, or says it has no effect.

The builders read flags through :class:`kit.options.Options`, which records each read; a flag
that nothing reads and that ``--help`` does not mark as inert would be silently ignored.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpustack_operator.commands import COMMANDS, GLOBAL_FLAGS, Command
from gpustack_operator.main import main, options_for

BUILT = list(COMMANDS)


def _builder(command: Command) -> Callable[..., Any]:
    assert command.settings is not None
    module, _, name = command.settings.partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def _argv(command: Command, tmp_path: Path) -> list[str]:
    """The least a command needs to build its settings on a machine with no kubelet."""
    argv = ["org/model"] if command.usage else []
    names = {f.name for f in command.flags}
    if "kube-socket" in names:
        argv.append(f"--kube-socket={tmp_path}/kubelet.sock")
    if "worker-conn-mode" in names:
        argv.append("--worker-conn-mode=loopback")  # gpustack-api is refused (not built)
    return argv


@pytest.mark.parametrize("command", BUILT, ids=lambda c: " ".join(c.path))
def test_every_live_flag_is_read(command: Command, tmp_path: Path) -> None:
    options = options_for(command.path, _argv(command, tmp_path), {})
    _builder(command)(options)
    live = {f.name for f in command.flags if not f.inert}
    assert live - options.read == set(), "flags nothing reads: mark them inert or read them"
    inert = {f.name for f in command.flags if f.inert}
    assert inert & options.read == set(), "a flag marked inert is read after all"


@pytest.mark.parametrize("command", BUILT, ids=lambda c: " ".join(c.path))
def test_the_launcher_handles_the_global_flags(command: Command) -> None:
    names = {f.name for f in command.flags}
    assert names.isdisjoint(f.name for f in GLOBAL_FLAGS)


def test_every_command_is_built() -> None:
    for command in COMMANDS:
        runs = (command.service is not None) + (command.oneshot is not None)
        assert runs == 1, command.path


def test_inert_flags_say_so_in_help(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "1000")  # one line per flag
    assert main(["device-manager", "serve", "--help"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "--kube-conn-qps" in ln]
    assert len(lines) == 1 and "has no effect" in lines[0]


def test_worker_help_has_no_flag_that_does_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--audit-log-path" in out and "has no effect" not in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["worker", "--secure-port=-1"], "--secure-port"),
        (["worker", "--secure-port=70000"], "--secure-port"),
        (["standalone", "--nats-port=99999"], "--nats-port"),
        (["standalone", "--worker-port=-3"], "--worker-port"),
        (["worker", "--nats-state-replicas=0"], "--nats-state-replicas"),
        (["dm", "serve", "--monitor-period=-5s"], "--monitor-period"),
        (["worker", "--kube-conn-qps=nan"], "--kube-conn-qps"),
        (["mm", "manifest", "../../etc"], "repository"),
        (["mm", "manifest", "org/m", "--hf-endpoint=not-a-url"], "http(s) URL"),
        (["dm", "serve", "stray"], "unexpected arguments"),
        (["dm", "detect", "--manufacturer=nvidai"], "--manufacturer"),
        (["mm", "--node-name=a*b"], "not a Kubernetes node name"),
        (["mm", "--node-name=bad node>"], "not a Kubernetes node name"),
        (["worker", "--bind-address=not-an-ip"], "--bind-address"),
        (["worker", "--kubeconfig=none"], "--metrics-auth=none"),
        (["worker", "--metrics-auth=open"], "--metrics-auth"),
        (["standalone", "--metrics-auth=none"], "--metrics-auth"),
        (["worker", "--webhook-service=Worker_Svc"], "--webhook-service"),
        (["worker", "--disable-auths"], "--disable-auths"),
        (["worker", "--manufacturer=nvidai"], "--manufacturer"),
        (["worker", "--disable-applications=kueue,helm"], "--disable-applications"),
        (["worker", "--cors-allowed-origins=(unclosed"], "--cors-allowed-origins"),
        (["worker", "--audit-policy-file=/nonexistent"], "--audit-policy-file"),
        (["worker", "--audit-webhook-config-file=/nonexistent"], "--audit-webhook-config-file"),
        (["worker", "--gopool-worker-factor=0"], "--gopool-worker-factor"),
        (["worker", "--model-manager-service-account=Bad_Name"], "--model-manager-service-account"),
        (["mm", "--cert-dir=/nonexistent"], "--cert-dir"),
        (["worker", "--nats-url=not a url"], "--nats-url"),
        (["worker", "--nats-url=http://bus:4222"], "--nats-url"),
        (["bus", "watch", "--nats-url=nats://bus:99999"], "--nats-url"),
        (["bus", "watch", "--node=a", "--subject=gpustack.v1.node.b.health"], "exclude"),
        (["bus", "watch", "--subject=other.subject"], "--subject"),
    ],
)
def test_bad_values_exit_2_with_one_line_naming_the_problem(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], captured.err


def test_port_zero_means_any_free_port_not_the_default() -> None:
    from agent.models.settings import settings_from

    settings = settings_from(options_for(("model-manager",), ["--secure-port=0"]))
    assert settings.https.port == 0


def test_an_invalid_setting_seed_stops_the_worker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUSTACK_MODEL_ARTIFACT_HTTPS_PROXY", "http://user:secret@proxy:3128")
    assert main(["worker"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "credentials" in err[0] and "secret" not in err[0]
