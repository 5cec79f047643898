"""The ledger's record: released rounds in a hash chain, replayed, on disk.

A :class:`~dpfl.accounting.ledger.PrivacyLedger` is an :class:`EntryChain`:
the rounds a run has released (:class:`LedgerEntry`), in order, each tied to
the ones before it, with the files that keep them. What the rounds cost and
the budget guard are the ledger's own.

The JSON file on disk is the truth: :meth:`EntryChain.save` writes a
temporary file and renames it over the old one (atomic on POSIX),
:meth:`EntryChain.flush` appends the rounds since to a journal, and
:meth:`~dpfl.accounting.ledger.PrivacyLedger.load` restores the exact spend
of a stopped run.

Checksums. Entries form a hash chain: entry ``i`` carries
``chain_i = sha256(chain_{i-1}, entry_i, digest_i)``, where ``digest_i`` is the
digest of the model the round released, starting from the SHA-256 of the
ledger's header (budget, analysis, guard, tolerance, the digest of the run it
belongs to and the fingerprint of the run's secret key), and each journal line
carries its own link. A checkpoint records the chain hash at its round, so
the chain ties it to every model released up to then. Loading
recomputes the chain and refuses a file whose entries, header or count were
changed, dropped or cut short (a torn *last* journal line, a crash
mid-append, is the one thing skipped: that round was never checkpointed). The
chain detects accidents and careless edits; it does not stop someone with
write access who recomputes the hashes (dpfl holds no secret to sign with).

Replay. Each entry records what its round released: the event, the
participants, the extra facts and a ``digest`` of the model after the round.
A run resumed from a checkpoint older than the ledger rewinds it
(:meth:`EntryChain.rewind`) to the checkpoint's entry count: the later
entries stay on disk and in the spend written out, and each replayed round
*confirms* its entry
(:meth:`~dpfl.accounting.ledger.PrivacyLedger.record` compares every
field) instead of being charged again; a
round that replays differently raises :class:`LedgerMismatchError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dpfl._files import digest as _digest
from dpfl._files import fault
from dpfl.accounting import events as ev
from dpfl.errors import DpflError

__all__ = [
    "LEDGER_FORMAT",
    "EntryChain",
    "LedgerEntry",
    "LedgerMismatchError",
    "read_file",
]

#: The ``"format"`` of a ledger file.
LEDGER_FORMAT = 3


class LedgerMismatchError(DpflError):
    """A replayed round does not match the ledger entry it should confirm."""


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One round: its index, its event, and (optionally) who took part.

    ``extra`` holds scheme-specific per-round facts that per-client accounting
    needs (e.g. LOCKS' second-stage clients), as JSON-ready values.
    ``digest`` is a SHA-256 of what the round released (the trainer records
    the model's weights after the round), so that a replayed round can be
    confirmed against it. It is not part of the entry's accounting content
    (:meth:`to_json`, equality): two executors that round differently charge
    the same entries.
    """

    round: int
    event: ev.Event
    participants: tuple[int, ...] | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    digest: str | None = dataclasses.field(default=None, compare=False)

    def to_json(self) -> dict[str, Any]:
        """Return a JSON-ready dict."""
        out: dict[str, Any] = {
            "round": self.round,
            "event": ev.event_to_dict(self.event),
        }
        if self.participants is not None:
            out["participants"] = list(self.participants)
        if self.extra:
            out["extra"] = self.extra
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LedgerEntry:
        """Inverse of :meth:`to_json`."""
        parts = data.get("participants")
        return cls(
            round=int(data["round"]),
            event=ev.event_from_dict(data["event"]),
            participants=None if parts is None else tuple(int(k) for k in parts),
            extra=dict(data.get("extra", {})),
        )


def _link(previous: str, entry: dict[str, Any], digest: str | None) -> str:
    """The chain hash after ``entry`` (its JSON form and model digest)."""
    return _digest([previous, entry, digest])


def _normal(entry: LedgerEntry) -> dict[str, Any]:
    """An entry's JSON form as it reads back from a file (tuples as lists)."""
    out: dict[str, Any] = json.loads(json.dumps(entry.to_json()))
    return out


def _journal(path: Path) -> Path:
    return path.with_name(path.name + ".journal")


def read_file(path: Path) -> dict[str, Any]:
    """The JSON object of a ledger file, checked to be a dpfl ledger's.

    Raises
    ------
    DpflError
        If the file is missing, is not JSON or is not a dpfl ledger.
    """
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise DpflError(f"ledger file not found: {path}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DpflError(
            f"ledger file {path} is not valid JSON ({exc}): it was cut short or "
            "corrupted; refusing to resume without it (the spend is never reset)"
        ) from None
    if not isinstance(data, dict) or data.get("format") != LEDGER_FORMAT:
        raise DpflError(f"{path} is not a dpfl ledger (format {LEDGER_FORMAT})")
    return data


