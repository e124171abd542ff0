"""``--format github`` read the way the GitHub Actions runner reads it.

``RunnerLog`` is a port of the runner's workflow-command handling, from
actions/runner at 258d6c857db3519913f7deb6004b60172f8043ae:

- src/Runner.Sdk/ProcessInvoker.cs, ``StartReadStream``: stdout and stderr
  are read with ``StreamReader.ReadLine``, so a line ends at CR, LF or CRLF.
- src/Runner.Worker/Handlers/OutputManager.cs, ``OnDataReceived``: a
  non-empty line holding ``##[`` or ``::`` goes to the command manager;
  every other line is plain output.
- src/Runner.Common/ActionCommand.cs, ``TryParseV2``: after ``TrimStart``
  the line starts with ``::``; the command info runs to the next ``::``;
  the name ends at the first space and must be registered (ignoring case);
  properties are split on ``,`` then once on ``=`` (empty pieces dropped)
  and unescape ``%0D %0A %3A %2C %25`` in that order; the data after the
  ``::`` unescapes ``%0D %0A %25``. ``TryParse`` (v1, tried when v2 fails):
  ``##[`` anywhere, command info up to the next ``]``, properties split on
  ``;``, unescaping ``%3B %0D %0A %5D %25``.
- src/Runner.Worker/ActionCommandManager.cs, ``TryProcessCommand``: the
  registered names (``stop-commands`` and the extensions' ``Command``
  values in that file); after ``::stop-commands::<token>`` (the token must
  be non-empty, unregistered and not ``pause-logging``) nothing is a command
  but ``<token>``, which resumes.

The tests feed the checker's output to it with hostile file names (``%``,
``,``, ``:``, CR, LF, ``\\x01``, ``::``, ``##[``, and names that are
themselves workflow commands) and require that only the annotations the
checker meant are commands.
"""

from __future__ import annotations

import io
import re
from dataclasses import asdict, dataclass, field

import pytest
from gatekit import Repo
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt_contracts.reporters import github
from niels_gpt_contracts.reporters.common import printable
from niels_gpt_contracts.result import BROKEN, KEPT, Outcome, Result, Violation

PR = ("--stage", "alpha", "--base", "main", "--head", "HEAD", "--no-api")

