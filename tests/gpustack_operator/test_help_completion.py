"""``help``, ``--help`` and ``completion`` as a kubectl (cobra) user drives them, through the
installed console script; bash completion is sourced into a real bash and driven as bash
drives it on a Tab (``COMP_WORDS``/``COMP_CWORD`` in, ``COMPREPLY`` out)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpustack_operator import flags, main
from gpustack_operator.commands import ALIASES, COMMANDS, GLOBAL_FLAGS

CLI = shutil.which("gpustack-operator", path=os.path.dirname(sys.executable)) or "gpustack-operator"


def run(*args: str, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSTACK_")}
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [CLI, *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


@pytest.mark.parametrize("args", [(), ("--help",), ("-h",), ("help",)])
def test_the_overview_is_on_stdout_and_exits_0(args: tuple[str, ...]) -> None:
    """As ``kubectl`` alone and ``kubectl --help``: usage on stdout, exit 0."""
    result = run(*args)
    assert result.returncode == 0 and result.stderr == ""
    assert "Available Commands:" in result.stdout
    for command in COMMANDS:
        assert " ".join(command.path) in result.stdout
    assert "completion" in result.stdout and "help" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("dm", "detect", "--help"),
        ("device-manager", "detect", "-h"),
        ("help", "dm", "detect"),
        ("help", "device-manager", "detect"),
    ],
)
def test_a_commands_help_every_way_exits_0(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Run one detect pass")
    assert "Examples:" in result.stdout and "gpustack-operator dm detect -o wide" in result.stdout


def test_group_help_lists_its_subcommands_and_a_bare_group_is_a_usage_error() -> None:
    for args in (("dm", "--help"), ("help", "dm"), ("help", "device-manager")):
        shown = run(*args)
        assert shown.returncode == 0 and shown.stderr == ""
        assert "Available Commands:" in shown.stdout
        assert all(sub in shown.stdout for sub in ("serve", "detect", "monitor", "preflight"))
    bare = run("dm")
    assert bare.returncode == 2 and bare.stdout == "" and "Available Commands:" in bare.stderr


def test_model_manager_help_shows_its_own_flags_and_its_subcommands() -> None:
    result = run("mm", "--help")
    assert result.returncode == 0
    assert "--cache-root string" in result.stdout and "manifest" in result.stdout


@pytest.mark.parametrize("args", [("help", "bogus"), ("bogus",), ("-v=2",), ("help", "dm", "x")])
def test_unknown_topics_and_commands_are_one_line_usage_errors(args: tuple[str, ...]) -> None:
    result = run(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert "Run 'gpustack-operator --help'" in result.stderr
    assert len(result.stderr.splitlines()) == 2


def test_flags_show_typed_placeholders_as_cobra_prints_them() -> None:
    text = run("dm", "serve", "--help", columns=200).stdout
    assert "--monitor-period duration" in text
    assert "--secure-port int" in text
    assert "--kube-socket string" in text
    assert "--cors-allowed-origins strings" in run("worker", "--help", columns=200).stdout
    assert "--no-shared " in text and "--no-shared bool" not in text  # a switch takes no value
    assert '(default "/var/lib/kubelet/device-plugins/kubelet.sock")' in text
    assert "(default 15s)" in text


def test_choices_are_listed_without_an_empty_one() -> None:
    text = run("bus", "watch", "--help", columns=300).stdout
    assert "(one of: devices, samples, health, allocations, models, agent)" in text


@pytest.mark.parametrize("columns", [40, 80, 123])
def test_every_help_fits_the_terminal_width_but_for_unbreakable_tokens(columns: int) -> None:
    pages = [run("--help", columns=columns).stdout]
    pages += [run(*c.path, "--help", columns=columns).stdout for c in COMMANDS]
    for page in pages:
        for line in page.splitlines():
            if len(line) > columns:  # a single token alone on its line, after its indent
                assert len(line.split()) == 1, (columns, line)


def test_width_defaults_to_80_off_a_terminal() -> None:
    lines = run("worker", "--help").stdout.splitlines()
    widest = max(len(line) for line in lines if len(line.split()) > 1)
    assert 70 < widest <= 80


def test_every_command_has_examples_that_name_it() -> None:
    reverse = {v: k for k, v in ALIASES.items()}
    for command in COMMANDS:
        text = run(*command.path, "--help", columns=200).stdout
        assert "Examples:" in text, command.path
        named = {
            " ".join(command.path),
            " ".join((reverse.get(command.path[0], ""), *command.path[1:])),
        }
        assert any(f"gpustack-operator {n}" in text for n in named), command.path


def test_completion_needs_a_known_shell() -> None:
    assert run("completion").returncode == 2
    assert run("completion", "tcsh").returncode == 2
    assert run("completion", "--help").returncode == 0


BASH = shutil.which("bash")


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers on Tab after ``words`` (the last one is being completed)."""
    assert BASH is not None
    array = " ".join(f"'{w}'" for w in ("gpustack-operator", *words))
    driver = (
        f"source {script}\n"
        f"COMP_WORDS=({array}); COMP_CWORD=$((${{#COMP_WORDS[@]}} - 1)); COMPREPLY=()\n"
        "_gpustack_operator\n"
        'printf "%s\\n" "${COMPREPLY[@]}"\n'
    )
    done = subprocess.run(
        [BASH, "--norc", "--noprofile", "-c", driver],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert done.stderr == ""
    return [w for w in done.stdout.splitlines() if w]


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if BASH is None:
        pytest.skip("no bash")
    result = run("completion", "bash")
    assert result.returncode == 0
    path = tmp_path_factory.mktemp("completion") / "gpustack-operator.bash"
    path.write_text(result.stdout)
    check = subprocess.run([BASH, "-n", str(path)], capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr
    return path


def test_bash_completes_commands_aliases_and_builtins(bash_script: Path) -> None:
    top = complete(bash_script, "")
    assert {"worker", "device-manager", "bus", "dm", "mm", "wg", "help", "completion"} <= set(top)
    assert complete(bash_script, "d") == ["device-manager", "dashboard", "dm"]
    assert complete(bash_script, "completion", "") == ["bash", "zsh", "fish"]


def test_bash_completes_subcommands_through_aliases_and_leading_flags(bash_script: Path) -> None:
    assert complete(bash_script, "dm", "") == ["serve", "detect", "monitor", "preflight"]
    assert complete(bash_script, "-v", "2", "dm", "mon") == ["monitor"]
    assert complete(bash_script, "bus", "") == ["watch", "schema"]
    assert {"manifest", "pull", "--cache-root"} <= set(complete(bash_script, "mm", ""))


def test_bash_completes_flags_and_their_choices(bash_script: Path) -> None:
    assert complete(bash_script, "dm", "detect", "--o") == ["--output"]
    outputs = ["yaml", "json", "wide", "name"]
    assert complete(bash_script, "dm", "detect", "-o", "") == outputs
    assert complete(bash_script, "dm", "detect", "--output", "=", "") == outputs
    kinds = complete(bash_script, "bus", "watch", "--kind", "")
    assert kinds == ["devices", "samples", "health", "allocations", "models", "agent"]
    assert complete(bash_script, "mm", "manifest", "Qwen/X", "--rev") == ["--revision"]
    assert complete(bash_script, "dm", "serve", "--monitor-period", "") == []  # a value, no flag
    assert "--vmodule" in complete(bash_script, "worker", "--v")


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_zsh_and_fish_scripts(shell: str, tmp_path: Path) -> None:
    """Parsed by the shell itself where it is installed; else checked for their structure."""
    result = run("completion", shell)
    assert result.returncode == 0
    script = tmp_path / f"completion.{shell}"
    script.write_text(result.stdout)
    binary = shutil.which(shell)
    if binary is not None:
        check = subprocess.run(
            [binary, "-n", str(script)], capture_output=True, text=True, timeout=30, check=False
        )
        assert check.returncode == 0, check.stderr
    if shell == "zsh":
        assert result.stdout.startswith("#compdef gpustack-operator")
        assert "bashcompinit" in result.stdout and "complete -o default -F" in result.stdout
    else:
        lines = result.stdout.splitlines()
        assert all(line.startswith(("#", "complete -c gpustack-operator")) for line in lines)
        assert any("-a dm " in line for line in lines)
        assert any("-l output -s o -x -a 'yaml json wide name'" in line for line in lines)


def _script(shell: str, tmp_path: Path) -> Path:
    result = run("completion", shell)
    assert result.returncode == 0
    path = tmp_path / f"completion.{shell}"
    path.write_text(result.stdout)
    return path


@pytest.mark.skipif(shutil.which("fish") is None, reason="fish is not installed")
def test_fish_completes_as_fish_itself_asks(tmp_path: Path) -> None:
    """``complete -C`` is fish's own query: what a Tab would offer on that command line."""
    script = _script("fish", tmp_path)

    def offers(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C '{line}'"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={**os.environ, "HOME": str(tmp_path)},
        )
        return [w.split("\t")[0] for w in done.stdout.splitlines()]

    assert sorted(offers("gpustack-operator dm ")) == ["detect", "monitor", "preflight", "serve"]
    assert sorted(offers("gpustack-operator dm detect -o ")) == ["json", "name", "wide", "yaml"]
    assert offers("gpustack-operator bus watch --ki") == ["--kind"]
    assert {"worker", "dm", "help", "completion"} <= set(offers("gpustack-operator "))


@pytest.mark.skipif(shutil.which("zsh") is None, reason="zsh is not installed")
def test_zsh_completes_through_bashcompinit(tmp_path: Path) -> None:
    """Called as bashcompinit calls a bash completion function (``emulate -L sh``)."""
    script = _script("zsh", tmp_path)
    driver = (
        f"source {script}\n"
        'f() { emulate -L sh; COMP_WORDS=(gpustack-operator "$@"); '
        "COMP_CWORD=$((${#COMP_WORDS[@]} - 1)); _gpustack_operator; "
        'printf "%s\\n" "${COMPREPLY[@]}"; }\n'
        "f dm ''\necho ---\nf dm detect -o ''\n"
    )
    done = subprocess.run(
        ["zsh", "-f", "-c", driver],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env={**os.environ, "HOME": str(tmp_path)},
    )
    subs, outputs = done.stdout.split("---\n")
    assert subs.split() == ["serve", "detect", "monitor", "preflight"]
    assert outputs.split() == ["yaml", "json", "wide", "name"]


def test_the_readme_commands_table_names_every_command_and_alias() -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme[readme.index("## Commands") :].split("\n\n", 2)[1]
    rows = [r for r in table.splitlines() if r.startswith("| `")]
    shown = {r.split("`")[1].split(" REPO")[0] for r in rows}
    expected = {" ".join(c.path) for c in COMMANDS}
    assert expected <= shown, expected - shown
    assert any(s.startswith("help") for s in shown) and any(
        s.startswith("completion") for s in shown
    )
    for alias, full in ALIASES.items():
        assert any(f"| `{alias}" in r for r in rows if r.startswith(f"| `{full}")), alias


def test_every_example_is_a_command_line_its_command_accepts() -> None:
    """Each example names its own command and only flags (and values) that command takes."""
    for command in COMMANDS:
        lines = [ln for ln in command.examples.splitlines() if ln and not ln.startswith("#")]
        assert lines, command.path
        for line in lines:
            words = shlex.split(line.split(" | ")[0])
            assert words[0] == "gpustack-operator", line
            found, rest = main.find_command(words[1:])
            assert found.path == command.path, line
            parsed = flags.parse(rest, (*found.flags, *GLOBAL_FLAGS), env={})
            assert len(parsed.positionals) == (1 if command.usage else 0), line
