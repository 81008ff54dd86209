"""A kube-scheduler extender that decides nothing, on the scorer's own HTTP edge.

    python -m benchmarks.null_extender --port 8890

filter passes every node it is sent, prioritize scores each 0. The real-scheduler benchmark runs
it beside the scorer to split the extender's cost: what the scorer's HTTP edge costs in Python
(this) against what its verdicts add (the scorer), next to what the mechanism itself costs with
a compiled server (`tools/k8s/cmd/null-extender`).

With `--record FILE` it appends each request's verb and NodeNames to FILE as a JSON line: what a
real kube-scheduler sends, for `benchmarks.window_check` to compare with the benchmarks' model.
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Sequence
from contextlib import nullcontext
from typing import IO, Final

import msgspec

from exporter_scheduler.edges.server import HttpServer
from exporter_scheduler.serving.echo import Buffer
from exporter_scheduler.serving.responses import Response


class _Args(msgspec.Struct):
    NodeNames: list[str] | None = None


_DECODE: Final = msgspec.json.Decoder(_Args).decode
_ENCODE: Final = msgspec.json.Encoder().encode


class NullApp:
    """Names-only replies that pass every node with score 0."""

    max_body_bytes: Final = 64 * 1024 * 1024

    def __init__(self, record: IO[bytes] | None = None) -> None:
        self._record = record
        self._record_lock = threading.Lock()

    def respond(self, method: str, path: str, query: bytes, body: Buffer) -> Response:
        if method != "POST":
            return Response(200, b"ok\n", b"text/plain")
        names = _DECODE(body).NodeNames or []
        if self._record is not None:
            line = _ENCODE({"verb": path.rsplit("/", 1)[-1], "names": names}) + b"\n"
            with self._record_lock:
                self._record.write(line)
                self._record.flush()
        if path.endswith("/filter"):
            return Response(
                200,
                b'{"Nodes":null,"NodeNames":'
                + _ENCODE(names)
                + b',"FailedNodes":{},"FailedAndUnresolvableNodes":{},"Error":""}',
            )
        return Response(200, _ENCODE([{"Host": name, "Score": 0} for name in names]))

    def body_too_large(self) -> Response:
        return Response(413, b'{"Error":"too large"}')


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.null_extender")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", help="append each request's verb and NodeNames to this file")
    args = parser.parse_args(argv)
    with open(args.record, "ab") if args.record else nullcontext() as record:
        server = HttpServer(NullApp(record), host="127.0.0.1", port=args.port)
        signal.signal(signal.SIGTERM, lambda *_: server.request_stop())
        server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
