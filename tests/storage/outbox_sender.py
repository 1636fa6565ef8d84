"""The child process of ``test_outbox``: an exporter over a log of numbered positions.

    python -m tests.storage.outbox_sender KIND LOCATION SCHEMA TOKEN STREAM SINK LOG_END [--die-after-staging | --die-after-delivery]

KIND is ``postgres`` (LOCATION the DSN, SCHEMA its schema) or ``d1`` (LOCATION the Worker's URL,
SCHEMA the namespace, TOKEN its token; ``-`` or empty for postgres).

Event ``p`` of the log is ``(p, f"{STREAM}:{p}", "row-upsert", b"payload p")`` and sets key
``k{p % 2}``. The sender first drains what its stream still owes (``OutboxStore.drain``: delivery
appends the event id to the file ``SINK``), printing ``reoffered`` and the ids; then stages the log
from the stream's checkpoint up to ``LOG_END`` with the checkpoint, printing ``staged`` and the
ids. With ``--die-after-staging`` it delivers and acknowledges only the first staged event, prints
``ready`` and blocks on stdin (the parent kills it); with ``--die-after-delivery`` it delivers the
first staged event and, before acknowledging it, does the same (the sink committed, the outbox
never heard); otherwise it drains everything and prints ``done`` with the frontier.
"""

from __future__ import annotations

import argparse
import json
import sys

from contextful.storage.outbox import OutboxEvent, open_outbox_store


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("kind", "location", "schema", "token", "stream", "sink"):
        parser.add_argument(name)
    parser.add_argument("log_end", type=int)
    parser.add_argument("--die-after-staging", action="store_true")
    parser.add_argument("--die-after-delivery", action="store_true")
    args = parser.parse_args()
    if args.kind == "d1":
        outbox = open_outbox_store("d1", url=args.location, token=args.token, namespace=args.schema)
    else:
        outbox = open_outbox_store("postgres", dsn=args.location, schema=args.schema)

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
    if args.die_after_staging or args.die_after_delivery:
        first = staged[0]
        delivered = send(first)
        if args.die_after_staging:
            outbox.acknowledge(args.stream, [first.event_id], delivered)
        print("ready", flush=True)
        sys.stdin.read()  # the parent kills this process here
        sys.exit(3)  # stdin closed: the parent is gone, and this machine with it
    outbox.drain(args.stream, send)
    print("done " + json.dumps(outbox.stream_state(args.stream).frontier), flush=True)
    outbox.close()


if __name__ == "__main__":
    main()
