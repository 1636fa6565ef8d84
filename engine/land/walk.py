"""Running an ``http`` pipeline: walk the source page by page, commit rows with their position.

One run of an ``http`` pipeline (``engine.land.http`` describes the walks):

1. open the stored position and check its field against the declared ``incremental`` field before
   any request is built (``run.advance.field-rename``);
2. pull page after page, each pull under the run's retry schedule (``engine.run.retry``): a 429,
   a 5xx, an unreachable server, a meter's denial or a struck connector bound is transient and the
   schedule waits and tries again; every bound hit is kept and lands on the run record
   (``run.retry.bound-hit-recorded``);
3. read each page's clocks (``engine.land.clocks``: instants as instants, the field's declared
   type honoured): a row without an orderable clock, or a switch between text, numeric and
   timestamp positions, fails the pull (``run.advance.unorderable-position``); a walk under an
   ``incremental`` field admits the rows after its floor and the rows at its floor it has not
   landed (``engine.land.position.Admission``: the last instant is re-read, nothing repeats);
4. a watermark walk is position-addressed: once the parts staged since the last commit reach
   ``checkpoint_bytes`` (512 MiB), the run commits them with the position after its last staged
   pull before staging more rows (``run.own.checkpoint-commit``), but only before a pull whose
   every clock passes the run's frontier, so no commit splits the rows of one instant
   (``run.own.checkpoint-frontier``); a checkpoint inside a walk stores the walk's floor and the
   next page's token, so a resumed run asks that page and admits rows from the same floor
   (``run.advance.walk-position``), and the walk's last commit stores the frontier as the new
   watermark. A url walk commits once (``run.own.checkpoint-scope``).

A failing pull fails the run: its staged rows since the last commit are dropped, the position
stays at the last commit, and a re-run walks on from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contextful.engine.config.manifest import PipelineSpec
from contextful.engine.guard import masked_failure
from contextful.engine.land.clocks import ClockReader, span
from contextful.engine.land.declaration import table_declaration
from contextful.engine.land.decode import Decoder
from contextful.engine.land.decode_child import conform
from contextful.engine.land.http import PAGE_CAP, HttpConfig, resolved_headers
from contextful.engine.land.journal import PullJournal
from contextful.engine.land.meter import Meter
from contextful.engine.land.position import Admission, Position, open_position, since_text
from contextful.engine.land.results import PipelineResult, Progress
from contextful.engine.land.sink import LandingSink
from contextful.engine.land.typed import read_types
from contextful.engine.run.retry import RetrySchedule
from contextful.storage import Store
from contextful.storage.errors import ContextfulError, PageCapExceeded, SourceResponseMalformed
from contextful.storage.lazy import lazy_module

if TYPE_CHECKING:
    import pyarrow as pa
else:
    pa = lazy_module("pyarrow")


@dataclass
class Page:
    label: str
    url: str
    rows: pa.Table
    next_url: str | None
    next_token: Any
    span: tuple[Any, Any] | None
    values: pa.Array | pa.ChunkedArray | None = None
    """The rows' clocks as comparable values (under an ``incremental`` field)."""
    digests: list[str] | None = None
    """One content digest per row (under an ``incremental`` field)."""


