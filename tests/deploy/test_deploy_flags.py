"""Every flag and environment variable the manifests pass to ``gpustack-operator`` is one the
command accepts, as its ``--help`` lists them (``--flag ... [$GPUSTACK_FLAG]``).

Environment variables that are not ours are allowed only from a short list, each with a reason:
they are read by something other than the binary.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest
from deploy_helpers import BASE, INSTALLS, build, find, help_text, pod_spec, workloads

from agent.devices.manufacturers import MANUFACTURERS
from gpustack_operator import commands
from gpustack_operator import flags as flagparsing
from gpustack_operator import main as launcher

# Read by the container runtime, not by the binary.
FOREIGN_ENV = {
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "MTHREADS_VISIBLE_DEVICES",
    "MTHREADS_DRIVER_CAPABILITIES",
}
SUBCOMMANDS = {("device-manager",): 2, ("dm",): 2, ("bus",): 2}
AGENTS = (
    *(f"gpustack-operator-device-manager-{m}" for m in sorted(MANUFACTURERS)),
    "gpustack-operator-model-manager",
)
NODE = "node-under-test"


def _command(args: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """Split container args into the command path and its flags."""
    width = SUBCOMMANDS.get((args[0],), 1)
    return tuple(args[:width]), args[width:]


def _operator_containers(tree: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{obj['metadata']['name']}/{c['name']}", c)
        for obj in workloads(build(tree))
        for c in pod_spec(obj).get("containers", [])
        if c["image"].startswith("gpustack/gpustack-operator")
    ]


def _flag_names(text: str) -> set[str]:
    return set(re.findall(r"^\s+(-{1,2}[\w-]+)\s", text, re.MULTILINE))


def _env_names(text: str) -> set[str]:
    return set(re.findall(r"\$([A-Z][A-Z0-9_]*)", text))


def test_help_parsing_finds_flags_and_env() -> None:
    text = help_text(("device-manager", "serve"))
    assert {"--manufacturer", "--nats-url", "-v"} <= _flag_names(text)
    assert {"GPUSTACK_MANUFACTURER", "GPUSTACK_NATS_URL", "KUBERNETES_NODE_NAME"} <= _env_names(
        text
    )
    assert "--no-such-flag" not in _flag_names(text)


@pytest.mark.parametrize("tree", INSTALLS)
def test_every_flag_passed_is_accepted(tree: str) -> None:
    containers = _operator_containers(tree)
    assert containers
    for where, c in containers:
        assert "command" not in c, f"{where}: the image's entrypoint is the binary"
        path, flags = _command(c["args"])
        accepted = _flag_names(help_text(path))
        for flag in flags:
            name = flag.split("=", 1)[0]
            assert name in accepted, f"{where}: {' '.join(path)} does not accept {name}"


@pytest.mark.parametrize("tree", INSTALLS)
def test_every_env_var_passed_is_accepted(tree: str) -> None:
    for where, c in _operator_containers(tree):
        path, _ = _command(c["args"])
        accepted = _env_names(help_text(path)) | FOREIGN_ENV
        for env in c.get("env", []):
            assert env["name"] in accepted, f"{where}: {' '.join(path)} ignores ${env['name']}"


@pytest.mark.parametrize("tree", INSTALLS)
def test_flags_and_env_do_not_say_the_same_thing_twice(tree: str) -> None:
    for where, c in _operator_containers(tree):
        _, flags = _command(c["args"])
        from_flags = {f.split("=", 1)[0].lstrip("-") for f in flags}
        from_env = {
            e["name"].removeprefix("GPUSTACK_").lower().replace("_", "-")
            for e in c.get("env", [])
            if e["name"].startswith("GPUSTACK_")
        }
        assert not from_flags & from_env, f"{where}: set twice: {from_flags & from_env}"


def test_values_parse_as_the_command_expects() -> None:
    """The launcher's own parser accepts each container's flags and literal env values (kinds,
    durations, choices), without running the service."""
    for where, c in _operator_containers(BASE):
        path, flags = _command(c["args"])
        env = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
        command, rest = launcher.find_command([*path, *flags])
        assert command.path == path, where
        try:
            parsed = flagparsing.parse(rest, (*command.flags, *commands.GLOBAL_FLAGS), env)
        except flagparsing.FlagError as e:  # pragma: no cover - the failure path
            pytest.fail(f"{where}: {e}")
        assert parsed.positionals == [], where


def _resolved(env: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment as the kubelet would set it on node ``NODE``."""
    out: dict[str, str] = {}
    for e in env:
        if "value" in e:
            out[e["name"]] = e["value"]
        elif e["valueFrom"].get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
            out[e["name"]] = NODE
        else:
            out[e["name"]] = "from-a-secret"
    return out


def _mounted(c: dict[str, Any], env: dict[str, str], root: Path) -> dict[str, str]:
    """``env`` with each file a ``*_FILE`` variable names laid out under ``root``, as the
    container's volumes provide it in the pod; the settings builder checks that it exists. A
    file no volume mount holds fails the test: in the pod it would not exist either."""
    mounts = [m["mountPath"].rstrip("/") + "/" for m in c.get("volumeMounts", [])]
    out = dict(env)
    for name, value in env.items():
        if not name.endswith("_FILE"):
            continue
        assert any(value.startswith(m) for m in mounts), f"{name}={value}: on no volume mount"
        path = root / value.lstrip("/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("a projected token\n")
        out[name] = str(path)
    return out


@pytest.mark.parametrize("tree", INSTALLS)
@pytest.mark.parametrize("agent", AGENTS)
def test_agents_take_the_node_name_from_the_downward_api(
    tree: str, agent: str, tmp_path: Path
) -> None:
    """``KUBERNETES_NODE_NAME`` from ``spec.nodeName``, nothing that overrides it, and the
    command's own settings builder ends up with that node (not the pod's host name)."""
    spec = pod_spec(find(build(tree), "DaemonSet", agent))
    (c,) = [c for c in spec["containers"] if c["image"].startswith("gpustack/gpustack-operator")]
    env = {e["name"]: e for e in c["env"]}
    assert env["KUBERNETES_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert not {"NODE_NAME", "GPUSTACK_NODE_NAME"} & set(env)
    assert not any(a.startswith("--node-name") for a in c["args"])
    command, rest = launcher.find_command(c["args"])
    by_flag = [a for a in rest if a.startswith(("--nats-token-file", "--nats-tls", "--nats-creds"))]
    assert not by_flag, f"{by_flag}: a file by flag; _mounted lays out only *_FILE variables"
    options = launcher.options_for(command.path, rest, _mounted(c, _resolved(c["env"]), tmp_path))
    module, _, function = command.settings.partition(":")
    settings = getattr(importlib.import_module(module), function)(options)
    assert settings.node_name == NODE