# ActionCommandManager.cs: "stop-commands" and every IActionCommandExtension's
# Command ("internal-set-repo-path" is registered only for runner plugins).
REGISTERED = frozenset(
    {
        "stop-commands",
        "set-env",
        "set-output",
        "save-state",
        "add-mask",
        "add-path",
        "add-matcher",
        "remove-matcher",
        "debug",
        "warning",
        "error",
        "notice",
        "group",
        "endgroup",
        "echo",
    }
)
# .NET char.IsWhiteSpace: what String.TrimStart and String.Trim remove.
DOTNET_SPACE = "\t\n\v\f\r \x85\xa0\u1680" + "".join(map(chr, range(0x2000, 0x200B)))
DOTNET_SPACE += "\u2028\u2029\u202f\u205f\u3000"
PROPERTY_ESCAPES = (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%"))
DATA_ESCAPES = (("%0D", "\r"), ("%0A", "\n"), ("%25", "%"))
V1_ESCAPES = (("%3B", ";"), ("%0D", "\r"), ("%0A", "\n"), ("%5D", "]"), ("%25", "%"))

HOSTILE = (
    "100%.txt",
    "a,b.txt",
    "a:b.txt",
    "carriage\rreturn.txt",
    "line\nfeed.txt",
    "control\x01.txt",
    "::",
    "::warning title=injected::x.md",
    "##[warning]v1.txt",
    "%0A::error::pre-escaped.txt",
    " \t::notice::indented.txt",
)


@dataclass
class Command:
    name: str
    properties: dict[str, str]
    data: str


@dataclass
class RunnerLog:
    """What the runner makes of a step's output: commands and plain lines."""

    commands: list[Command] = field(default_factory=list)
    output: list[str] = field(default_factory=list)
    registered: set[str] = field(default_factory=lambda: set(REGISTERED))
    stop_token: str | None = None

    def feed(self, stream: str) -> RunnerLog:
        lines = re.split(r"\r\n|\r|\n", stream)
        if lines[-1] == "":
            lines.pop()  # ReadLine returns no empty line after the final terminator
        for line in lines:
            if not (line and ("##[" in line or "::" in line) and self._process(line)):
                self.output.append(line)
        return self

    def _process(self, line: str) -> bool:
        command = _parse_v2(line, self.registered) or _parse_v1(line, self.registered)
        if command is None:
            return False
        name = command.name.lower()
        if self.stop_token is not None:
            if name != self.stop_token.lower():
                return False
            self.registered.discard(self.stop_token.lower())
            self.stop_token = None
        elif name == "stop-commands":
            token = command.data
            assert token and token.lower() not in self.registered | {"pause-logging"}, token
            self.stop_token = token
            self.registered.add(token.lower())
        self.commands.append(command)
        return True


def _unescape(value: str, escapes: tuple[tuple[str, str], ...]) -> str:
    for escaped, raw in escapes:
        value = value.replace(escaped, raw)
    return value


def _split_once(text: str, sep: str) -> list[str]:
    """.NET ``Split(sep, count: 2, RemoveEmptyEntries)``."""
    head, found, rest = text.partition(sep)
    while found and not head:  # empty leading pieces are dropped, not counted
        head, found, rest = rest.partition(sep)
    return [p for p in ((head, rest) if found else (head,)) if p]


def _command(
    info: str, data: str, sep: str, escapes: tuple[tuple[str, str], ...], registered: set[str]
) -> Command | None:
    space = info.find(" ")
    name = info if space < 0 else info[:space]
    if name.lower() not in registered:
        return None
    properties: dict[str, str] = {}
    if space > 0:
        rest = info[space + 1 :]
        if sep == ",":
            rest = rest.strip(DOTNET_SPACE)
        for prop in filter(None, rest.split(sep)):
            pair = _split_once(prop, "=")
            if len(pair) == 2:
                properties[pair[0].lower()] = _unescape(pair[1], escapes)
    return Command(name, properties, data)


def _parse_v2(line: str, registered: set[str]) -> Command | None:
    message = line.lstrip(DOTNET_SPACE)
    if not message.startswith("::"):
        return None
    end = message.find("::", 2)
    if end < 0:
        return None
    data = _unescape(message[end + 2 :], DATA_ESCAPES)
    return _command(message[2:end], data, ",", PROPERTY_ESCAPES, registered)


def _parse_v1(line: str, registered: set[str]) -> Command | None:
    start = line.find("##[")
    end = line.find("]", start) if start >= 0 else -1
    if end < 0:
        return None
    data = _unescape(line[end + 1 :], V1_ESCAPES)
    return _command(line[start + 3 : end], data, ";", V1_ESCAPES, registered)


def runner(stdout: str, stderr: str = "") -> RunnerLog:
    return RunnerLog().feed(stderr).feed(stdout)


def _expected_shown(text: str) -> str:
    """How the checker shows untrusted text in an annotation."""
    return printable(text).replace("##[", "##\\x5b")


# --- the port itself must see injections --------------------------------------


def test_the_port_sees_what_the_runner_would_run() -> None:
    raw = (
        "  ::warning title=injected::x.md: path.not-allowed\n"
        "prefix ##[error]v1 anywhere in a line\n"
        "one line\r::set-output name=a::b after a bare CR\n"
        "::error file=a%2Cb%3A%0A.txt,line=3::50%25 done%0Anext\n"
        "::unknown::not registered\n"
        "::stop-commands::t0k3n\n"
        "::warning::inside the stop\n"
        "::T0K3N::\n"
        "::notice::after it\n"
    )
    log = runner(raw)
    assert [c.name for c in log.commands] == [
        "warning",
        "error",
        "set-output",
        "error",
        "stop-commands",
        "T0K3N",
        "notice",
    ]
    assert log.commands[3].properties == {"file": "a,b:\n.txt", "line": "3"}
    assert log.commands[3].data == "50% done\nnext"
    assert log.output == [
        "one line",
        "::unknown::not registered",
        "::warning::inside the stop",
    ]


# --- the checker's output -----------------------------------------------------


def _non_annotations(log: RunnerLog) -> list[str]:
    return [c.name for c in log.commands if c.name not in ("error", "warning", "notice")]


def _check_github_log(log: RunnerLog, violations: list[dict[str, object]], ok: bool) -> None:
    """Exactly one annotation per violation, the stop/resume pair, one summary."""
    *annotations, last = [c for c in log.commands if c.name in ("error", "warning", "notice")]
    stop, resume = _non_annotations(log)
    assert stop == "stop-commands" and resume == log.commands[len(annotations)].data
    assert last.name == ("notice" if ok else "error") and last.properties == {"title": "contracts"}
    assert all(a.name == "error" for a in annotations)
    got = sorted(
        (a.properties.get("file", ""), a.properties.get("line", ""), a.properties["title"], a.data)
        for a in annotations
    )
    want = sorted(
        (
            v["path"] or "",
            "" if v["line"] is None else str(v["line"]),
            _expected_shown(f"{v['rule']} ({v['stage']})"),
            _expected_shown(str(v["message"])),
        )
        for v in violations
    )
    assert got == want


def _gate_both(repo: Repo, *args: str) -> tuple[RunnerLog, list[dict[str, object]], int]:
    code, out, err = repo.gate(*args, "--format", "github")
    jcode, payload = repo.gate_json(*args)
    assert code == jcode
    return runner(out, err), payload["violations"], code


def test_hostile_file_names_never_become_commands(repo: Repo) -> None:
    for name in HOSTILE:
        repo.write(name, "x\n")
    repo.commit()
    log, violations, code = _gate_both(repo, *PR)
    assert code == 1
    assert {v["path"] for v in violations} == set(HOSTILE)
    _check_github_log(log, violations, ok=False)
    shown = "\n".join(log.output)
    for name in HOSTILE:  # each is in the table, visibly and on one line
        assert github.inert(f"    {name}").lstrip() in shown, name


def test_hostile_spec_text_never_becomes_a_command(repo: Repo) -> None:
    evil = "alpha \\r\\n::warning title=spec::s\\n##[error]v1 %0A::notice::x"
    repo.replace("specs/alpha.toml", 'message = "alpha depends on nothing"', f'message = "{evil}"')
    repo.replace("packages/alpha/pyproject.toml", "dependencies = []", 'dependencies = ["numpy"]')
    log, violations, code = _gate_both(repo, "--no-api")
    assert code == 1
    assert any("::warning title=spec" in str(v["message"]) for v in violations)
    _check_github_log(log, violations, ok=False)


def test_kept_run_ends_in_a_notice(repo: Repo) -> None:
    log, violations, code = _gate_both(repo, "--no-api")
    assert code == 0 and violations == []
    _check_github_log(log, violations, ok=True)


@pytest.mark.parametrize(
    "stage", ["##[warning]v1", "::warning title=t::m", "%0A::error::x", "x]##[notice]y"]
)
def test_hostile_stage_trailer_errors_stay_plain_on_both_streams(repo: Repo, stage: str) -> None:
    repo.write("packages/alpha/README.md", "x\n")
    repo.commit(f"change\n\nStage: {stage}")
    code, out, err = repo.gate("--base", "main", "--head", "HEAD", "--no-api", "--format", "github")
    assert code == 2
    log = runner(out, err)
    assert [c.name for c in log.commands] == ["error"]
    assert log.commands[0].properties == {"title": "contracts configuration error"}
    assert _expected_shown(stage) in log.commands[0].data
    assert any(stage.replace("##[", "##\\x5b") in line for line in log.output)


def test_a_traceback_on_stderr_stays_plain(repo: Repo, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(_request: object) -> Result:
        raise RuntimeError("boom\n::warning title=t::m\r##[error]v1\n  ::notice::x")

    monkeypatch.setattr("niels_gpt_contracts.cli.run", crash)
    code, out, err = repo.gate("--no-api", "--format", "github")
    assert code == 2 and "Traceback" in err
    log = runner(out, err)
    assert [c.name for c in log.commands] == ["error"]
    assert "internal error" in log.commands[0].data


def test_inert_lines_writes_whole_lines_only() -> None:
    sink = io.StringIO()
    guard = github.InertLines(sink)
    guard.write("::warning::a")
    assert sink.getvalue() == ""
    guard.write("b\n  ::x::y\npartial ##[")
    assert sink.getvalue() == "\\x3a:warning::ab\n  \\x3a:x::y\n"
    guard.close()
    assert sink.getvalue().endswith("partial ##\\x5b\n")


# --- any text at all ----------------------------------------------------------

NASTY = st.text(
    alphabet=st.sampled_from(list("%,:;=]#[ \t\r\n\x01\x85\u2028\xa0\udcffaZ/.")) | st.characters(),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(NASTY, st.none() | st.integers(1, 10**6), NASTY, NASTY), min_size=1, max_size=4
    ),
    NASTY,
)
def test_any_text_gives_exactly_the_meant_commands(
    rows: list[tuple[str, int | None, str, str]], stage: str
) -> None:
    vs = [Violation("path.not-allowed", p, n, m, s, "paths") for p, n, m, s in rows]
    result = Result(mode="tree", stages=[stage])
    result.outcomes.append(Outcome(stage, "spec", KEPT, stage))
    result.outcomes.append(Outcome(stage, "paths", BROKEN, "broken", vs))
    log = runner(github.render(result))
    _check_github_log(log, [asdict(v) for v in vs], ok=False)
    assert len(log.output) == len(github.text.lines(result))


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_inert_text_is_never_a_command(text: str) -> None:
    sink = io.StringIO()
    with github.InertLines(sink) as guard:
        guard.write(text)
    assert runner(sink.getvalue()).commands == []
    (error,) = runner(github.render_error(text)).commands
    assert error.name == "error" and error.data == _expected_shown(text)
