"""The child process of ``test_outbox``: an exporter over a log of numbered positions.

    python -m tests.storage.outbox_sender DSN SCHEMA STREAM SINK LOG_END [--die-after-staging]

Event ``p`` of the log is ``(p, f"{STREAM}:{p}", "row-upsert", b"payload p")`` and sets key
``k{p % 2}``. The sender first drains what its stream still owes (``OutboxStore.drain``: delivery
appends the event id to the file ``SINK``), printing ``reoffered`` and the ids; then stages the log
from the stream's checkpoint up to ``LOG_END`` with the checkpoint, printing ``staged`` and the
ids. With ``--die-after-staging`` it delivers only the first staged event, prints ``ready`` and
blocks on stdin (the parent kills it); otherwise it drains everything and prints ``done`` with
the frontier.
"""

from __future__ import annotations

import argparse
import json
import sys

from contextful.storage.outbox import OutboxEvent, open_outbox_store


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("dsn", "schema", "stream", "sink"):
        parser.add_argument(name)
    parser.add_argument("log_end", type=int)
    parser.add_argument("--die-after-staging", action="store_true")
    args = parser.parse_args()
    outbox = open_outbox_store("postgres", dsn=args.dsn, schema=args.schema)

    def send(event: OutboxEvent) -> dict[str, bytes]:
        with open(args.sink, "a") as fh:
            fh.write(f"{event.event_id} {event.payload.decode()}\n")
        return {f"k{event.position % 2}": event.payload}

    reoffered = outbox.drain(args.stream, send)
    print("reoffered " + json.dumps([e.event_id for e in reoffered]), flush=True)
    start = (outbox.stream_state(args.stream).checkpoint or 0) + 1
    events = [(p, f"{args.stream}:{p}", "row-upsert", f"payload {p}".encode()) for p in range(start, args.log_end + 1)]
    staged = outbox.stage(args.stream, events, args.log_end, now_us=start)
    print("staged " + json.dumps([e.event_id for e in staged]), flush=True)
    if args.die_after_staging:
        first = staged[0]
        outbox.acknowledge(args.stream, [first.event_id], send(first))
        print("ready", flush=True)
        sys.stdin.read()  # the parent kills this process here
        sys.exit(3)  # stdin closed: the parent is gone, and this machine with it
    outbox.drain(args.stream, send)
    print("done " + json.dumps(outbox.stream_state(args.stream).frontier), flush=True)
    outbox.close()


if __name__ == "__main__":
    main()
