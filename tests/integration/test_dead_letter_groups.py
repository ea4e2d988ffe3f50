"""``docoutbox dead-letters groups``, ``replay --group`` and ``purge --group`` on MongoDB
(wire server) and Cosmos DB (local server): entries refused for the same reason form one
group whatever IDs and numbers their errors carry; a replayed group is published exactly
once per entry; the other group stays until purged."""

from __future__ import annotations

import itertools
import json
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

import pytest

from docoutbox import OutboxMessage
from docoutbox.errors import PermanentPublishError
from docoutbox.testing import MemoryPublisher
from docoutbox_app.cli import main
from tests.support.backends import BACKENDS, DispatchEnv, dispatch_env_of, wait_until

REFUSED = ("p1", "p2", "p3", "p4")
TOO_LARGE = ("t1", "t2")


@pytest.fixture(params=BACKENDS)
def env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[DispatchEnv]:
    for name in ("COSMOS_ENDPOINT", "COSMOS_KEY", "COSMOS_CA_FILE", "DOCOUTBOX_MONGO_URI"):
        monkeypatch.delenv(name, raising=False)
    with dispatch_env_of(request.param, request, "threaded") as made:
        yield made


def where(env: DispatchEnv) -> tuple[str, ...]:
    """The CLI options naming the bundle's database and its dead letters."""
    bundle: Any = env.bundle
    if bundle.kind == "mongo":
        store = ("--mongo-uri", bundle.uri, "--db", bundle.db.name)
    else:
        store = ("--cosmos-endpoint", bundle.account.endpoint, "--cosmos-key", bundle.account.key)
        store += ("--db", bundle.db.id)
    return (*store, "--dead-letters", "dead")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


class Refusals:
    """Refuses the entries of ``REFUSED`` and ``TOO_LARGE`` aggregates while ``on``, each
    with its own numbers in the message."""

    def __init__(self) -> None:
        self.on = True
        self.offsets = itertools.count(1000, 37)

    def __call__(self, entry: OutboxMessage) -> BaseException | None:
        if not self.on:
            return None
        if entry.aggregate_id in REFUSED:
            return PermanentPublishError(
                f"entry {entry.id}: refused by policy at offset {next(self.offsets)}"
            )
        if entry.aggregate_id in TOO_LARGE:
            size = 2_000_000 + next(self.offsets)
            return PermanentPublishError(f"entry {entry.id}: {size} bytes, the limit is 1048576")
        return None


def test_a_failure_group_is_listed_replayed_once_per_entry_and_purged(
    env: DispatchEnv, capsys: pytest.CaptureFixture[str]
) -> None:
    refusals = Refusals()
    sink = MemoryPublisher(fail=refusals)
    env.start(sink)
    for name in (*REFUSED, *TOO_LARGE, "ok1"):
        env.write(name, f"m-{name}")
    wait_until(lambda: len(env.bundle.dead_items()) == 6 and env.bundle.pending() == 0)
    assert [e.aggregate_id for e in sink.published] == ["ok1"]
    common = where(env)

    code, out, err = run(capsys, "dead-letters", "groups", *common, "--json")
    assert code == 0, err
    refused, too_large = json.loads(out)
    assert (refused["count"], too_large["count"]) == (4, 2)
    assert refused["error_type"] == too_large["error_type"] == "PermanentPublishError"
    assert refused["message"] == "entry <entry>: refused by policy at offset <n>"
    assert too_large["message"] == "entry <entry>: <n> bytes, the limit is <n>"
    assert refused["first_seen"] <= refused["last_seen"]
    code, out, _ = run(capsys, "dead-letters", "show", *common, refused["example_id"])
    assert code == 0 and json.loads(out)["aggregate_id"] in REFUSED
    code, out, _ = run(capsys, "dead-letters", "groups", *common)
    assert code == 0 and out.startswith("6 dead letter(s) in 2 failure group(s)")
    assert refused["fingerprint"] in out and "refused by policy at offset <n>" in out

    # Bad input changes nothing.
    replay = ("dead-letters", "replay", *common, "--collection", "aggs")
    code, _, err = run(capsys, *replay, "--group", "0123456789abcdef")
    assert code == 1 and "no dead letter in failure group '0123456789abcdef'" in err
    code, _, err = run(capsys, *replay, refused["example_id"], "--group", refused["fingerprint"])
    assert code == 2 and "not both" in err
    code, _, err = run(capsys, *replay)
    assert code == 2 and "--group" in err
    code, _, err = run(
        capsys, "dead-letters", "purge", *common, "--group", too_large["fingerprint"]
    )
    assert code == 2 and "--yes" in err and f"failure group {too_large['fingerprint']}" in err
    assert len(env.bundle.dead_items()) == 6

    refusals.on = False
    code, out, err = run(capsys, *replay, "--group", refused["fingerprint"])
    assert code == 0, err
    assert out.count(": re-appended") == 4
    wait_until(lambda: len(sink.published) == 5 and env.bundle.pending() == 0)
    replayed = [e for e in sink.published if e.aggregate_id in REFUSED]
    assert sorted(e.aggregate_id for e in replayed) == sorted(REFUSED)  # each exactly once
    assert Tally(e.headers["docoutbox-replay-of"] for e in replayed).most_common(1)[0][1] == 1
    assert all(e.seq == 1 for e in replayed)
    assert not [e for e in sink.published if e.aggregate_id in TOO_LARGE]

    code, out, _ = run(capsys, "dead-letters", "groups", *common, "--json")
    assert code == 0 and [g["fingerprint"] for g in json.loads(out)] == [too_large["fingerprint"]]
    purge = ("dead-letters", "purge", *common, "--yes")
    code, out, err = run(capsys, *purge, "--group", too_large["fingerprint"])
    assert code == 0 and "purged 2 dead letter(s)" in out, err
    code, out, _ = run(capsys, "dead-letters", "groups", *common)
    assert code == 0 and out.startswith("0 dead letter(s) in 0 failure group(s)")
    assert len(sink.published) == 5
