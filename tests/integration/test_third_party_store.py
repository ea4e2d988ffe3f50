"""A third-party database adapter, registered through an entry point by a package of its
own, is used by ``docoutbox dispatch`` without any change to docoutbox.

The package is written to a scratch folder with its ``.dist-info`` (what pip installs),
and put on ``PYTHONPATH``: the application ring finds it by the ``docoutbox.stores``
group, like the adapters docoutbox ships.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ADAPTER = '''
"""A kit of in-memory ports, its backend seeded with aggregates that have pending
entries (the ``messages`` option says how many)."""

from dataclasses import dataclass

from docoutbox import AggregateStore
from docoutbox.errors import InvalidConfig
from docoutbox.ports.kit import StoreSettings
from docoutbox.testing import MemoryBackend, MemoryDeadLetters
from docoutbox.testing.contract import Counter, add_msg, counter_handlers
from docoutbox.testing.dispatch import MemoryChangeSource, MemoryCheckpoints, MemoryLeaseTable


@dataclass
class SeededKit:
    backend: MemoryBackend
    source: MemoryChangeSource
    checkpoints: MemoryCheckpoints
    leases: MemoryLeaseTable
    dead_letters: MemoryDeadLetters

    def close(self) -> None:
        print("kit closed", flush=True, file=__import__("sys").stderr)


class SeededStore:
    label = "Seeded memory"
    extra = "seeded"

    def open(self, settings: StoreSettings) -> SeededKit:
        backend = MemoryBackend()
        store = AggregateStore(backend, Counter)
        for i in range(int(settings.options.get("messages", "1"))):
            store.handle(f"{settings.collection}-{i}", add_msg(f"m{i}"), counter_handlers,
                         create=True)
        return SeededKit(backend, MemoryChangeSource(backend), MemoryCheckpoints(),
                         MemoryLeaseTable(), MemoryDeadLetters())

    async def open_async(self, settings: StoreSettings) -> SeededKit:
        raise InvalidConfig("the seeded store is sync only")

    def name_problem(self, text: str, what: str) -> str | None:
        return None if text.isidentifier() else f"not a usable {what} name: {text!r}"


STORE = SeededStore()
'''


def _install(folder: Path) -> None:
    (folder / "seeded_store.py").write_text(ADAPTER)
    info = folder / "seeded_store-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: seeded-store\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[docoutbox.stores]\nseeded = seeded_store:STORE\n")


def _env(folder: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])
    return env


def test_a_store_adapter_registered_by_another_package_is_dispatched_from(
    tmp_path: Path,
) -> None:
    _install(tmp_path)
    command = [
        sys.executable, "-m", "docoutbox_app", "dispatch",
        "--store", "seeded", "--store-url", "memory://", "--store-option", "messages=3",
        "--db", "shop", "--collection", "orders", "--publisher", "stdout",
        "--no-leases", "--poll-interval", "0.2",
    ]  # fmt: skip
    process = subprocess.Popen(
        command,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        lines = [json.loads(process.stdout.readline()) for _ in range(3)]
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert sorted(entry["aggregate_id"] for entry in lines) == [
        "orders-0",
        "orders-1",
        "orders-2",
    ]
    assert "kit closed" in err


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "docoutbox_app", "dispatch", *args],
        env=_env(folder),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_adapter_s_own_name_rules_apply(tmp_path: Path) -> None:
    _install(tmp_path)
    args = ["--store", "seeded", "--store-url", "memory://", "--publisher", "stdout"]
    done = _run(tmp_path, *args, "--db", "shop", "--collection", "no-dashes")
    assert done.returncode == 2
    assert "--collection: not a usable collection name: 'no-dashes'" in done.stderr


def test_an_unknown_store_names_the_installed_ones(tmp_path: Path) -> None:
    _install(tmp_path)
    args = ["--store", "nosuch", "--store-url", "x://", "--publisher", "stdout"]
    done = _run(tmp_path, *args, "--db", "shop", "--collection", "orders")
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "no adapter 'nosuch' in docoutbox.stores" in lines[0]
    assert "seeded" in lines[0] and "mongo" in lines[0] and "cosmos" in lines[0]
