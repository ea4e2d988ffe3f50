"""Every numeric option of every ``docoutbox`` command refuses an unusable value with one
line on stderr (``<prog>: error: argument <option>: ...``) and exit 2: no usage dump."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

import pytest

from docoutbox.dispatch.engine.loop import DispatcherConfig
from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import BrokerSettings
from docoutbox.stored import Codec, Zlib
from docoutbox_app import DispatchOptions, cli
from docoutbox_app.cli import demo, main, spark
from docoutbox_app.cli.options import stored_values
from docoutbox_rabbitmq.broker import BROKER as RABBIT


def _numeric(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], str, str]]:
    """(command path, option, type name) of every option typed int or float, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _numeric(child, (*path, name))
        elif action.option_strings and action.type is not None:
            kind = getattr(action.type, "__name__", "")
            if action.type in (int, float) or kind in ("int", "float"):
                yield path, action.option_strings[-1], kind


PARSERS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "docoutbox": cli._parser,
    "docoutbox demo": demo._parser,
    "docoutbox audit/export": spark.parser,
}
CASES = [
    (origin, path, option)
    for origin, make in PARSERS.items()
    for path, option, _ in _numeric(make())
]


def test_every_command_has_numeric_options_checked_here() -> None:
    commands = {path[:1] for _, path, _ in CASES}
    assert {("dispatch",), ("outbox",), ("audit",), ()} <= commands
    assert ("dispatch",) in {p for _, p, o in CASES if o == "--grace"}


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "not-a-number", "1e999"])
@pytest.mark.parametrize(("origin", "path", "option"), CASES)
def test_a_bad_number_is_one_line_and_exit_2(
    origin: str,
    path: tuple[str, ...],
    option: str,
    value: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*path, option, value]
    if origin == "docoutbox demo":
        run: Callable[[list[str]], int] = demo.main
    else:
        run = main
    try:
        code: object = run(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("docoutbox") and f": error: argument {option}" in err, err
    assert "usage:" not in err


def test_grace_nan_is_the_one_line_the_issue_quoted(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["dispatch", "--grace", "nan"])
    assert caught.value.code == 2
    assert capsys.readouterr().err == (
        "docoutbox dispatch: error: argument --grace: must be a finite number at least 0: "
        "nan (see docoutbox dispatch --help)\n"
    )


def test_the_cli_the_options_and_the_engine_share_their_dispatch_defaults() -> None:
    argv = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    argv += ["--publisher", "memory", "--discard-entries"]
    from_cli = cli._options(cli._parser().parse_args(argv), "n").config()
    from_options = DispatchOptions(name="n").config()
    engine = DispatcherConfig(name="n")
    for config in (from_cli, from_options, engine):
        assert (config.trim_delay, config.max_untrimmed) == (0.002, 2_000)


#: What ``--decode tests.unit.test_cli_arguments:CODEC`` names.
CODEC = Codec(Zlib())


def test_dispatch_decode_names_the_stores_codec(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    argv += ["--publisher", "memory", "--discard-entries"]
    for bad, says in [
        ("json", "not module:name"),
        ("tests.unit.test_cli_arguments:pytest", "not a StoredValues, Codec or Upcasters"),
        ("tests.unit.test_cli_arguments:nothing", "has no 'nothing'"),
        ("no_such_module_anywhere:x", "importing no_such_module_anywhere failed"),
    ]:
        assert main([*argv, "--decode", bad]) == 2
        assert says in capsys.readouterr().err
    args = cli._parser().parse_args([*argv, "--decode", "tests.unit.test_cli_arguments:CODEC"])
    args.decode = stored_values(args.decode)
    config = cli._options(args, "n").config()
    assert config.codec is CODEC and config.upcasters is None
    assert stored_values("tests.unit.test_cli_arguments:CODEC").codec is CODEC


@pytest.mark.parametrize("publisher", ["memory", "stdout"])
def test_broker_options_are_never_dropped(publisher: str) -> None:
    """``--broker-option`` reaches the broker adapter, or is refused where nothing reads
    it (the memory and stdout publishers, the RabbitMQ adapter): never ignored."""
    argv = ["dispatch", "--mongo-uri", "mongodb://127.0.0.1:1/", "--db", "d", "--collection", "c"]
    argv += ["--broker-option", "linger.ms=5", "--publisher", publisher, "--discard-entries"]
    with pytest.raises(InvalidConfig, match=f"no meaning with --publisher {publisher}"):
        cli._publisher(cli._parser().parse_args(argv))
    rabbit = BrokerSettings("amqp://guest:guest@127.0.0.1:1/", options={"frame_max": "8192"})
    with pytest.raises(InvalidConfig, match="takes no options"):
        RABBIT.publisher(rabbit)
