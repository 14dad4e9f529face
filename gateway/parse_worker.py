"""The gateway's body-parsing process (see :mod:`gateway.body_parser`): reads bodies on stdin, answers on the
descriptor it was started with as stdout, and exits when the gateway closes its stdin (or dies).

Each request is a frame ``!II`` (length of the pickled endpoint and options, length of the body), the pickle,
then the body's bytes. Each answer is ``!I`` and a pickle of ``(True, ParsedRequest)`` or ``(False, error)``.
"""

from __future__ import annotations

import os
import pickle
import struct
import sys
from typing import BinaryIO

REQUEST_HEADER = struct.Struct("!II")
REPLY_HEADER = struct.Struct("!I")
READY = b"R"


def _read_exactly(source: BinaryIO, size: int) -> bytes | None:
    data = source.read(size)
    return data if len(data) == size else None


def serve(source: BinaryIO, sink: BinaryIO) -> None:
    """Answer framed parse requests from ``source`` on ``sink`` until ``source`` ends."""
    from gateway.request_parsing import parse_request, preload_protocol_models

    preload_protocol_models()
    sink.write(READY)
    sink.flush()
    while (header := _read_exactly(source, REQUEST_HEADER.size)) is not None:
        meta_size, body_size = REQUEST_HEADER.unpack(header)
        meta, raw = _read_exactly(source, meta_size), _read_exactly(source, body_size)
        if meta is None or raw is None:
            return
        endpoint, options = pickle.loads(meta)
        try:
            reply = pickle.dumps((True, parse_request(raw, endpoint, options)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # a GatewayError the client sees, or what the gateway would have raised itself
            try:
                reply = pickle.dumps((False, exc), protocol=pickle.HIGHEST_PROTOCOL)
            except Exception:  # an exception that does not pickle: its kind and text
                reply = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {str(exc)[:500]}")))
        sink.write(REPLY_HEADER.pack(len(reply)) + reply)
        sink.flush()


def main() -> None:
    """Keep replies on the original stdout; whatever the imports print goes to stderr."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    serve(sys.stdin.buffer, replies)


if __name__ == "__main__":
    main()
