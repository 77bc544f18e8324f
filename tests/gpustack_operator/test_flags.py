"""Go-style flag parsing: forms, booleans, durations, environment fallback, errors."""

from __future__ import annotations

import pytest

from gpustack_operator.flags import (
    Flag,
    FlagError,
    effective_cmdline,
    parse,
    parse_duration,
)
from gpustack_operator.helptext import flags_block

FLAGS = (
    Flag("manufacturer", "", "which"),
    Flag("no-shared", "false", "no shared", kind="bool"),
    Flag("monitor-period", "15s", "period", kind="duration"),
    Flag("v", "0", "verbosity", kind="int"),
    Flag("output", "yaml", "format", short="o", choices=("yaml", "json")),
    Flag("disable-applications", "", "apps", kind="list"),
)


def test_defaults_are_typed() -> None:
    parsed = parse([], FLAGS, env={})
    assert parsed.values == {
        "manufacturer": "",
        "no_shared": False,
        "monitor_period": 15.0,
        "v": 0,
        "output": "yaml",
        "disable_applications": (),
    }
    assert parsed.explicit == {}


@pytest.mark.parametrize(
    "argv",
    [
        ["--manufacturer=amd"],
        ["--manufacturer", "amd"],
        ["-manufacturer=amd"],
        ["-manufacturer", "amd"],
    ],
)
def test_single_and_double_dash_with_and_without_equals(argv: list[str]) -> None:
    assert parse(argv, FLAGS, env={}).values["manufacturer"] == "amd"


def test_bool_alone_is_true_and_takes_a_value_only_after_equals() -> None:
    parsed = parse(["--no-shared", "positional"], FLAGS, env={})
    assert parsed.values["no_shared"] is True
    assert parsed.positionals == ["positional"]
    assert parse(["--no-shared=false"], FLAGS, env={}).values["no_shared"] is False


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--v= 8"], "not an integer"), (["--v=1_6"], "not an integer"),
        (["--v=０８"], "not an integer"), (["--v=9223372036854775808"], "int64"),
        (["--no-shared=yes"], "not a boolean"), (["--no-shared=on"], "not a boolean"),
        (["--no-shared=y"], "not a boolean"), (["--no-shared= true"], "not a boolean"),
        ([f"--manufacturer={'a' * 4097}"], "at most 4096"),
    ],
)  # fmt: skip
def test_values_are_read_as_go_reads_them(argv: list[str], message: str) -> None:
    """One parser per type (kit.values), shared with the settings: each of these was accepted."""
    with pytest.raises(FlagError, match=message) as caught:
        parse(argv, FLAGS, env={})
    assert len(str(caught.value)) < 300  # a refused long value is quoted in part only
    good = parse(["--v=+7", "--no-shared=T"], FLAGS, env={}).values
    assert (good["v"], good["no_shared"]) == (7, True)


def test_klog_verbosity_forms() -> None:
    assert parse(["-v=3"], FLAGS, env={}).values["v"] == 3
    assert parse(["-v", "2"], FLAGS, env={}).values["v"] == 2
    assert parse(["--v=1"], FLAGS, env={}).values["v"] == 1


def test_short_option() -> None:
    assert parse(["-o", "json"], FLAGS, env={}).values["output"] == "json"
    assert parse(["-o=json"], FLAGS, env={}).values["output"] == "json"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("15s", 15.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), ("0", 0.0), ("1.5s", 1.5),
     (".5m", 30.0), ("2h45m30.5s", 9930.5), ("1us", 1e-6), ("7µs", 7e-6)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


# Go's time.ParseDuration refuses a bare number (only "0"), spaces and underscores: the old parser
# read "2" as 2 seconds and " 15s" as 15 seconds.
@pytest.mark.parametrize("text", ["", "15x", "s", "1h garbage", "-", "2", " 15s", "1_0s", "１s"])
def test_bad_durations_name_the_flag(text: str) -> None:
    with pytest.raises(FlagError, match="--monitor-period"):
        parse([f"--monitor-period={text}"], FLAGS, env={})


def test_environment_fills_unset_flags_and_the_command_line_wins() -> None:
    env = {"GPUSTACK_MANUFACTURER": "nvidia", "GPUSTACK_NO_SHARED": "true", "GPUSTACK_V": "2"}
    parsed = parse(["--v=4"], FLAGS, env=env)
    assert parsed.values["manufacturer"] == "nvidia"
    assert parsed.values["no_shared"] is True
    assert parsed.values["v"] == 4
    assert parsed.from_env == {"manufacturer", "no-shared"}


def test_bad_environment_value_is_an_error_naming_the_flag() -> None:
    with pytest.raises(FlagError, match="--no-shared"):
        parse([], FLAGS, env={"GPUSTACK_NO_SHARED": "maybe"})


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nope"], "unknown flag: --nope"),
        (["--manufacturer"], "flag needs an argument"),
        (["-o", "xml"], "must be one of yaml, json"),
        (["--v=two"], "invalid value 'two' for --v"),
    ],
)
def test_errors(argv: list[str], message: str) -> None:
    with pytest.raises(FlagError, match=message) as caught:
        parse(argv, FLAGS, env={})
    assert len(str(caught.value)) < 300  # a refused long value is quoted in part only


def test_list_flag_splits_on_commas() -> None:
    parsed = parse(["--disable-applications=kueue, model-manager,"], FLAGS, env={})
    assert parsed.values["disable_applications"] == ("kueue", "model-manager")


def test_effective_cmdline_includes_environment_values() -> None:
    parsed = parse(["-o", "json"], FLAGS, env={"GPUSTACK_MANUFACTURER": "amd nvidia"})
    line = effective_cmdline(("device-manager", "detect"), parsed)
    assert (
        line == "gpustack-operator device-manager detect '--manufacturer=amd nvidia' --output=json"
    )


def test_effective_cmdline_redacts_secret_flags_and_passwords_in_urls() -> None:
    flags = (
        Flag("nats-url", "", "servers"),
        Flag("nats-password", "", "password", secret=True),
        Flag("nats-token", "", "token", secret=True),
    )
    argv = ["--nats-url=nats://u:pw-1@h1:4222,nats://v:pw-2@h2", "--nats-password", "pw-3"]
    parsed = parse(argv, flags, env={"GPUSTACK_NATS_TOKEN": "pw-4"})
    assert parsed.values["nats_password"] == "pw-3" and parsed.values["nats_token"] == "pw-4"
    line = effective_cmdline(("bus", "watch"), parsed)
    assert line == (
        "gpustack-operator bus watch --nats-password=REDACTED --nats-token=REDACTED "
        "--nats-url=nats://u:REDACTED@h1:4222,nats://v:REDACTED@h2"
    )


def test_a_refused_secret_is_not_echoed() -> None:
    flags = (Flag("mode-token", "", "token", secret=True, choices=("", "on")),)
    with pytest.raises(FlagError) as refused:
        parse(["--mode-token=s3cret"], flags, env={})
    assert "s3cret" not in str(refused.value) and "REDACTED" in str(refused.value)


def test_help_lists_defaults_and_environment_names() -> None:
    text = "\n".join(flags_block(FLAGS, 200))
    assert "--monitor-period duration" in text and "(default 15s)" in text
    assert "$GPUSTACK_MONITOR_PERIOD" in text
    assert "-o, --output" in text
    assert "    -v " in text


def test_repeated_list_flag_accumulates() -> None:
    parsed = parse(["--disable-applications", "kueue", "--disable-applications=a,b"], FLAGS, env={})
    assert parsed.values["disable_applications"] == ("kueue", "a", "b")