class EntryChain:
    """Released rounds in order, their hash chain, their replay and their files.

    The base of :class:`~dpfl.accounting.ledger.PrivacyLedger`, which gives
    the header the chain starts from (:meth:`_header`), the file's JSON
    (:meth:`to_json`), and records rounds after its budget guard passes them.

    Parameters
    ----------
    path : str or Path or None
        Where :meth:`save` writes; ``None`` keeps the record in memory.
    """

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = None if path is None else Path(path)
        self._entries: list[LedgerEntry] = []
        self._chain: list[str] = []  # chain hash after each confirmed entry
        # entries read from disk past a rewind: released, awaiting their replay
        self._pending: list[tuple[LedgerEntry, str]] = []
        self._persisted = 0  # entries already on disk (snapshot + journal)
        self._compact = False  # rewrite the snapshot at the next flush

    def _header(self) -> dict[str, Any]:
        """What the chain starts from (the owner's settings)."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        """Return the whole record as a JSON-ready dict (what :meth:`save` writes)."""
        raise NotImplementedError

    @property
    def entries(self) -> list[LedgerEntry]:
        """The recorded rounds, in order."""
        return list(self._entries)

    @property
    def rounds(self) -> int:
        """Number of recorded rounds (during a replay: confirmed so far)."""
        return len(self._entries)

    @property
    def released(self) -> int:
        """Rounds on record, including those awaiting their replay (>= rounds)."""
        return len(self._entries) + len(self._pending)

    @property
    def replaying(self) -> bool:
        """Whether entries read from disk still await their replayed round."""
        return bool(self._pending)

    def chain_at(self, count: int) -> str:
        """The chain hash after the first ``count`` entries (the header's at 0).

        Raises
        ------
        DpflError
            If the ledger holds fewer than ``count`` confirmed entries.
        """
        if not 0 <= count <= len(self._chain):
            raise DpflError(
                f"the ledger holds {len(self._chain)} entries; asked for the chain "
                f"after {count}"
            )
        return self._chain[count - 1] if count else _digest(self._header())

    def _append(self, entry: LedgerEntry) -> None:
        self._chain.append(
            _link(self.chain_at(len(self._entries)), _normal(entry), entry.digest)
        )
        self._entries.append(entry)

    def rewind(self, count: int) -> None:
        """Hold the entries past the first ``count`` for their rounds' replay.

        For a run resumed from a checkpoint taken after ``count`` entries: the
        later entries stay on record (and in every file :meth:`save` and
        :meth:`flush` write, so the spend on disk never drops), and each is
        confirmed by :meth:`~dpfl.accounting.ledger.PrivacyLedger.record`
        when its round runs again, not charged twice. Queries (the ledger's
        ε, its guard) see the confirmed entries, as the uninterrupted run did
        at that round.

        Raises
        ------
        DpflError
            If ``count`` is more than the entries on record (a checkpoint
            newer than its ledger: the spend is never reset).
        """
        total = self.released
        if not 0 <= count <= total:
            raise DpflError(
                f"the ledger holds {total} charged rounds but the checkpoint was "
                f"taken after {count}: refusing to resume with a smaller spend"
            )
        every, chains = self._all()
        self._entries, self._chain = every[:count], chains[:count]
        self._pending = list(zip(every[count:], chains[count:], strict=True))

    def _all(self) -> tuple[list[LedgerEntry], list[str]]:
        """Every entry on record and its chain hash (confirmed, then pending)."""
        return (
            self._entries + [e for e, _ in self._pending],
            self._chain + [c for _, c in self._pending],
        )

    def _confirm(self, entry: LedgerEntry) -> LedgerEntry:
        """Confirm a replayed round against the next entry on record."""
        expected, chain = self._pending[0]
        got, want = _normal(entry), _normal(expected)
        got["digest"], want["digest"] = entry.digest, expected.digest
        if got != want:
            fields = sorted(k for k in {*got, *want} if got.get(k) != want.get(k))
            raise LedgerMismatchError(
                f"round {entry.round + 1} replayed differently from the ledger "
                f"entry it must confirm ({', '.join(fields)} differ): the run "
                "cannot resume exactly (was the code, the execution, the device, "
                "the number of torch threads or the data changed?); the ledger "
                "keeps its "
                f"{self.released} charged rounds"
            )
        self._pending.pop(0)
        self._append(expected)
        if self._chain[-1] != chain:  # the same entry must link the same way
            raise LedgerMismatchError(
                f"ledger entry {len(self._entries)} (round {entry.round + 1}) does "
                "not link to the entries before it"
            )
        return expected

    # -- files ------------------------------------------------------------------
    def save(self, path: str | Path | None = None) -> Path:
        """Write the whole ledger atomically (temporary file, fsync, rename).

        The snapshot holds every entry, so the journal of :meth:`flush` is
        removed afterwards (entries it still holds are checked against the
        snapshot and skipped on load).
        """
        target = self._target(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(self.to_json(), fh, indent=1)
                fh.flush()
                os.fsync(fh.fileno())
            fault("ledger-save")
            os.replace(tmp, target)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        _journal(target).unlink(missing_ok=True)
        self._persisted = self.released
        self._compact = False
        return target

    def flush(self, path: str | Path | None = None) -> Path:
        """Persist the entries recorded since the last write, in O(new entries).

        Appends them to a journal beside the snapshot (``ledger.json.journal``,
        one JSON line per entry with its sequence number and chain hash,
        fsynced), so a long run does not rewrite its whole history every
        round; :meth:`save` compacts. A last line cut short by a crash is
        skipped on load: that round was never checkpointed and runs (and is
        charged) once more on resume.
        """
        target = self._target(path)
        if not target.exists() or self._persisted == 0 or self._compact:
            return self.save(target)
        entries, chains = self._all()
        if len(entries) > self._persisted:
            with _journal(target).open("a") as fh:
                for seq in range(self._persisted, len(entries)):
                    entry = entries[seq]
                    line = json.dumps(
                        {
                            "seq": seq,
                            **entry.to_json(),
                            "chain": chains[seq],
                            "digest": entry.digest,
                        }
                    )
                    half = len(line) // 2
                    fh.write(line[:half])
                    fh.flush()
                    fault("ledger-journal")  # crash tests: die mid-line
                    fh.write(line[half:] + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self._persisted = len(entries)
        return target

    def _target(self, path: str | Path | None) -> Path:
        target = Path(path) if path is not None else self.path
        if target is None:
            raise DpflError("save needs a path: the ledger was created without one")
        return target

    def _restore(self, data: dict[str, Any], p: Path) -> None:
        """Read the entries of a file's ``data`` and its journal, checking the chain."""
        items = list(data.get("entries", []))
        digests = list(data.get("digests") or [None] * len(items))
        if len(digests) != len(items):
            raise DpflError(
                f"{p} holds {len(digests)} digests for {len(items)} entries"
            )
        for i, (item, released) in enumerate(zip(items, digests, strict=True)):
            self._read(item, f"{p} entry {i + 1}", released)
        if data.get("count") != len(items) or data.get("head") != self.chain_at(
            len(items)
        ):
            raise DpflError(
                f"{p} fails its checksum (count or head of the chain): entries "
                "were removed or the header was changed"
            )
        journal = _journal(p)
        if journal.exists():
            self._read_journal(journal, len(items))
        self._persisted = self.released

    def _read(self, item: Any, where: str, released: Any = None) -> None:
        """Append one stored entry after checking its chain hash."""
        if not isinstance(item, dict):
            raise DpflError(f"{where} is not an entry")
        item = dict(item)
        chain = item.pop("chain", None)
        released = item.pop("digest", released)
        entry = dataclasses.replace(
            LedgerEntry.from_json(item),
            digest=None if released is None else str(released),
        )
        self._append(entry)
        if self._chain[-1] != chain:
            raise DpflError(
                f"{where} (round {entry.round + 1}) fails its checksum: the ledger "
                "was altered or corrupted; refusing it (the spend is never reset)"
            )

    def _read_journal(self, journal: Path, snapshot: int) -> None:
        lines = journal.read_text().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        for i, line in enumerate(lines):
            where = f"{journal} line {i + 1}"
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                if i == len(lines) - 1:
                    break  # the last line cut short by a crash: that round re-runs
                raise DpflError(
                    f"{where} is corrupted (not JSON) with lines after it; refusing "
                    "the ledger"
                ) from None
            if not isinstance(item, dict) or not isinstance(item.get("seq"), int):
                raise DpflError(f"{where} is not a journal entry")
            seq = item.pop("seq")
            count = len(self._entries)
            if seq < snapshot and seq < count:
                # left by a crash between a compaction and the journal's removal
                if item.get("chain") != self._chain[seq]:
                    raise DpflError(
                        f"{where} disagrees with entry {seq + 1} of the snapshot"
                    )
                continue
            if seq != count:
                raise DpflError(
                    f"{where} holds entry {seq + 1} where entry {count + 1} is due: "
                    "the journal has a gap; refusing the ledger (its spend would be "
                    "lower than what was charged)"
                )
            self._read(item, where)
        self._compact = True  # the next flush rewrites the snapshot
