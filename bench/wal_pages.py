"""Where a SQLite store's bytes go: its write-ahead log's pages, by the keys they hold.

Every commit to the embedded store appends each page it changed, whole (4 KiB plus a
24-byte header), to the log; a checkpoint later copies the latest version of each page
into the database file. Kept whole (no checkpoint ran: the log is below
``checkpoint_pages`` and a connection held the database open until the log was copied),
the log of a run tells, for every commit, which pages it wrote and which keys they hold:

- a leaf page of the key-value table is labelled by the keys of its cells (its most
  frequent label), an overflow page by the key whose value continues on it;
- a leaf page of the key index by its keys, as ``key index: <label>``;
- interior pages and the delta runs' table are labelled as
  such; rows of the delta runs' table (their first column is not a key) as
  ``(delta runs)``.

A key's label is its tuple with numbers and bytes replaced by ``#`` and ``b``, cut after
five elements (``('panes', 'reducer', #, ...)``).

Run: ``python -m bench.wal_pages <store.db-wal> [--top 25]``.
"""

from __future__ import annotations

import argparse
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from millstream.state.keys import unpack

HEADER = 32
FRAME_HEADER = 24


@dataclass
class LogBytes:
    """The log's frames and commits, and its bytes per label."""

    page_size: int
    frames: int = 0
    commits: int = 0
    by_label: Counter[str] = field(default_factory=Counter)
    distinct_pages: set[int] = field(default_factory=set)
    frames_per_commit: list[int] = field(default_factory=list)

    @property
    def log_bytes(self) -> int:
        """Bytes the log holds (what the commits wrote)."""
        return HEADER + self.frames * (self.page_size + FRAME_HEADER)

    @property
    def checkpoint_bytes(self) -> int:
        """Bytes a checkpoint of this log writes into the database file."""
        return len(self.distinct_pages) * self.page_size


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = data[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return value, at + i + 1
    raise AssertionError("unreachable")


def label_of(key: bytes) -> str:
    """A key's label: its tuple's shape, cut after five elements."""
    try:
        parts = unpack(key)
    except (struct.error, ValueError):  # a key its page holds only the start of
        return "(undecodable key)"
    shown = []
    for part in parts[:5]:
        if isinstance(part, str):
            shown.append(repr(part))
        elif isinstance(part, bytes):
            shown.append("b")
        else:
            shown.append("#")
    return "(" + ", ".join(shown) + (", ...)" if len(parts) > 5 else ")")


def _leaf_cells(page: bytes, base: int, usable: int) -> list[tuple[str, int]]:
    """Label and first overflow page (0: none) of each cell of a table leaf page."""
    count = struct.unpack_from(">H", page, base + 3)[0]
    out = []
    for i in range(count):
        at = struct.unpack_from(">H", page, base + 8 + 2 * i)[0]
        size, at = _varint(page, at)
        _, at = _varint(page, at)  # rowid
        local = size
        limit = usable - 35
        if size > limit:
            least = (usable - 12) * 32 // 255 - 23
            local = least + (size - least) % (usable - 4)
            if local > limit:
                local = least
        header_size, p = _varint(page, at)
        key_type, _ = _varint(page, p)
        overflow = struct.unpack_from(">I", page, at + local)[0] if size > limit else 0
        if key_type < 12 or key_type % 2:  # not a blob first: a row of the runs table
            out.append(("(delta runs)", overflow))
            continue
        key = page[at + header_size : at + header_size + (key_type - 12) // 2]
        out.append((label_of(key), overflow))
    return out


def _index_cells(page: bytes, base: int) -> list[str]:
    """Label of each cell of a leaf page of the key index (keys are short: no overflow)."""
    count = struct.unpack_from(">H", page, base + 3)[0]
    out = []
    for i in range(count):
        at = struct.unpack_from(">H", page, base + 8 + 2 * i)[0]
        _, at = _varint(page, at)
        header_size, p = _varint(page, at)
        key_type, _ = _varint(page, p)
        key = page[at + header_size : at + header_size + max(0, (key_type - 12) // 2)]
        out.append(label_of(key))
    return out


def _label_commit(frames: list[tuple[int, bytes]], usable: int) -> list[str]:
    """Labels of one commit's frames. SQLite writes a commit's pages in page order, so an
    overflow page may come before the leaf that points to it: leaves are read first."""
    pages = dict(frames)
    owner: dict[int, str] = {}
    for number, page in pages.items():
        base = 100 if number == 1 else 0
        if page[base] == 0x0D:
            for cell_label, overflow in _leaf_cells(page, base, usable):
                while overflow in pages and overflow not in owner:
                    owner[overflow] = cell_label + " overflow"
                    overflow = struct.unpack_from(">I", pages[overflow], 0)[0]
    labels = []
    for number, page in frames:
        base = 100 if number == 1 else 0
        kind = page[base]
        if number in owner:
            label = owner[number]
        elif kind == 0x0D:
            counts = Counter(cell_label for cell_label, _ in _leaf_cells(page, base, usable))
            label = counts.most_common(1)[0][0] if counts else "(empty table leaf)"
        elif kind == 0x0A:
            counts = Counter(_index_cells(page, base))
            label = "key index: " + (counts.most_common(1)[0][0] if counts else "empty")
        elif kind in (0x02, 0x05):
            label = "interior page"
        else:
            label = "other page (free list, schema)"
        labels.append(label)
    return labels


def read_log(path: Path) -> LogBytes:
    """Parse a SQLite write-ahead log and label each frame's page."""
    data = path.read_bytes()
    page_size = struct.unpack_from(">I", data, 8)[0]
    result = LogBytes(page_size)
    frame_bytes = FRAME_HEADER + page_size
    frames: list[tuple[int, bytes]] = []
    at = HEADER
    while at + frame_bytes <= len(data):
        number, after_commit = struct.unpack_from(">II", data, at)
        frames.append((number, data[at + FRAME_HEADER : at + frame_bytes]))
        at += frame_bytes
        if after_commit:
            for label in _label_commit(frames, page_size):
                result.by_label[label] += frame_bytes
            result.frames += len(frames)
            result.commits += 1
            result.frames_per_commit.append(len(frames))
            result.distinct_pages.update(number for number, _ in frames)
            frames = []
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    log = read_log(args.log)
    per_commit = sorted(log.frames_per_commit) or [0]
    print(
        f"log {log.log_bytes:,} bytes in {log.frames:,} frames, {log.commits:,} commits "
        f"(frames per commit: median {per_commit[len(per_commit) // 2]}, "
        f"largest {per_commit[-1]}); a checkpoint writes {log.checkpoint_bytes:,} bytes "
        f"({len(log.distinct_pages):,} pages)"
    )
    for label, n in log.by_label.most_common(args.top):
        print(f"{n:>12,}  {100 * n / log.log_bytes:5.1f} %  {label}")


if __name__ == "__main__":
    main()
