"""Each rank's printed output, shown in the cell with its rank in front, capped in size (notebook 04)."""

from __future__ import annotations

import os
import sys

MAX_OUTPUT_BYTES = 2**20  # per rank: a print in a tight loop must not flood the notebook (or the grader)


class OutputRelay:
    """Copies each rank's stdout and stderr into ours, line by line, with a `[rank N]` prefix."""

    def __init__(self, prefix: bool, limit: int = MAX_OUTPUT_BYTES):
        self.prefix, self.limit = prefix, limit
        self.partial: dict[tuple[int, int], bytes] = {}
        self.seen: dict[int, int] = {}
        self.streams: dict = {}  # read end of a rank's pipe -> (rank, 1 for stdout or 2 for stderr)

    def watch(self, conn, rank: int, stream: int) -> None:
        self.streams[conn] = (rank, stream)

    def pump(self, conn) -> None:
        """Move what one rank wrote on one stream into ours; forget the stream at its end."""
        rank, stream = self.streams[conn]
        try:
            data = os.read(conn.fileno(), 65536)
        except OSError:
            data = b""
        if data:
            self.feed(rank, stream, data)
        else:
            del self.streams[conn]
            conn.close()

    def feed(self, rank: int, stream: int, data: bytes) -> None:
        seen = self.seen.get(rank, 0)
        self.seen[rank] = seen + len(data)
        if seen >= self.limit:
            return  # still read, so the rank never blocks on a full pipe, but no longer shown
        if seen + len(data) > self.limit:
            note = f"\n… rank {rank} printed more than {self.limit // 2**20} MiB; the rest is not shown\n"
            data = data[: self.limit - seen] + note.encode()
        data = self.partial.pop((rank, stream), b"") + data
        *lines, rest = data.split(b"\n")
        if rest:
            self.partial[(rank, stream)] = rest
        for line in lines:
            self._write(rank, stream, line)

    def flush(self) -> None:
        for (rank, stream), rest in sorted(self.partial.items()):
            self._write(rank, stream, rest)
        self.partial.clear()

    def close(self) -> None:
        for conn in self.streams:
            conn.close()
        self.streams.clear()

    def _write(self, rank: int, stream: int, line: bytes) -> None:
        target = sys.stdout if stream == 1 else sys.stderr
        text = line.decode("utf-8", "replace")
        target.write(f"[rank {rank}] {text}\n" if self.prefix else f"{text}\n")
        target.flush()
