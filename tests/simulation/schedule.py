"""What one simulated schedule looks like: every parameter is drawn from its seed.

A :class:`Variant` names a schedule exactly (seed, store, mutation and any parameter
overrides), and :meth:`Variant.command` prints the command that replays it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, fields, replace

from docoutbox.stored import Codec, Zlib

#: Every fault the simulator injects, and what it does.
FAULTS: dict[str, str] = {
    "crash": "a process dies between two steps; its unacknowledged deliveries come back",
    "load_error": "a document read fails (TransientStoreError)",
    "write_error": "a write fails before it applies (TransientStoreError)",
    "write_lost_reply": "a write applies, then its reply is lost (TransientStoreError)",
    "find_error": "a sweep query fails (TransientStoreError)",
    "publish_nack": "the broker refuses a message (PublishError)",
    "publish_lost_confirm": "the broker takes a message, then the confirm is lost (PublishError)",
    "broker_down": "the broker cannot be reached (BrokerUnavailable)",
    "poison": "the broker rejects a message for good (PermanentPublishError)",
    "deadletter_error": "the dead-letter store fails (TransientStoreError)",
    "checkpoint_lost": "a restarting dispatcher finds its checkpoint gone",
    "duplicate": "the broker or a client delivers a message twice",
    "delay": "a message becomes visible only some steps later",
    "handler_error": "a consumer's handler raises for one message of its batch",
}

#: The probabilities a schedule draws from, per fault. Swarm testing: many schedules
#: switch some faults off entirely, which reaches states that an even mix rarely does.
LEVELS: dict[str, tuple[float, ...]] = {
    "crash": (0.0, 0.01, 0.03),
    "load_error": (0.0, 0.05, 0.15),
    "write_error": (0.0, 0.05, 0.15),
    "write_lost_reply": (0.0, 0.05, 0.15),
    "find_error": (0.0, 0.1),
    "publish_nack": (0.0, 0.1, 0.3),
    "publish_lost_confirm": (0.0, 0.1, 0.3),
    "broker_down": (0.0, 0.05),
    "poison": (0.0, 0.0, 0.02),
    "deadletter_error": (0.0, 0.2),
    "checkpoint_lost": (0.0, 0.5),
    "duplicate": (0.0, 0.1, 0.3),
    "delay": (0.0, 0.2),
    "handler_error": (0.0, 0.1, 0.3),
}

#: Faults of the claim check, drawn apart from :data:`FAULTS` (from their own random
#: stream, so every other draw of a seed stays what it was), in claim-checked schedules.
CLAIM_FAULTS: dict[str, str] = {
    "put_error": "a payload put fails before it stores anything (TransientStoreError)",
    "put_slow": "a payload put takes longer than the grace: the clock jumps past it",
    "get_error": "a payload read fails (TransientStoreError)",
    "payload_lost": "a payload read finds nothing, for this read only (PayloadMissing)",
    "delete_error": "a payload delete fails (TransientStoreError)",
}
CLAIM_LEVELS: dict[str, tuple[float, ...]] = {
    "put_error": (0.0, 0.05, 0.15),
    "put_slow": (0.0, 0.05, 0.15),
    "get_error": (0.0, 0.05, 0.15),
    "payload_lost": (0.0, 0.05, 0.15),
    "delete_error": (0.0, 0.1, 0.3),
}
#: Claim-checked schedules: payloads over this many bytes (stored form) go to the
#: payload store (the effects with ``k == 1`` carry a padded payload over it, the others
#: stay under), which the orphan sweep keeps for :data:`CLAIM_GRACE` seconds.
CLAIM_THRESHOLD = 100
CLAIM_GRACE = 0.2

STORES = ("memory", "wire", "cosmos")

#: Mutations that are schedule settings rather than patches of the library.
MUTATION_SETTINGS: dict[str, tuple[tuple[str, str], ...]] = {
    "consumer-window-0": (("consumer_exact", "false"), ("consumer_window", "0")),
    "batch-first-state": (("consumer_batch", "8"),),
    "inbox-oldest": (("consumer_exact", "false"), ("consumer_window", "2")),
    "attempts-off": (("stuck", "30"),),
    # Rounds of several aggregates' entries are what these break: no entry waits for later.
    "run-ahead": (("scheduled", "0"),),
    # Not claim-checked: seed 3, which catches it, draws a claim-checked schedule, whose
    # sweeper changes the interleaving.
    "round-misattributed": (("scheduled", "0"), ("claimed", "false")),
    "due-early": (("scheduled", "100"),),
    "cancel-off": (("scheduled", "100"), ("cancels", "100")),
    "release-off": (("scheduled", "100"), ("cancels", "100")),
    "seq-at-emit": (("scheduled", "100"), ("cancels", "100")),
    "release-version-off": (("scheduled", "100"),),
    "hint-off": (("scheduled", "100"), ("dispatcher", "log")),
    "trim-not-due": (("scheduled", "100"),),
    "claim-put-skipped": (("claimed", "true"),),
    "claim-unresolved": (("claimed", "true"),),
    "claim-delete-deferred": (("claimed", "true"),),
    # Slow puts (and lost reads) in every schedule: the races these need.
    "claim-refresh-off": (("claimed", "true"), ("claim_stress", "true")),
    "claim-missing-dropped": (("claimed", "true"), ("claim_stress", "true")),
    "claim-sweep-young": (("claimed", "true"), ("claim_stress", "true")),
    # Entries pending for longer than the grace.
    "claim-sweep-referenced": (("claimed", "true"), ("stuck", "30")),
    # Claim-checked entries quarantined (and, for the sweep, for longer than the grace).
    "claim-dead-letter-inline": (("claimed", "true"), ("stuck", "30")),
    "claim-dead-letter-deleted": (("claimed", "true"), ("stuck", "30")),
    "claim-sweep-dead-letters-off": (("claimed", "true"), ("stuck", "30")),
    "spill-after-commit": (("consumer_exact", "false"), ("consumer_spill", "true")),
    "spill-lookup-off": (("consumer_exact", "false"), ("consumer_spill", "true")),
    "spill-evicts": (("consumer_exact", "false"), ("consumer_spill", "true")),
}


#: What an encoded schedule's stores encode with: compression of every value (no
#: randomness, so a seed replays exactly; encryption goes through the same code).
CODEC = Codec(Zlib(min_size=0))


@dataclass(frozen=True)
class Schedule:
    """The shape of one run. Defaults are placeholders; :func:`draw` sets every field."""

    seed: int
    store: str = "memory"
    producers: int = 2
    consumers: int = 2
    #: Commands per producer aggregate.
    commands: int = 4
    #: Each command emits 0..max_targets messages, each to a consumer aggregate.
    max_targets: int = 2
    #: Processes handling commands (two make concurrent writers on one aggregate).
    producer_workers: int = 2
    consumer_workers: int = 2
    #: The workers of one side are threads of one process: they share one store, and so
    #: its document cache; a crash kills them all.
    shared_store: bool = False
    #: Exact (watermark) de-duplication instead of the ID window.
    producer_exact: bool = False
    consumer_exact: bool = False
    #: The consumers' ID window; -1 sizes it to what one consumer can receive.
    consumer_window: int = -1
    deterministic_ids: bool = False
    #: "log": follow the store's change log with a checkpoint (memory store only);
    #: "sweep": query documents with pending entries, again and again.
    dispatcher: str = "sweep"
    #: Log mode, checkpoint missing: "sweep" all pending documents from the log's end,
    #: or "replay" the whole log.
    recovery: str = "sweep"
    #: Changes read per batch, and documents per sweep page.
    batch: int = 2
    #: The broker hands out any visible message rather than the oldest.
    reorder: bool = True
    store_attempts: int = 5
    publish_attempts: int = 3
    #: Steps with faults on; afterwards everything runs fault-free until quiescent.
    fault_steps: int = 300
    faults: tuple[tuple[str, float], ...] = ()
    #: Deliveries a consumer handles together with handle_batch (1: handle per message).
    consumer_batch: int = 1
    #: Percent of entries the broker refuses at every attempt while faults are on, so
    #: they exhaust their publish attempts and are quarantined.
    stuck: int = 0
    #: Log mode: the dispatcher's reads of the log space out up to this many milliseconds
    #: while they bring nothing (``DispatcherConfig.max_stream_wait``; 0: they do not).
    stream_wait_ms: int = 0
    #: The stores encode what they store (:data:`CODEC`) and the dispatcher decodes it.
    encoded: bool = False
    #: Percent of commands whose effects are scheduled (due 0..200 ms after the commit),
    #: and percent of those cancelled by a later command of the same client.
    scheduled: int = 0
    cancels: int = 0
    #: Large payloads go to a payload store (the claim check), swept of orphans.
    claimed: bool = False
    #: Every claim fault at its highest level (:data:`CLAIM_LEVELS`).
    claim_stress: bool = False
    #: Consumers spill their inbox (``InboxPolicy(spill=True)``), with a window of 2 unless
    #: ``consumer_window`` says otherwise (memory store only).
    consumer_spill: bool = False

    def fault(self, kind: str) -> float:
        if self.claim_stress and kind in CLAIM_LEVELS and dict(self.faults).get(kind) != 0.0:
            return max(CLAIM_LEVELS[kind])
        return dict(self.faults).get(kind, 0.0)


def draw(seed: int, store: str = "memory") -> Schedule:
    """The schedule of ``seed``: small (a few aggregates, a few commands), varied faults."""
    if store not in STORES:
        raise ValueError(f"unknown store {store!r}; expected one of {STORES}")
    rng = random.Random(f"schedule/{seed}")
    producers = rng.randint(2, 3)
    commands = rng.randint(3, 6)
    schedule = Schedule(
        seed=seed,
        store=store,
        producers=producers,
        consumers=rng.randint(1, 2),
        commands=commands,
        max_targets=rng.randint(1, 2),
        producer_workers=rng.randint(1, 2),
        consumer_workers=rng.randint(1, 2),
        shared_store=rng.random() < 0.5,
        producer_exact=rng.random() < 0.3,
        consumer_exact=rng.random() < 0.5,
        deterministic_ids=rng.random() < 0.5,
        dispatcher="log" if rng.random() < 0.6 and store == "memory" else "sweep",
        recovery=rng.choice(("sweep", "replay")),
        batch=rng.randint(1, 3),
        reorder=rng.random() < 0.7,
        store_attempts=rng.choice((2, 3, 5, 10)),
        publish_attempts=rng.choice((3, 5)),
        fault_steps=rng.randint(40, 60) * producers * commands // 3,
        faults=tuple((kind, rng.choice(LEVELS[kind])) for kind in FAULTS),
    )
    # Drawn last, so that every earlier field of a seed stays what it was.
    schedule = replace(schedule, consumer_batch=rng.choice((1, 1, 4, 8, 8)))
    schedule = replace(schedule, stuck=rng.choice((0, 0, 0, 10)))
    schedule = replace(schedule, stream_wait_ms=rng.choice((0, 0, 200)))
    schedule = replace(schedule, encoded=rng.random() < 0.3)
    schedule = replace(
        schedule, scheduled=rng.choice((0, 0, 30, 60)), cancels=rng.choice((0, 30, 60))
    )
    claims = random.Random(f"schedule/{seed}/claims")
    claim_faults = tuple((kind, claims.choice(CLAIM_LEVELS[kind])) for kind in CLAIM_FAULTS)
    schedule = replace(
        schedule, claimed=claims.random() < 0.3, faults=(*schedule.faults, *claim_faults)
    )
    spill = rng.random() < 0.3 and store == "memory" and not schedule.consumer_exact
    return replace(schedule, consumer_spill=spill)


def _parse(kind: type | str, text: str) -> object:
    name = kind if isinstance(kind, str) else kind.__name__
    if name == "bool":
        if text.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {text!r}")
        return text.lower() in ("true", "1")
    if name == "int":
        return int(text)
    if name == "str":
        return text
    raise ValueError(f"cannot set a field of type {name}")


@dataclass(frozen=True)
class Variant:
    """One replayable run: a seed, a store, an optional mutation and overrides."""

    seed: int
    store: str = "memory"
    mutation: str | None = None
    #: Field overrides, as ``(field, text)`` pairs (``--set field=text``).
    settings: tuple[tuple[str, str], ...] = ()
    #: Faults switched off (``--off kind``).
    off: tuple[str, ...] = ()

    def schedule(self) -> Schedule:
        schedule = draw(self.seed, self.store)
        types = {f.name: f.type for f in fields(Schedule)}
        changes: dict[str, object] = {}
        for name, text in (*MUTATION_SETTINGS.get(self.mutation or "", ()), *self.settings):
            if name not in types or name in ("seed", "store", "faults"):
                raise ValueError(f"unknown or fixed schedule field {name!r}")
            changes[name] = _parse(types[name], text)
        for kind in self.off:
            if kind not in FAULTS and kind not in CLAIM_FAULTS:
                known = sorted((*FAULTS, *CLAIM_FAULTS))
                raise ValueError(f"unknown fault {kind!r}; expected one of {known}")
        faults = tuple((k, 0.0 if k in self.off else p) for k, p in schedule.faults)
        schedule = replace(schedule, faults=faults, **changes)  # type: ignore[arg-type]
        if schedule.store != "memory" and schedule.dispatcher == "log":
            raise ValueError("the change-log dispatcher exists only on the memory store")
        return schedule

    def command(self) -> str:
        """The shell command that replays this run."""
        parts = ["python -m tests.simulation", f"--seed {self.seed}"]
        if self.store != "memory":
            parts.append(f"--store {self.store}")
        if self.mutation:
            parts.append(f"--mutation {self.mutation}")
        parts += [f"--set {name}={text}" for name, text in self.settings]
        parts += [f"--off {kind}" for kind in self.off]
        return " ".join(parts)