class _Walker:
    """Issues one walk's requests: meter, retries, the page cap, the connector child."""

    def __init__(self, spec: PipelineSpec, config: HttpConfig, decoder: Decoder, schedule: RetrySchedule,
                 meter: Meter | None, tracker: ClockReader | None, cancel: threading.Event | None,
                 journal: PullJournal | None) -> None:
        self.spec = spec
        self.journal = journal
        self.config = config
        self.decoder = decoder
        self.schedule = schedule
        self.meter = meter
        self.tracker = tracker
        self.cancel = cancel
        self.requests = 0
        self.since_progress = 0
        self.served_max: Any = None
        self.pages = 0

    def page(self, url: str) -> Page:
        self.pages += 1
        label = f"{self.spec.id} page {self.pages}"
        try:
            rows, meta = self.schedule.run(label, lambda _attempt: self._request(label, url), cancel=self.cancel)
        except ContextfulError:
            if self.journal is not None:
                self.journal.execution.raise_if_canceled()  # a wait the cancel ended: the Canceled tag
            raise
        values = digests = None
        if self.tracker is not None:
            rows = self.tracker.typed(rows)
            values = self.tracker.values(rows, f"page {self.pages} ({url})")
            digests = list(meta.get("digests") or [])
            if len(digests) != rows.num_rows:
                raise SourceResponseMalformed(url, f"{rows.num_rows} row(s) but {len(digests)} record digest(s)")
        clocks = span(values)
        if clocks is not None:
            if self.served_max is None or clocks[0] > self.served_max:
                self.since_progress = 1  # every clock passes every clock served before
            self.served_max = clocks[1] if self.served_max is None else max(self.served_max, clocks[1])
        if self.journal is not None:
            self.journal.pulled(label, {"url": url, "rows": rows.num_rows, "next_url": meta.get("next_url"),
                                        "next_token": meta.get("next_token"),
                                        "clocks": list(clocks) if clocks is not None else None})
        return Page(label, url, rows, meta.get("next_url"), meta.get("next_token"), clocks, values, digests)

    def _request(self, label: str, url: str) -> tuple[pa.Table, dict[str, Any]]:
        if self.meter is not None:
            self.meter.reserve()  # denial raises RateLimited; the schedule waits, never the meter
        if self.since_progress >= PAGE_CAP:
            raise PageCapExceeded(self.spec.id, PAGE_CAP, url)
        self.requests += 1
        self.since_progress += 1
        fetch = self.decoder.fetch(url, step=label, headers=self.config.headers, timeout_s=self.config.timeout_s,
                                   records=self.config.records, next_key=self.config.next_key,
                                   token_key=self.config.token_key, digests=self.tracker is not None)
        batches = list(fetch)
        return _one_table(batches), fetch.meta or {}


def _one_table(batches: list[pa.RecordBatch]) -> pa.Table:
    if not batches:
        return pa.table({})
    schema = batches[-1].schema  # later batches only widen: earlier ones conform to the last
    return pa.concat_tables([conform(pa.Table.from_batches([b]), schema) for b in batches])


def run_http_pipeline(store: Store, spec: PipelineSpec, decoder: Decoder, *, root: Path, scope: str,
                      checkpoint_bytes: int, progress: Callable[[Progress], None] | None = None,
                      cancel: threading.Event | None = None,
                      sleep: Callable[[float], None] | None = None,
                      journal: PullJournal | None = None) -> PipelineResult:
    """Walk ``spec``'s API into its table; its headers' secret references (``engine.config.secrets``)
    resolve against the project at ``root`` first, before any request or write."""
    started = time.monotonic()
    config = resolved_headers(spec.id, HttpConfig.from_config(spec.source.config), root)
    table = store.create_table(spec.table, spec.primary_key, provisional=True, declared=table_declaration(spec))
    stored = table.cursor(scope)
    position = open_position(scope, stored[0] if stored else None, spec.incremental)  # before any request
    schedule = RetrySchedule.from_config(config.retry, where=f"[[pipeline]] {spec.id!r} source.config.retry")
    if sleep is not None:
        schedule.sleep = sleep
    meter = Meter.from_config(config.url, config.rate_limit) if config.rate_limit else None
    declared = read_types({k: v for k, v in spec.types.items() if k == spec.incremental})
    tracker = (ClockReader(scope, spec.table, spec.incremental, position.clock, declared.get(spec.incremental))
               if spec.incremental else None)
    walker = _Walker(spec, config, decoder, schedule, meter, tracker, cancel, journal)
    if journal is not None:
        journal.execution.attach_retry(schedule)
    result = PipelineResult(spec.id, [])
    run = _Run(store, spec, scope, walker, checkpoint_bytes)
    try:
        if config.walk_kind(spec.incremental) == "watermark":
            assert tracker is not None
            run.watermark_walk(position, tracker, progress, started)
        else:
            run.url_walk(position, config, progress, started)
    except BaseException as exc:
        run.sink.abort(masked_failure(exc))  # each run staged since the last commit records why
        raise
    finally:
        run.abort()
        result.tables = run.sink.results()
        result.pulls = walker.requests
        result.bound_hits = [hit.to_json() for hit in schedule.bound_hits]
        result.seconds = time.monotonic() - started
    return result


