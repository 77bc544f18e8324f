"""Every flag a command accepts is read once by its settings builder, or says it has no effect.

The builders read flags through :class:`kit.options.Options` as typed structs, which counts each
read; a flag that nothing reads and that ``--help`` does not mark as inert would be silently
ignored, and one read twice would have two places deciding what it means. Only the edge (the
builders the command table names) sees ``Options`` at all, and nothing reads a flag by its name
as a string (an AST check over the production packages).
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gpustack_operator.commands import COMMANDS, GLOBAL_FLAGS, Command
from gpustack_operator.main import main, options_for
from kit.options import Flags, flag_name

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
    twice = {name: n for name, n in options.reads.items() if n != 1}
    assert twice == {}, "each flag is read by one place of its builder, once"


ROOT = Path(__file__).parents[2]
PACKAGES = ("gpustack_operator", "agent", "controlplane", "hub", "kit", "bus", "proto")
EDGE = {
    *(c.settings.partition(":")[0] for c in COMMANDS),
    "bus.settings",  # the --nats-* flags every NATS-speaking command shares
    "agent.settings",  # --node-name: the one node-name rule every agent's builder shares
    "kit.options",
    "gpustack_operator.main",
    "gpustack_operator.commands",
}
"""The modules that may see :class:`kit.options.Options`: the settings builders the command
table names, the one shared group reader, the launcher. Everything below gets settings."""
FLAG_NAMES = {f.name for c in COMMANDS for f in c.flags} | {f.name for f in GLOBAL_FLAGS}
_OLD_READS = {"text", "optional_text", "integer", "number", "seconds", "switch", "items"}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            out.append((name, ast.parse(path.read_text(), str(path))))
    return out


def _string_lookups(tree: ast.Module) -> list[str]:
    """Reads of a flag by its name: ``options.text("node-name")``, ``options.seconds(flag)``,
    ``options.get("node-name")`` (a receiver named ``*options*``, a typed-read method or a
    declared flag's name as its first argument)."""
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if "options" not in ast.unparse(node.func.value).lower():
            continue
        first = node.args[0] if node.args else None
        by_name = isinstance(first, ast.Constant) and first.value in FLAG_NAMES
        if node.func.attr in _OLD_READS or by_name:
            found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_no_flag_is_read_by_a_string_and_only_the_edge_sees_options() -> None:
    lookups = {name: hits for name, tree in _modules() if (hits := _string_lookups(tree))}
    assert lookups == {}
    seeing = set()
    for name, tree in _modules():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "kit.options"
                and any(alias.name == "Options" for alias in node.names)
            ):
                seeing.add(name)
    assert seeing - EDGE == set(), "below the edge: take the settings (or a Flags struct) instead"


def test_the_ast_check_finds_string_lookups() -> None:
    """The check above can fail: the reads this module replaced are found."""
    old = ast.parse(
        'a = options.text("node-name")\n'
        "b = options.seconds(flag)\n"
        'c = options.get("node-name")\n'
        'd = body.get("preconditions")\n'
    )
    assert len(_string_lookups(old)) == 3


def test_every_flags_struct_field_is_a_flag() -> None:
    """A :class:`kit.options.Flags` struct names flags as the command table spells them (a
    field no command has would be a KeyError at its read)."""
    structs = []
    for name, _ in _modules():
        if name in EDGE or name == "kit.httpsettings":
            module = importlib.import_module(name)
            structs += [
                v for v in vars(module).values()
                if isinstance(v, type) and issubclass(v, Flags) and v is not Flags
            ]  # fmt: skip
    assert len(structs) >= 10
    for struct in structs:
        fields = {flag_name(f) for f in struct.__struct_fields__}
        assert fields <= FLAG_NAMES, struct


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


def _mirrors() -> list[tuple[tuple[str, ...], str, type, str]]:
    """Struct defaults the command table cannot own: the structs live in layers below it that
    composing commands (``standalone``'s bus and worker) and most tests build without flags, and
    the table may not import them (``dm detect`` loads no service stack)."""
    from bus.settings import BusSettings
    from controlplane.worker.settings import WorkerSettings
    from kit.serving import HttpsSettings

    worker = ("worker",)
    return [
        (worker, "model-manager-service-account", WorkerSettings, "model_manager_service_account"),
        (worker, "nats-state-replicas", BusSettings, "state_replicas"),
        (worker, "nats-state-max-age", BusSettings, "state_max_age_s"),
        (worker, "bind-address", HttpsSettings, "bind_address"),
    ]


