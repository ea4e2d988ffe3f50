"""``docoutbox run``: every misconfiguration found before connecting is one error line and
exit code 2, with secrets masked."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from docoutbox_app.cli import main


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's project folder holding endpoint modules, as the current directory."""
    (tmp_path / "svc_ok.py").write_text(
        textwrap.dedent(
            """
            from docoutbox import Aggregate, Handlers, Message
            from docoutbox_app.endpoint import Broker, Endpoint, RabbitQueue, Store, env

            class Thing(Aggregate):
                n: int = 0

            handlers = Handlers()

            @handlers.on("Make")
            def make(thing: Thing, message: Message) -> Thing:
                return thing

            def endpoint(name, adapter="mongo", collection="things", broker="rabbitmq"):
                return Endpoint(
                    name, Thing, handlers,
                    store=Store(adapter, env("SVC_MONGO"), "db", collection),
                    inputs=[RabbitQueue(queue="q", route=str)],
                    output=Broker(broker, env("SVC_AMQP", "amqp://u:hunter2@mq/")),
                )

            things = endpoint("things")
            other = endpoint("things")
            odd_store = endpoint("odd", adapter="nosuchdb")
            odd_broker = endpoint("odd", broker="nosuchmq")
            bad_name = endpoint("bad", collection="a\\x00b")
            not_one = 42
            """
        )
    )
    (tmp_path / "svc_broken.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("svc_ok", "svc_broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize(
    ("targets", "says"),
    [
        (["svc_ok"], "'svc_ok' is not module:endpoint"),
        (["nosuch:x"], "no module 'nosuch'"),
        (["svc_broken:x"], "importing svc_broken failed: RuntimeError: boom at import"),
        (["svc_ok:nope"], "svc_ok has no 'nope' (its endpoints: "),
        (["svc_ok:not_one"], "svc_ok:not_one is a int, not an Endpoint"),
        (["svc_ok:things", "svc_ok:other"], "two endpoints are named 'things'"),
        (["svc_ok:odd_store"], "no adapter 'nosuchdb' in docoutbox.stores"),
        (["svc_ok:odd_broker"], "no adapter 'nosuchmq' in docoutbox.brokers"),
        (["svc_ok:bad_name"], "endpoint 'bad': not a usable collection name"),
        (["svc_ok:things"], "environment variable SVC_MONGO is not set"),
    ],
)
def test_a_misconfiguration_is_one_line_and_exit_2(
    project: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    targets: list[str],
    says: str,
) -> None:
    monkeypatch.delenv("SVC_MONGO", raising=False)
    assert main(["run", *targets]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("docoutbox: error: "), err
    assert says in err
    assert "hunter2" not in err


def test_a_bad_health_port_is_refused_by_the_parser(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["run", "svc_ok:things", "--health-port", "70000"])
    assert exited.value.code == 2
    assert "a port is 0 to 65535" in capsys.readouterr().err
