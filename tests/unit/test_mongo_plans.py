"""The pure MongoDB translation of write plans, and the one error translation point."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pymongo import errors as pm

from docoutbox.errors import DocumentTooLarge, PermanentStoreError, TransientStoreError
from docoutbox.store.plans import CommitPlan, FailurePlan, TrimPlan
from docoutbox_mongo.backend import AsyncMongoBackend, MongoBackend
from docoutbox_mongo.errors import is_duplicate_id, translated
from docoutbox_mongo.plans import (
    commit_update,
    failure_update,
    pending_filter,
    trim_outbox_update,
    trim_update,
)
from tests.support.loopless import run

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def commit(**overrides: object) -> CommitPlan:
    fields: dict[str, object] = {
        "aggregate_id": "a",
        "expected_version": 7,
        "state": {"x": 1},
        "outbox_push": ({"id": "e8", "seq": 8},),
        "outbox_seq": 8,
        "inbox_push": ("m",),
        "inbox_window": 100,
        "inbox_after": ("m",),
        "inbox_marks": None,
        "updated_at": NOW,
    }
    fields.update(overrides)
    return CommitPlan(**fields)  # type: ignore[arg-type]


def test_commit_is_guarded_by_version_and_appends() -> None:
    query, update = commit_update(commit())
    assert query == {"_id": "a", "version": 7}
    assert update["$inc"] == {"version": 1}
    assert update["$push"]["outbox"] == {"$each": [{"id": "e8", "seq": 8}]}
    assert update["$push"]["inbox"] == {"$each": ["m"], "$slice": -100}
    assert "outbox" not in update["$set"] and "inbox" not in update["$set"]


def test_commit_without_emits_or_inbox_pushes_nothing() -> None:
    _, update = commit_update(commit(outbox_push=(), inbox_push=(), inbox_marks=()))
    assert "$push" not in update
    assert update["$set"]["inbox_marks"] == []


def test_trim_never_touches_version() -> None:
    query, update = trim_update(TrimPlan("a", ("e1", "e2")))
    assert query == {"_id": "a"}
    assert update == {
        "$pull": {"outbox": {"id": {"$in": ["e1", "e2"]}}, "cancelled": {"$in": ["e1", "e2"]}}
    }
    assert trim_outbox_update(TrimPlan("a", ("e1",))) == (
        {"_id": "a"},
        {"$pull": {"outbox": {"id": {"$in": ["e1"]}}}},
    )


def test_pending_filter_pages_across_id_types() -> None:
    assert pending_filter(None, None, None) == {"outbox.0": {"$exists": True}}
    numeric = pending_filter(5, None, None)["$and"][1]
    assert numeric == {"$or": [{"_id": {"$gt": 5}}, {"_id": {"$type": "string"}}]}
    full = pending_filter("k", NOW, {3, 1})["$and"]
    assert {"_id": {"$gt": "k"}} in full
    aged = {"created_at": {"$lt": NOW}, "$or": [{"due": {"$exists": False}}, {"due": {"$lt": NOW}}]}
    assert {"outbox": {"$elemMatch": aged}} in full
    assert {"partition": {"$in": [1, 3]}} in full


TRANSLATIONS = (
    ("error", "expected"),
    [
        (pm.AutoReconnect("gone"), TransientStoreError),
        (pm.ServerSelectionTimeoutError("no server"), TransientStoreError),
        (pm.NetworkTimeout("slow"), TransientStoreError),
        (pm.OperationFailure("stepdown", code=189), TransientStoreError),
        (pm.OperationFailure("throttled", code=16500), TransientStoreError),
        (
            pm.OperationFailure(
                "labelled", code=1, details={"errorLabels": ["RetryableWriteError"]}
            ),
            TransientStoreError,
        ),
        (pm.OperationFailure("unauthorized", code=13), PermanentStoreError),
        (pm.OperationFailure("too big", code=10334), DocumentTooLarge),
        (pm.DocumentTooLarge("too big"), DocumentTooLarge),
        (pm.ConfigurationError("bad"), PermanentStoreError),
    ],
)


@pytest.mark.parametrize(*TRANSLATIONS)
def test_driver_errors_translate_by_class_and_code(
    error: Exception, expected: type[Exception]
) -> None:
    with pytest.raises(expected) as caught, translated("a"):
        raise error
    assert caught.value.__cause__ is error


class _Failing:
    """A collection whose updates raise ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def update_one(self, query: object, update: object) -> object:
        raise self.error


class _AsyncFailing(_Failing):
    async def update_one(self, query: object, update: object) -> object:  # type: ignore[override]
        raise self.error


@pytest.mark.parametrize(*TRANSLATIONS)
def test_a_commits_driver_errors_translate_like_any_other_write(
    error: Exception, expected: type[Exception]
) -> None:
    """The commit's update is written without :class:`translated` around it (the hot
    path): its errors translate the same, sync and async."""
    with pytest.raises(expected) as caught:
        MongoBackend(_Failing(error)).write(commit())
    assert caught.value.__cause__ is error
    with pytest.raises(expected) as caught:
        run(AsyncMongoBackend(_AsyncFailing(error)).write(commit()))
    assert caught.value.__cause__ is error


def test_duplicate_key_on_another_index_is_not_an_existing_aggregate() -> None:
    on_id = pm.DuplicateKeyError("dup", 11000, {"keyPattern": {"_id": 1}})
    on_other = pm.DuplicateKeyError("dup", 11000, {"keyPattern": {"email": 1}})
    unknown = pm.DuplicateKeyError("dup", 11000, {})
    assert is_duplicate_id(on_id) and is_duplicate_id(unknown)
    assert not is_duplicate_id(on_other)


def test_failure_record_targets_the_entry_and_leaves_version_alone() -> None:
    query, update = failure_update(FailurePlan("a", "e1", 3, "nack"))
    assert query == {"_id": "a", "outbox.id": "e1"}
    assert update == {"$set": {"outbox.$.attempts": 3, "outbox.$.last_error": "nack"}}