def test_struct_defaults_that_mirror_a_flag_agree_with_its_default() -> None:
    """Some settings structs keep a default for tests and composing commands (``standalone``)
    where a flag feeds the field; the command table's default is the one that counts, so each
    such struct default must say the same (drift fails here, not in a deployment)."""
    import dataclasses

    import msgspec

    from gpustack_operator.flags import convert

    for path, flag_name_, struct, field in _mirrors():
        command = next(c for c in COMMANDS if c.path == path)
        flag = next(f for f in command.flags if f.name == flag_name_)
        if dataclasses.is_dataclass(struct):
            default = next(f.default for f in dataclasses.fields(struct) if f.name == field)
        else:
            default = next(f.default for f in msgspec.structs.fields(struct) if f.name == field)
        assert default == convert(flag, flag.default), (struct.__name__, field)


def test_fields_a_builder_fills_from_a_flag_have_no_default_of_their_own() -> None:
    """Each default written once: the fields these structs fill from a flag have no default of
    their own, so the command table's is the only one (tests say their values through
    ``for_tests`` or explicitly)."""
    import dataclasses

    import msgspec

    from agent.deviceplugin.settings import DevicePluginSettings
    from agent.serve.settings import ServeSettings
    from controlplane.gateway.settings import GatewaySettings, Upstream
    from controlplane.k8s.client import KubeSettings
    from controlplane.worker.leading import LeaderSettings

    plugin = {f.name: f.default for f in dataclasses.fields(DevicePluginSettings)}
    assert all(
        plugin[f] is dataclasses.MISSING for f in ("no_shared", "no_sliced", "no_partitioned")
    )
    required = {
        ServeSettings: ("state_dir", "metrics_http_port", "metrics_names"),
        Upstream: ("port", "timeout_s", "qps", "burst"),
        GatewaySettings: ("readiness_timeout_s", "relist_s"),
        LeaderSettings: ("name", "namespace", "lease_s", "renew_timeout_s"),
        KubeSettings: ("qps", "burst", "timeout_s", "relist_s"),
    }
    for struct, names in required.items():
        fields = {f.name: f for f in msgspec.structs.fields(struct)}
        assert all(fields[n].required for n in names), struct.__name__


@pytest.mark.parametrize(
    ("argv", "elects"), [([], True), (["--kube-leader-election=false"], False)]
)
def test_the_worker_elects_a_leader_with_the_flags_lease_unless_told_not_to(
    argv: list[str], elects: bool, tmp_path: Path
) -> None:
    from controlplane.worker.settings import settings_from

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    env = {"KUBECONFIG": str(kubeconfig)}
    leader = settings_from(options_for(("worker",), argv, env)).leader
    if not elects:
        assert leader is None
        return
    assert leader is not None
    assert (leader.name, leader.lease_s, leader.renew_timeout_s) == ("worker.gpustack.ai", 15, 10)


def test_one_flag_name_has_one_default_across_commands() -> None:
    """A flag several commands take means the same everywhere, default included; only each
    command's own port, address, state directory and output format differ by design."""
    by_name: dict[str, set[str]] = {}
    for command in COMMANDS:
        for flag in command.flags:
            by_name.setdefault(flag.name, set()).add(flag.default)
    differing = {name for name, defaults in by_name.items() if len(defaults) > 1}
    assert differing == {"secure-port", "bind-address", "state-dir", "output"}


def test_standalone_ports_are_the_commands_own() -> None:
    def default(path: tuple[str, ...], name: str) -> str:
        command = next(c for c in COMMANDS if c.path == path)
        return next(f.default for f in command.flags if f.name == name)

    standalone = ("standalone",)
    assert default(standalone, "worker-port") == default(("worker",), "secure-port")
    assert default(standalone, "device-manager-port") == default(
        ("device-manager", "serve"), "secure-port"
    )
    assert default(standalone, "model-manager-port") == default(("model-manager",), "secure-port")
