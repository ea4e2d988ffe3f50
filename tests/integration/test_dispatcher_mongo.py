"""The dispatcher's MongoDB-specific behaviour on the wire server. What every backend
shares (stream, checkpoints, sweeps, dead letters) is in ``test_dispatch_backends.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from docoutbox.errors import ChangeStreamLost
from docoutbox_mongo.changes import MongoChangeSource
from tests.support.backends import DispatchEnv, dispatch_env_of, wait_until

pytestmark = pytest.mark.wire


@pytest.fixture
def env(request: pytest.FixtureRequest) -> Iterator[DispatchEnv]:
    with dispatch_env_of("mongo", request) as made:
        yield made


def test_unresumable_positions_are_classified_as_stream_loss(env: DispatchEnv) -> None:
    source = MongoChangeSource(env.coll)
    for bad in [{"resume_after": {"_data": "garbage"}}, {"resume_after": {}}, {"x": 1}, 42]:
        with pytest.raises(ChangeStreamLost):
            source.open(bad)
    marker = source.start_marker()
    source.open(marker)
    env.write("a", "m0")
    wait_until(lambda: bool(events := source.poll(10)) and events[0].document is not None)
    source.close()