class _Run:
    """The staging side of one walk: the landing sink, checkpoints, the committed position."""

    def __init__(self, store: Store, spec: PipelineSpec, scope: str, walker: _Walker, checkpoint_bytes: int) -> None:
        self.spec = spec
        self.scope = scope
        self.walker = walker
        self.checkpoint_bytes = checkpoint_bytes
        self.sink = LandingSink(store, spec)

    def stage(self, rows: pa.Table, pull: str) -> None:
        self.sink.stage(rows, pull)

    def commit(self, position: Position | None) -> None:
        """Commit what is staged with ``position`` (a position alone still commits: it moved)."""
        meta = {"bound_hits": [hit.to_json() for hit in self.walker.schedule.bound_hits]}
        value = position.to_json() if position is not None else None
        if self.walker.journal is not None:
            self.walker.journal.before_commit()
        result = self.sink.commit(self.scope if position is not None else None, value, meta)
        if result is not None and self.walker.journal is not None:
            self.walker.journal.checkpoint(value, result)

    def abort(self) -> None:
        self.sink.abort()

    def staged_reach(self, threshold: int) -> bool:
        return self.sink.staged_reach(threshold)

    def report(self, progress: Callable[[Progress], None] | None, started: float) -> None:
        if progress is not None:
            landed = self.sink.landings[self.spec.table]
            progress(Progress(self.spec.id, self.walker.pages, None, landed.rows + self.sink.staged_rows,
                              landed.bytes + self.sink.staged_bytes_written, len(self.sink.landings),
                              time.monotonic() - started, unit="pages"))

    # --- the two walks ---------------------------------------------------------------------------

    def watermark_walk(self, position: Position, tracker: ClockReader,
                       progress: Callable[[Progress], None] | None, started: float) -> None:
        config = self.walker.config
        admission = Admission(position)
        token = position.token
        since = since_text(position.since, tracker.clock) if position.since is not None else None
        committed = stored = position.to_json() if position.field else None
        while True:
            asked = admission.checkpoint(token, tracker.clock)  # before this page: what a resumed walk would ask
            page = self.walker.page(config.page_url(since, token))
            passes = page.span is None or admission.frontier is None or page.span[0] > admission.frontier
            if passes and token is not None and self.staged_reach(self.checkpoint_bytes):
                self.commit(asked)  # a checkpoint: the position after the last staged pull
                committed = asked.to_json()
            self.stage(self._admitted(admission, page), page.label)
            self.report(progress, started)
            if page.next_token is None:
                break
            if page.next_token == token:
                raise SourceResponseMalformed(page.url, f"the page answered its own token {token!r} as the next one")
            token = page.next_token
        final = admission.final(tracker.clock)
        if self.sink.pending or final.to_json() != (committed or stored):
            self.commit(final)

    def url_walk(self, position: Position, config: HttpConfig,
                 progress: Callable[[Progress], None] | None, started: float) -> None:
        tracker = self.walker.tracker
        admission = Admission(position)
        since = since_text(position.since, position.clock) if position.since is not None else None
        url: str | None = config.first_url(since)
        seen: set[str] = set()
        while url is not None:
            page = self.walker.page(url)
            self.stage(self._admitted(admission, page) if tracker is not None else page.rows, page.label)
            self.report(progress, started)
            seen.add(url)
            if config.paginate == "none":
                break
            url = page.next_url
            if url in seen:
                raise SourceResponseMalformed(page.url, f"the next page is {url}, a page this walk already read")
        final = admission.final(tracker.clock) if tracker is not None else None
        self.commit(final)  # a url walk commits once

    @staticmethod
    def _admitted(admission: Admission, page: Page) -> pa.Table:
        """The page's new rows; the admission's frontier moves over the page."""
        if page.values is None or page.digests is None:
            return page.rows
        mask = admission.admit(page.values, page.digests)
        admission.observe(page.values, page.digests, mask)
        return page.rows.filter(mask)
