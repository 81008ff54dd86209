"""The scorer's log: JSON lines on stderr, written off the request path.

The request path logs rejections on nearly every filter, and kube-scheduler waits for every
answer, so a request only puts a record on a queue; a writer thread formats what is queued and
writes it in one write every `LOG_FLUSH_INTERVAL_S`. Below the serving layer, which relies on
it, and the command line, which starts it.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TextIO

# A log line's structured fields: JSON values by name.
Fields = dict[str, object]


class DeferredFields(Mapping[str, object]):
    """A log record's `fields`, built when first read: by the writer thread when it formats
    the line, not by the request that logged it. `build` must read only values that do not
    change after the call that logs (immutable ones, or copies made for the record)."""

    __slots__ = ("_build", "_fields")

    def __init__(self, build: Callable[[], Fields]) -> None:
        self._build = build
        self._fields: Fields | None = None

    def _built(self) -> Fields:
        # Built once, by whichever thread reads first (a racing second read builds the same
        # fields). Not `functools.cache`: making its wrapper cost the request path more.
        fields = self._fields
        if fields is None:
            fields = self._fields = self._build()
        return fields

    def __getitem__(self, key: str) -> object:
        return self._built()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, and the record's `fields`."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            document.update(fields)
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:  # formatted already by the queue handler
            document["exception"] = record.exc_text
        return json.dumps(document, default=str, separators=(",", ":"))


# How long a log line may wait in the queue: the writer wakes this often and writes all that
# is queued in one write. A wake-up per record (the standard QueueListener) cost every filter
# that logs its rejections a thread hand-off and a write (docs/performance.md, "Where the
# scorer's time goes").
LOG_FLUSH_INTERVAL_S: Final = 0.05


def configure_logging(level: str) -> BatchedLogWriter:
    """JSON lines on stderr, written by a writer thread so the request path only enqueues."""
    # What a record would otherwise look up as it is made, on the request path, for fields
    # the JSON lines do not carry: the calling frame, the thread, the process (the logging
    # HOWTO's "Optimization" settings).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    records: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(FieldsQueueHandler(records))
    root.setLevel(level.upper())
    return BatchedLogWriter(records, sys.stderr, JsonLogFormatter()).start()


class BatchedLogWriter:
    """Formats the queued records and writes them, every `interval_s` and once more on `stop`."""

    def __init__(
        self,
        records: queue.SimpleQueue[logging.LogRecord],
        stream: TextIO,
        formatter: logging.Formatter,
        interval_s: float = LOG_FLUSH_INTERVAL_S,
    ) -> None:
        self.records = records
        self.stream = stream
        self.formatter = formatter
        self.interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> BatchedLogWriter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Write what is queued and end the thread (the lines of a shutdown are not lost)."""
        self._stopping.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stopping.wait(self.interval_s):
            self.flush()
        self.flush()

    def flush(self) -> None:
        lines: list[str] = []
        while True:
            try:
                record = self.records.get_nowait()
            except queue.Empty:
                break
            try:
                lines.append(self.formatter.format(record))
            except Exception:  # one bad record must not stop the log
                lines.append(
                    json.dumps(
                        {"level": "ERROR", "logger": record.name, "msg": "unformattable record"}
                    )
                )
        if not lines:
            return
        try:
            self.stream.write("\n".join(lines) + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass  # stderr gone (closed pipe, closed file): nothing left to tell


class FieldsQueueHandler(logging.handlers.QueueHandler):
    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        # Keep `fields` and the traceback for the JSON formatter instead of flattening the
        # record into text here (the default), which would also cost time on the request path.
        if not record.args and not record.exc_info:
            # Nothing to flatten (the request path's lines): the record goes as it is, rather
            # than as a copy made on the request path.
            return record
        prepared = logging.makeLogRecord(record.__dict__)
        prepared.msg = record.getMessage()
        prepared.args = None
        if record.exc_info:
            prepared.exc_text = logging.Formatter().formatException(record.exc_info)
            prepared.exc_info = None
        return prepared
