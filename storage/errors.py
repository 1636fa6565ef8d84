"""The error catalogue: every error Contextful raises, one class per spec error name.

It lives in ``storage`` because every package imports it and ``storage`` imports nothing from
``engine`` or ``iceberg``. Each class carries a short ``category``; the CLI maps the category to an
exit code, the served face to an HTTP status. Retry decisions are one ``isinstance`` check against
the two marker bases.

Hierarchy::

    ContextfulError                      root; .category, .exit_code, .http_status
    ├── TransientError                   marker: a later attempt may succeed
    │   ├── CommitConflict               the table head moved under a commit (conflict)
    │   ├── StagingFailed                writing a part failed (disk full, permissions, network)
    │   ├── CatalogUnavailable           the catalog database is locked, down or unreachable
    │   ├── CommitOutcomeUnknown         a commit was sent and its outcome could not be learned (unknown)
    │   ├── RateLimited                  a limiter or server denied the call; the retry schedule waits
    │   ├── ConnectorBoundHit            a connector struck its linear-memory or call-deadline bound
    │   ├── SourceUnavailable            a source is unreachable or answered 5xx
    │   ├── AddressInUse                 serve's address is held by another socket (the port may free up)
    │   ├── ControlSnapshotUnreadable, ControlPointerMalformed  the applied pointer or snapshot cannot be read
    │   ├── ControlUnavailable       a served control request failed for no refusal (HTTP 503, no internal text)
    │   ├── DelegateAnswerRejected   a delegate's answer unsigned, skewed or malformed (its attempt closes)
    │   ├── DelegateAnsweredTransient  a delegate answered transient (or defer, with no isolated items)
    │   ├── ExecutionSuspended           an execution stopped waiting on a pending awakeable; reopen to resume
    │   └── DeriveStepExit, DeriveStepTimeout  a derive engine step exited non-zero or passed its deadline
    └── TerminalError                    marker: retrying the same input fails the same way
        ├── SpecInvalid                  configuration or request breaks the spec (spec-invalid)
        │   ├── StorageProfileUnknown
        │   ├── CatalogDsnMissing        the postgres profile without CONTEXTFUL_POSTGRES_DSN (or libpq's PGHOST, PGSERVICE)
        │   ├── BodyUnregistered         configuration selects a body name no host registered
        │   ├── BodyIdentityConfigured   configuration gives a body's implementation identity beside its name
        │   ├── PipelineSeedDeclarationMissing
        │   ├── LeaseCursorKindMismatch
        │   ├── TableNameInvalid
        │   ├── ModalityInvalid
        │   ├── ProjectInvalid
        │   ├── ProjectModuleUnimportable  a [project] modules entry or a contextful.tasks entry point fails to import
        │   ├── SecretUnresolved         a ${secret:NAME} reference found in neither the environment nor the secrets file
        │   ├── CatalogPathMissing       a remote store root under the local profile, no [project] catalog
        │   ├── QueryInvalid
        │   ├── AnswerTooLarge           a gateway answer crossed its byte bound before a byte was sent (HTTP 413)
        │   ├── ManifestInvalid          every problem of a manifest, each one of the classes below
        │   ├── ManifestKeyUnknown
        │   ├── ManifestValueInvalid
        │   ├── PipelineIdDuplicate
        │   ├── PipelineAfterUnknown
        │   ├── PipelineAfterCycle
        │   ├── PipelineSourceKindUnknown
        │   ├── PipelineNormalizeModeUnknown
        │   ├── ModelCycle               [[model]] blocks read each other in a cycle
        │   ├── ExportNamespaceShared    two [[export]] blocks share a namespace, credential or table
        │   ├── PipelinePrimaryKeyInvalid  a primary_key column the manifest shows can never be a column
        │   ├── TableNameCollision       a table named <root>__... beside a relational root, or two differing in case
        │   ├── RequestBodyTooLarge      a served request's body (sent or decoded) is past its bound (HTTP 413)
        │   ├── PipelineInlineStepBody, PipelineUndeclaredControlFlow, PipelineNodeIdCollision
        │   │                            a manifest the plan compiler refuses (run.compile.*)
        │   ├── JobKindUnknown           a [[job]] kind outside the union, an argv or a host command
        │   ├── JobKindUndispatched      a [[job]] of a kind no job dispatches (sweep, rebuild-catalog, validate)
        │   ├── JobConcurrencyUnset      a store-driven [[job]] without a positive max_in_flight
        │   ├── JobTargetUnbound         a [[job]] target naming no model (build) or produced table (fold)
        │   ├── JobBodyUnregistered      a store-driven [[job]] body no executable registers, no bound delegate
        │   ├── JobItemKeyInvalid        a store-driven job's input relation serves a null or repeated item key
        │   ├── JobAnswerInvalid         a store-driven body answers no rows mapping, or rows for a table not in `tables`
        │   ├── JobPlanInvalid           a plan job's file is missing, unreadable, altered, or compiled from other declarations
        │   ├── JobStoreUnbound          a sync-push [[job]] fired on a store with no corpus bucket to push to
        │   ├── ModelInputUnknown        a model's SQL reads a table nothing produces and the store lacks
        │   ├── ArgumentInvalid          an option's or argument's value cannot be what it names (address, instant, window)
        │   ├── ConfirmationRequired     a command that forgets state was not confirmed (no terminal, no --yes)
        │   ├── IssuerKeyInvalid         an issuer key (pinned public key, private key file) is not an Ed25519 key
        │   ├── FireCredentialMissing    serve schedules a store-driven or synthesize job and holds no credential to give it
        │   ├── FireCredentialZoneUnset  serve would mint fire credentials and [project.zone] declares no default
        │   ├── ScheduleUnreadable, TriggerAdapterUnknown, TriggerFaceMissing, DispatchUnitNotAHead,
        │   │   ApplyValidationRefused   the control plane's arm, trigger, dispatch and apply refusals
        │   ├── AppliedContractMissing   an applied job's version holds no contract of a standalone table it uses
        │   ├── AppliedAuthorityChanged  a table's writer now differs from the one the job's version pinned
        │   ├── AppliedModelDisclosureChanged  a model's published contract differs from the job's version's
        │   ├── CycleControlSourceUnresolved  serve --cycle's configured control source does not resolve
        │   ├── ControlSourceNotLoopback, ControlRequestMalformed, SecretMaterialInDocument, EnforceRegionMismatch
        │   │                            synced control, served control and residency refusals (docs/control.md)
        │   ├── StepResultRefused, JobDelegateUnbound, DelegateHostRefused, DelegateTimeoutRefused,
        │   │   DelegateSubmitUnfilled, ConnectionRequestMalformed  workers', delegates' and connections' refusals
        │   └── DeriveNoStoreRoot, DeriveConfigKeyMissing, DeriveForeignOutputTable, DeriveReservedDiscriminator,
        │       DeriveFailureOffTable, DeriveOutputTablesMismatch, DeriveCycle, DeriveAfterConflict,
        │       DeriveEngineUnbound, DeriveCommandInManifest, DeriveUnknownTask, DeriveTaskNameTaken,
        │       DeriveDriverMismatch, DeriveEndpointHostNotBare, DeriveAdvisoryZone, DeriveShellCommand,
        │       DeriveEnvNameInvalid     a derive pipeline or engine binding the spec refuses (docs/derive.md)
        ├── Incompatible                 data cannot be reconciled with the store (incompatible)
        │   ├── SchemaIrreconcilable
        │   │   ├── PrimaryKeyWideningLossy  a key column would widen to a type not holding every key exactly
        │   │   └── OrderByWideningLossy     an order_by column would widen to a type not holding every value exactly
        │   ├── PrimaryKeyNull           a row holds null (or NaN) in a key column; its batch is refused
        │   ├── PrimaryKeyColumnMissing  a batch for a keyed table lacks a key column
        │   ├── InputUnreadable
        │   ├── InputMalformed           an input's bytes are not its format (a bad line, a damaged stream)
        │   ├── ParseCrashed             parse-crashed: a decoder child crossed its deadline or memory bound, or died
        │   ├── TypeSpellingUnreadable
        │   ├── TypedLandingFailed
        │   ├── CursorFieldMismatch, CursorPositionUnorderable
        │   ├── SourceResponseMalformed, SourceRequestRefused, PageCapExceeded
        │   ├── PipelineListIndexMissing
        │   ├── PipelineSeedCeilingBreached, PipelineSeedCeilingUnevaluable
        │   ├── ContractMismatch         contract-mismatch: a model's contract or result breaks the published one
        │   ├── ModelTestFailed          a model's data test found offending rows; nothing published
        │   ├── ColumnNamesCollide       two column or field names of a table differ only in case
        │   ├── SynthesizeTableIncompatible  a synthesize job's table lacks a column it reads, or its claims another key
        │   ├── PipelineTransformArity   a chain operation emitted more rows than it consumed
        │   ├── PublicationIncompatible  a publication's group cannot be delivered or activated as it stands
        │   ├── PublicationStorageUnsupported  the storage profile keeps no coordinated-group outbox
        │   └── DeriveUnitStatusUnknown, DeriveRemoteUrlUnsupported, DeriveMediaUnreadable,
        │       DeriveConfidenceOutOfRange, DeriveOutputCap, DeriveStepProducedNothing, DeriveHostNotAllowed
        │                                a derive unit's media or engine output cannot land (that unit fails)
        ├── Conflict                     two values disagree for good (conflict)
        │   ├── SyncCursorConflict, PipelineSeedSourceChanged, JournalConflict, OwnerPlanMismatch,
        │   │   ExecutionRewindUnsafe
        │   │   └── ExecutionHeld        (a JournalConflict) another process runs it now; this run did nothing (held)
        │   ├── AwakeableAlreadyResolved  an awakeable resolved with another payload (its value stays)
        │   ├── OwnerPinsMismatch        a pending owner pins other host-supplied identities than the claim
        │   ├── ExecutionWriterFenced    a superseded attempt reached effect dispatch or state publication
        │   ├── CancelTargetNotInFlight  `run cancel` named nothing pending (HTTP 409)
        │   ├── InputChanged             a landed files input has other content now, not only appended NDJSON
        │   ├── ExportCommitConflict      an Iceberg export's commit lost for good (ids changed, or 3 conflicts)
        │   ├── ProjectExists            init found a contextful.toml already
        │   ├── TableStillRead           table drop of a table a model or an [[export]] reads (without --force)
        │   ├── TableDeclarationChanged  the manifest declares a landed table otherwise than it landed (key, normalize)
        │   ├── SweepOriginOutOfOrder    a carried sweep's origin read before the origin preceding it landed
        │   ├── OutboxFrontierGap        an acknowledgement skipping a pending outbox event
        │   ├── StagingLeaseLost         a run's staging lease was ended by collection before it committed
        │   ├── ManifestVersionConflict  an apply lost the version claim to another apply (it reapplies)
        │   ├── StoreNotInitialized      an apply before the guarded import claimed v1 (HTTP 409)
        │   ├── ResidencySitesDiverge    a push found another site's residency allow-set differing from this one's
        │   ├── ConnectionIdConflict     a connection create repeating an id with another declaration
        │   └── DeriveSettledUnitRevived  a unit settled under its key by another run while this one derived it
        ├── Expired                      a window closed (expired; HTTP 410)
        │   ├── ReceiveBatchKeyExpired
        │   └── AwakeableTimedOut        an awakeable's deadline passed while it was pending
        ├── Refused                      an admitted caller asked beyond its grant (refused; HTTP 403)
        │   ├── ExportQueryRefused       a gateway request names a namespace, an undeclared template, ...
        │   ├── WriterPipelineRefused    a writer key posted to a pipeline it does not name
        │   ├── ReachRefused             a store opened under a fire credential read or wrote a table beyond its reach
        │   ├── QueryWriteRefused        `contextful sql` was given a statement that writes (CREATE, INSERT, COPY ... TO)
        │   ├── ControlAdminGrantMissing  a served /control/* credential without an Admin grant over * (untenanted)
        │   ├── DispatchSubmitRejected, DispatchCallbackRejected  a worker submission or callback not signed as it must be
        │   ├── ConnectionScopeDenied    a connection mutation by another tenant's or principal's credential
        │   └── ConnectorUploadRefused   an artifact uploaded through the operator surface
        ├── Unauthenticated              no admitted credential (unauthenticated; HTTP 401)
        │   ├── ReaderCredentialUnadmitted
        │   ├── WriterCredentialUnadmitted
        │   ├── CredentialUnadmitted     a signed credential missing, malformed, unpinned, badly signed, other audience
        │   │   └── CredentialExpired    its exp has passed
        │   └── ControlSnapshotUntrusted, ControlAttestationUnavailable, ControlOperatorAttestationInvalid
        │                                a pulled head, an apply or a console mutation whose signature is missing or bad
        ├── NotFound                     (not-found)
        │   ├── TableNotFound
        │   ├── SnapshotNotFound
        │   ├── InputNotFound
        │   ├── BlobNotFound
        │   ├── AwakeableUnknown         no awakeable holds the token
        │   ├── ProjectNotFound          no such directory, or no contextful.toml at or above it
        │   ├── StoreNotFound            a reading command found no store (it never creates one)
        │   ├── RunNotFound              `contextful run show` names a run no record holds
        │   ├── JobNotFound              `contextful job fire|history` names a job the applied version lacks
        │   ├── ConnectionUnknown        a pause or delete naming no standing connection
        │   └── ControlDraftAbsent       an Admin apply found no validated store draft
        ├── RunCanceled                  the Canceled tag: a run marked canceled gave up (canceled)
        └── Permanent                    the store or backend cannot do this (permanent)
            ├── ConditionalWriteUnsupported
            ├── StoreCatalogMismatch
            ├── StoreFormatNewer         a store written by a newer build (its store.json format); this build refuses it
            ├── SnapshotCollected
            ├── BlobCorrupt
            ├── QueryFailed              an admitted gateway query failed for a reason not the reader's (error id)
            ├── TableUnreadable          one table's view cannot be built; the other tables still read
            ├── CatalogRejected           the catalog database refused a write (integrity)
            ├── ScriptRuntimeLinked      a JavaScript engine is importable where plans are served
            ├── StorageCapabilityMissing  the profile lacks a binding an execution needs (before admission)
            ├── CallbackGuardHeld        a D1 guard protects a row, so its transfer or a second callback waits
            ├── ExecutionRecoveryMismatch no execution tables, or another project recovery identity
            ├── DelegateAnsweredPermanent  a delegate answered permanent (the item closes Permanent)
            └── ConfigOwnerUnconfigured  the configuration owner has no storage or credential (HTTP 503)

Messages are built from structured fields, so callers and tests read the fields, and the text
names what the spec says it names.
"""

from __future__ import annotations

from typing import Any, ClassVar

# Exit codes by category: documented in docs/cli.md.
EXIT_CODES: dict[str, int] = {
    "spec-invalid": 3,
    "incompatible": 4,
    "conflict": 5,
    "not-found": 6,
    "transient": 75,
    "unknown": 75,
    "expired": 7,
    "refused": 8,
    "unauthenticated": 9,
    "permanent": 1,
    "canceled": 10,
    "held": 11,
}

HTTP_STATUS: dict[str, int] = {
    "spec-invalid": 400,
    "incompatible": 422,
    "conflict": 409,
    "not-found": 404,
    "transient": 503,
    "unknown": 503,
    "expired": 410,
    "refused": 403,
    "unauthenticated": 401,
    "permanent": 500,
    "canceled": 409,
    "held": 409,
}


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its class name when the message is empty): what a
    catalogue error quotes of a driver's or library's error."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def whole_message(exc: BaseException) -> str:
    """Every line of an exception's message (its class name when the message is empty): what a
    catalogue error quotes of a query engine's error, whose later lines carry its hints (DuckDB's
    ``Did you mean "orders"?``, ``Candidate bindings: ...``). The CLI prints them on one line."""
    return str(exc).strip() or type(exc).__name__


class ContextfulError(Exception):
    """Root of every Contextful error. Subclasses set ``category`` and build ``detail``."""

    category: ClassVar[str] = "permanent"

    def __init__(self, detail: str, **fields: Any) -> None:
        self.detail = detail
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)
        super().__init__(detail)

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.category]

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.category]

    def __str__(self) -> str:
        return f"{self.name}: {self.detail}"

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class, detail and fields (subclasses take other constructor arguments): a
        child process that lands an input raises the same error in its parent (``engine.land.decode``)."""
        return _rebuilt, (type(self), self.detail, self.fields)


def _rebuilt(kind: type[ContextfulError], detail: str, fields: dict[str, Any]) -> ContextfulError:
    error = kind.__new__(kind)
    ContextfulError.__init__(error, detail, **fields)
    return error


class TransientError(ContextfulError):
    """A later attempt of the same work may succeed."""

    category = "transient"


class TerminalError(ContextfulError):
    """Retrying the same input fails the same way."""


class SpecInvalid(TerminalError):
    category = "spec-invalid"


class Incompatible(TerminalError):
    category = "incompatible"


class NotFound(TerminalError):
    category = "not-found"


class Conflict(TerminalError):
    """Two writers or two values disagree and retrying cannot reconcile them (conflict)."""

    category = "conflict"


class Expired(TerminalError):
    """A window the request depended on has closed (expired)."""

    category = "expired"


class Refused(TerminalError):
    """An admitted caller asked for what its grant does not allow (refused; HTTP 403)."""

    category = "refused"


class Unauthenticated(TerminalError):
    """The request carries no credential this face admits (unauthenticated; HTTP 401)."""

    category = "unauthenticated"


class Permanent(TerminalError):
    category = "permanent"


# --- commits ---------------------------------------------------------------------------------


class CommitConflict(TransientError):
    """A commit's requirement no longer holds at the table head."""

    category = "conflict"
    table: str
    requirement: str
    attempts: int
    failed: str
    """The requirement class that did not hold (``AssertSchemaId``, …)."""

    def __init__(self, table: str, requirement: str, attempts: int = 1, failed: str = "") -> None:
        super().__init__(
            f"table {table!r}: {requirement} (after {attempts} attempt(s))",
            table=table,
            requirement=requirement,
            attempts=attempts,
            failed=failed,
        )


class StagingFailed(TransientError):
    """A part could not be written; the run lands nothing of what it staged."""

    def __init__(self, table: str, run_id: str, key: str, reason: str) -> None:
        super().__init__(f"table {table!r}, run {run_id}: writing {key} failed ({reason})",
                         table=table, run_id=run_id, key=key, reason=reason)


class CatalogUnavailable(TransientError):
    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"{backend}: {reason}", backend=backend, reason=reason)


# --- connectors and retries ------------------------------------------------------------------


class RateLimited(TransientError):
    """``connector.meter.acquire-call``: a limiter denied a reservation, or the server answered 429.

    ``retry_after_s`` is the wait the run's retry schedule performs; the limiter never sleeps.
    """

    source: str
    retry_after_s: float
    reason: str

    def __init__(self, source: str, retry_after_s: float, reason: str) -> None:
        super().__init__(f"{source}: rate limited, retry after {retry_after_s:.3f} s ({reason})",
                         source=source, retry_after_s=retry_after_s, reason=reason)


class ConnectorBoundHit(TransientError):
    """``run.retry.bound-hit-is-transient``: a connector struck its memory or deadline bound.

    ``bound`` is ``linear-memory`` or ``call-deadline``; ``step`` labels the pull that struck it.
    """

    step: str
    bound: str
    reason: str

    def __init__(self, step: str, bound: str, reason: str) -> None:
        super().__init__(f"{step}: the connector struck its {bound} bound ({reason})",
                         step=step, bound=bound, reason=reason)


class SourceUnavailable(TransientError):
    """A source could not be reached or answered a server error (5xx, refused, reset, timeout)."""

    def __init__(self, source: str, reason: str, status: int | None = None) -> None:
        super().__init__(f"{source}: {reason}", source=source, reason=reason, status=status)


# --- configuration and names -----------------------------------------------------------------


class StorageProfileUnknown(SpecInvalid):
    def __init__(self, profile: str, known: tuple[str, ...]) -> None:
        super().__init__(
            f"CONTEXTFUL_STORAGE_PROFILE={profile!r} is not one of {', '.join(known)}",
            profile=profile,
            known=known,
        )


class CatalogDsnMissing(SpecInvalid):
    """The ``postgres`` storage profile without a DSN naming its database (nothing was opened)."""

    profile: str

    def __init__(self, profile: str) -> None:
        super().__init__(f"CONTEXTFUL_STORAGE_PROFILE={profile} keeps the catalog in PostgreSQL and needs its DSN: "
                         "set CONTEXTFUL_POSTGRES_DSN (e.g. \"host=db.example port=5432 user=contextful "
                         "dbname=contextful\" or postgresql://contextful@db.example/contextful), or libpq's PGHOST "
                         "or PGSERVICE; or unset CONTEXTFUL_STORAGE_PROFILE for the local profile (a SQLite catalog "
                         "file)", profile=profile)


class TableNameInvalid(SpecInvalid):
    def __init__(self, table: str, reason: str) -> None:
        super().__init__(f"table name {table!r}: {reason}", table=table, reason=reason)


class ModalityInvalid(SpecInvalid):
    """``store.reserve.modality``: a ``_modality`` value outside the five fails its batch."""

    def __init__(self, table: str, values: list[str], allowed: tuple[str, ...]) -> None:
        shown = ", ".join(repr(v) for v in values[:5])
        super().__init__(
            f"table {table!r}: _modality takes {', '.join(allowed)}; the batch holds {shown}",
            table=table,
            values=values,
            allowed=allowed,
        )


class ProjectInvalid(SpecInvalid):
    path: str

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}", path=path, problem=problem)


class ProjectModuleUnimportable(SpecInvalid):
    """A registration module (``[project] modules``, or a ``contextful.tasks`` entry point) raised
    when imported (``engine.registrations``)."""

    module: str
    where: str
    """``[project] modules`` or the entry point's name and group."""
    cause: str
    """The import error, as Python names it."""

    def __init__(self, module: str, where: str, cause: str) -> None:
        super().__init__(f"module {module!r} ({where}) cannot be imported: {cause}", module=module, where=where,
                         cause=cause)


class SecretUnresolved(SpecInvalid):
    """A ``${secret:NAME}`` reference that neither the environment nor the project's secrets file
    holds (``engine.config.secrets``); raised before any request."""

    reference: str
    where: str
    """The manifest key holding the reference."""
    looked: tuple[str, ...]
    """Where the value was looked for, in order."""

    def __init__(self, reference: str, where: str, looked: tuple[str, ...]) -> None:
        super().__init__(f"{where}: {reference} is not set (looked in: {'; '.join(looked)})", reference=reference,
                         where=where, looked=looked)


class QueryInvalid(SpecInvalid):
    """A query the engine cannot bind or run for a reason of its own. A model's statement names the
    model and where its SQL is written (``file``: its ``sql_file``, None for inline ``sql``)."""

    query: str
    reason: str
    model: str | None
    file: str | None

    def __init__(self, query: str, reason: str, *, model: str | None = None, file: str | None = None) -> None:
        shown = query.strip()
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        where = "" if model is None else f"[[model]] {model!r} ({file or 'inline sql in contextful.toml'}): "
        super().__init__(f"{where}{reason} (in: {shown})", query=query, reason=reason, model=model, file=file)


class ManifestKeyUnknown(SpecInvalid):
    def __init__(self, block: str, key: str, known: tuple[str, ...]) -> None:
        super().__init__(f"{block} has no key {key!r} (keys: {', '.join(known)})", block=block, key=key, known=known)


class ManifestValueInvalid(SpecInvalid):
    block: str
    key: str
    problem: str

    def __init__(self, block: str, key: str, problem: str) -> None:
        super().__init__(f"{block}.{key}: {problem}", block=block, key=key, problem=problem)


class PipelineIdDuplicate(SpecInvalid):
    def __init__(self, pipeline: str, first: int, second: int) -> None:
        super().__init__(f"pipeline id {pipeline!r} is declared by [[pipeline]] #{first} and #{second}",
                         pipeline=pipeline, first=first, second=second)


class PipelineAfterUnknown(SpecInvalid):
    def __init__(self, pipeline: str, after: str) -> None:
        super().__init__(f"pipeline {pipeline!r} runs after {after!r}, which no [[pipeline]] declares",
                         pipeline=pipeline, after=after)


class PipelineAfterCycle(SpecInvalid):
    def __init__(self, cycle: tuple[str, ...]) -> None:
        super().__init__(f"pipelines wait on each other in a cycle: {' -> '.join(cycle)}", cycle=cycle)


class PipelineSourceKindUnknown(SpecInvalid):
    def __init__(self, pipeline: str, kind: str, known: tuple[str, ...]) -> None:
        super().__init__(f"pipeline {pipeline!r}: source kind {kind!r} is not one of {', '.join(known)}",
                         pipeline=pipeline, kind=kind, known=known)


class PipelineNormalizeModeUnknown(SpecInvalid):
    """``run.normalize.mode-unknown``: prints both spellings."""

    def __init__(self, pipeline: str, mode: str, modes: tuple[str, ...]) -> None:
        super().__init__(f"pipeline {pipeline!r}: normalize = {mode!r}; use {' or '.join(repr(m) for m in modes)}",
                         pipeline=pipeline, mode=mode, modes=modes)


class PipelineSeedDeclarationMissing(SpecInvalid):
    """``run.seed.declaration-missing``: a seeded table needs a primary key and a real order_by."""

    def __init__(self, pipeline: str, missing: str) -> None:
        super().__init__(f"pipeline {pipeline!r} declares a seed but {missing}", pipeline=pipeline, missing=missing)


class LeaseCursorKindMismatch(SpecInvalid):
    """``store.lease.cursor-kind``: only a cursor kind that takes a lease may live under cursors/."""

    def __init__(self, scope: str, kind: str, leased: tuple[str, ...]) -> None:
        super().__init__(f"cursor {scope!r} of kind {kind!r} takes no lease and cannot be held under cursors/ "
                         f"(kinds that take a lease: {', '.join(leased)})", scope=scope, kind=kind, leased=leased)


class ManifestInvalid(SpecInvalid):
    """Every problem of one manifest at once; each problem is a catalogue error of its own."""

    path: str
    problems: list[ContextfulError]

    def __init__(self, path: str, problems: list[ContextfulError]) -> None:
        lines = "; ".join(str(p) for p in problems)
        super().__init__(f"{path}: {len(problems)} problem(s): {lines}", path=path, problems=problems)


class ModelCycle(SpecInvalid):
    def __init__(self, cycle: tuple[str, ...]) -> None:
        super().__init__(f"models read each other in a cycle: {' -> '.join(cycle)}", cycle=cycle)


class ExportNamespaceShared(SpecInvalid):
    """``run.export-iceberg.namespace-shared``: one namespace under two credentials, one credential
    under two namespaces, or one Iceberg table for two exports; names both exports."""

    first: str
    second: str
    shared: str

    def __init__(self, first: str, second: str, shared: str) -> None:
        super().__init__(f"exports {first!r} and {second!r} share {shared}; each export publishes for exactly one "
                         f"credential mapped to exactly one namespace", first=first, second=second, shared=shared)


# --- data ------------------------------------------------------------------------------------


class SchemaIrreconcilable(Incompatible):
    """``run.land.irreconcilable-schema``: the arriving schema cannot land in the table."""

    def __init__(self, table: str, path: str, table_type: str, arriving_type: str, reason: str) -> None:
        super().__init__(
            f"table {table!r}, column {path}: arriving {arriving_type} cannot land in {table_type} ({reason})",
            table=table,
            path=path,
            table_type=table_type,
            arriving_type=arriving_type,
            reason=reason,
        )


class InputUnreadable(Incompatible):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"input {path}: {reason}", path=path, reason=reason)


class InputMalformed(Incompatible):
    """An input is not the format it claims: a bad JSON line or CSV row, a damaged compressed stream.

    ``line`` is the 1-based source line where the format has lines and it is known, else None.
    """

    path: str
    line: int | None
    reason: str

    def __init__(self, path: str, line: int | None, reason: str) -> None:
        where = f"input {path}" if line is None else f"input {path}, line {line}"
        super().__init__(f"{where}: {reason}", path=path, line=line, reason=reason)


class ParseCrashed(Incompatible):
    """``run.land.parse-deadline``, ``run.land.parse-memory``: the decoder child of one input was
    killed at its deadline or memory bound, or died (``bound`` is "deadline", "memory" or "crash").

    Only that input fails; the decoder serves the next one. Terminal: the same input under the same
    bounds fails the same way.
    """

    path: str
    bound: str
    reason: str

    def __init__(self, path: str, bound: str, reason: str) -> None:
        what = "the decoder child crashed" if bound == "crash" else f"the decode crossed its {bound} bound"
        super().__init__(f"input {path}: {what} ({reason})", path=path, bound=bound, reason=reason)


class CursorFieldMismatch(Incompatible):
    """``run.advance.field-rename``: the stored position was measured on another field."""

    def __init__(self, scope: str, stored: str | None, declared: str | None) -> None:
        super().__init__(f"cursor {scope}: the stored position is on field {stored!r} but the pipeline declares "
                         f"incremental = {declared!r}; restore the field or reset the cursor",
                         scope=scope, stored=stored, declared=declared)


class CursorPositionUnorderable(Incompatible):
    """``run.advance.unorderable-position``: terminal for the pull."""

    def __init__(self, scope: str, field: str, reason: str) -> None:
        super().__init__(f"cursor {scope}, field {field!r}: {reason}", scope=scope, field=field, reason=reason)


class SourceResponseMalformed(Incompatible):
    """A source answered with a body that is not what its kind reads (malformed JSON, no records)."""

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"{source}: {reason}", source=source, reason=reason)


class PageCapExceeded(Incompatible):
    """``connector.source.page-cap``: a walk would issue more than ``cap`` requests (an endless page)."""

    def __init__(self, pipeline: str, cap: int, url: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: the walk reached its cap of {cap} requests without an end "
                         f"(next: {url}); the source's pagination does not end", pipeline=pipeline, cap=cap, url=url)


class SourceRequestRefused(Incompatible):
    """A source refused a request in a way a retry cannot change (a 4xx other than 408/429)."""

    def __init__(self, source: str, status: int, reason: str) -> None:
        super().__init__(f"{source}: HTTP {status} ({reason})", source=source, status=status, reason=reason)


class PipelineListIndexMissing(Incompatible):
    """``run.normalize.list-index-missing``: a relational child table without its list index."""

    def __init__(self, parent: str, list_path: str, table: str) -> None:
        super().__init__(f"child table {table!r} of {parent!r} (list {list_path}) carries no list index, so its "
                         "projection is not reversible", parent=parent, list_path=list_path, table=table)


class PipelineSeedCeilingBreached(Incompatible):
    """``run.seed.ceiling-breached``: the chunk holding the value lands nothing."""

    def __init__(self, pipeline: str, column: str, value: str, ceiling: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: seeded row with {column} = {value} reaches the seed ceiling "
                         f"{ceiling}", pipeline=pipeline, column=column, value=value, ceiling=ceiling)


class PipelineSeedCeilingUnevaluable(Incompatible):
    """``run.seed.ceiling-unevaluable``."""

    def __init__(self, pipeline: str, column: str, reason: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: cannot compare {column} with the seed ceiling ({reason})",
                         pipeline=pipeline, column=column, reason=reason)


class TypeSpellingUnreadable(Incompatible):
    """``run.land.typed-pull``: a ``types`` entry the typed landing cannot read (an unknown type, unit
    or time zone); names the pipeline when the manifest's validation knows it."""

    def __init__(self, column: str, spelling: str, reason: str, pipeline: str | None = None) -> None:
        where = f"pipeline {pipeline!r}: " if pipeline else ""
        super().__init__(f"{where}types.{column} = {spelling!r}: {reason}", column=column, spelling=spelling,
                         reason=reason, pipeline=pipeline)


class TypedLandingFailed(Incompatible):
    """A declared type does not hold an arrived value; ``row`` (when one value is named) is its 1-based
    row in the input (in the file, for an input read from an offset)."""

    table: str
    column: str
    spelling: str
    reason: str
    row: int | None

    def __init__(self, table: str, column: str, spelling: str, reason: str, row: int | None = None) -> None:
        where = f"table {table!r}, column {column}" + (f", row {row}" if row is not None else "")
        super().__init__(f"{where}: values do not read as {spelling} ({reason})",
                         table=table, column=column, spelling=spelling, reason=reason, row=row)


# --- conflicts and windows -------------------------------------------------------------------


class ContractMismatch(Incompatible):
    """contract-mismatch (``run.model.contract-major``/``-minor``): names the column and, where a
    version bump would admit the change, the version to declare; where a value breaks the declared
    type, that value (``value``, as DuckDB spells it; the reason quotes it too)."""

    def __init__(self, model: str, column: str, reason: str, bump: str | None = None,
                 value: str | None = None) -> None:
        hint = f"; declare contract version {bump}" if bump else ""
        super().__init__(f"model {model!r}, column {column!r}: {reason}{hint}", model=model, column=column,
                         reason=reason, bump=bump, value=value)


class ModelTestFailed(Incompatible):
    """A model's data test found offending rows; the build publishes nothing."""

    def __init__(self, model: str, test: str, failures: int) -> None:
        super().__init__(f"model {model!r}: test {test} failed on {failures} row(s); nothing was published",
                         model=model, test=test, failures=failures)


class SyncCursorConflict(Conflict):
    """``store.merge.cursor-recency``: a cursor resolves through its commit, never by write time."""

    def __init__(self, table: str, scope: str, reason: str) -> None:
        super().__init__(f"table {table!r}, cursor {scope}: {reason}", table=table, scope=scope, reason=reason)


class PipelineSeedSourceChanged(Conflict):
    """``run.seed.source-changed``: names both fingerprints, and how to recover."""

    def __init__(self, pipeline: str, landed: str, current: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: the seed landed from fingerprint {landed} but its source now has "
                         f"{current}; a seed lands once: restore the seed files it landed from, or remove the "
                         "pipeline's [pipeline.seed] block (the rows the seed landed stay)",
                         pipeline=pipeline, landed=landed, current=current)


class JournalConflict(Conflict):
    """A journal step already holds a different recorded value (conditional journal write lost)."""

    def __init__(self, execution: str, step: int, reason: str) -> None:
        super().__init__(f"execution {execution}, step {step}: {reason}", execution=execution, step=step,
                         reason=reason)


class ExecutionHeld(JournalConflict):
    """Another process holds the scope's pending execution and its lease runs: this run did nothing
    (the ``held`` category: exit 11, HTTP 409). Names the pipeline (when a run of one asked), the
    holder's process and host (``host``/``pid`` None when its id is not one of ours) and since when
    it holds it."""

    category: ClassVar[str] = "held"
    scope: str
    holder: str | None
    host: str | None
    pid: int | None
    since_us: int | None
    until_us: int
    pipeline: str | None

    def __init__(self, execution: str, scope: str, holder: str | None, host: str | None, pid: int | None,
                 since_us: int | None, until_us: int, pipeline: str | None = None) -> None:
        who = f"process {pid} on host {host}" if host is not None and pid is not None else f"holder {holder!r}"
        since = f" since {_instant(since_us)}" if since_us is not None else ""
        what = f"pipeline {pipeline!r}" if pipeline is not None else f"scope {scope!r}"
        reason = (f"{what} is being run by {who}{since} (execution {execution}, its lease runs until "
                  f"{_instant(until_us)}); this run did nothing: run it again once that one ends")
        Conflict.__init__(self, reason, execution=execution, step=0, reason=reason, scope=scope, holder=holder,
                          host=host, pid=pid, since_us=since_us, until_us=until_us, pipeline=pipeline)

    def of_pipeline(self, pipeline: str) -> ExecutionHeld:
        """The same refusal, naming the pipeline whose run asked."""
        return ExecutionHeld(self.fields["execution"], self.scope, self.holder, self.host, self.pid, self.since_us,
                             self.until_us, pipeline)


def _instant(us: int) -> str:
    """A UTC instant in microseconds as RFC 3339 text to the second."""
    from datetime import UTC, datetime

    return datetime.fromtimestamp(us / 1_000_000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class OwnerPlanMismatch(Conflict):
    """A scope's pending owner is pinned to another plan; it resumes only under that plan."""

    def __init__(self, scope: str, execution: str, pinned: str, offered: str) -> None:
        super().__init__(f"scope {scope}: execution {execution} is pending under plan {pinned[:12]}; this run's "
                         f"plan is {offered[:12]} (run the pending plan to completion, or rewind the execution)",
                         scope=scope, execution=execution, pinned=pinned, offered=offered)


class ExecutionRewindUnsafe(Conflict):
    """``run.own.rewind-unsafe``: the owner has a live attempt; ``--force`` overrides none."""

    def __init__(self, execution: str, reason: str) -> None:
        super().__init__(f"execution {execution}: {reason}; rewinding it now would let two attempts run: "
                         "rewind it once that attempt has ended or its lease has lapsed (nothing overrides this)",
                         execution=execution, reason=reason)


class ExportCommitConflict(Conflict):
    """``run.export-iceberg.commit-retry``: an Iceberg export's commit lost and retrying cannot win.

    Raised when the table's uuid, current schema id or default spec id changed between attempts,
    or when the last of ``attempts`` attempts met a conflicting commit; ``reason`` says which.
    """

    table: str
    reason: str
    attempts: int

    def __init__(self, table: str, reason: str, attempts: int) -> None:
        super().__init__(f"Iceberg table {table!r}: {reason} (after {attempts} attempt(s)); nothing was published",
                         table=table, reason=reason, attempts=attempts)


class ReceiveBatchKeyExpired(Expired):
    """``run.land.receive-key-expired``: non-retryable; raised before the body is read."""

    def __init__(self, pipeline: str, key: str, age_s: float, retention_s: float) -> None:
        super().__init__(f"pipeline {pipeline!r}: batch key {key!r} was first tried {age_s:.0f} s ago, past "
                         f"key_retention_secs = {retention_s:g}", pipeline=pipeline, key=key, age_s=age_s,
                         retention_s=retention_s)


class ExportQueryRefused(Refused):
    """``run.export-iceberg.query-refused``: a mapped reader's gateway request names a namespace, an
    undeclared template, a table outside ``[a-z_][a-z0-9_]*``, or caller SQL the entry or its
    warehouse does not allow; raised before any catalog or engine is touched."""

    credential: str
    reason: str

    def __init__(self, credential: str, reason: str) -> None:
        super().__init__(f"reader credential {credential!r}: {reason}; nothing was run", credential=credential,
                         reason=reason)


class ReaderCredentialUnadmitted(Unauthenticated):
    """A gateway request's bearer key is missing, malformed, unknown, revoked, or its credential is
    one no ``[[export]]`` admits."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; the query gateway admits a reader key issued by `contextful export key "
                         f"issue` for a credential an [[export]] declares", reason=reason)


# --- lookups ---------------------------------------------------------------------------------


class TableNotFound(NotFound):
    def __init__(self, table: str) -> None:
        super().__init__(f"no table {table!r} in this store", table=table)


class InputNotFound(NotFound):
    def __init__(self, path: str) -> None:
        super().__init__(f"no input file at {path}", path=path)


class ExecutionNotFound(NotFound):
    def __init__(self, execution: str, reason: str = "no owner holds it") -> None:
        super().__init__(f"execution {execution}: {reason}", execution=execution, reason=reason)


class SnapshotNotFound(NotFound):
    def __init__(self, table: str, wanted: str) -> None:
        super().__init__(f"table {table!r} has no snapshot {wanted}", table=table, wanted=wanted)


# --- backends --------------------------------------------------------------------------------


class ConditionalWriteUnsupported(Permanent):
    """``surface.apply.weak-conditional-backend``: the backend cannot do a linearizable CAS."""

    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(
            f"{backend}: conditional replacement is not linearizable ({reason}); refusing to open",
            backend=backend,
            reason=reason,
        )


class StoreCatalogMismatch(Permanent):
    def __init__(self, store_uuid: str, catalog_store_uuid: str, root: str) -> None:
        super().__init__(
            f"store {root} is {store_uuid} but its catalog belongs to store {catalog_store_uuid}",
            store_uuid=store_uuid,
            catalog_store_uuid=catalog_store_uuid,
            root=root,
        )


class StoreFormatNewer(Permanent):
    """A store whose ``store.json`` names a format newer than this build knows: it may keep what
    this build cannot read (a run manifest where it does not look), so it opens nothing."""

    root: str
    found: int
    supported: int

    def __init__(self, root: str, found: int, supported: int) -> None:
        super().__init__(f"store {root} has format {found}, newer than this build's {supported}: "
                         "upgrade contextful to open it", root=root, found=found, supported=supported)


class SnapshotCollected(Permanent):
    def __init__(self, table: str, commit_seq: int, missing: str) -> None:
        super().__init__(
            f"table {table!r} snapshot {commit_seq}: part {missing} was collected past retention",
            table=table,
            commit_seq=commit_seq,
            missing=missing,
        )


class CatalogRejected(Permanent):
    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(f"{backend} refused the write: {reason}", backend=backend, reason=reason)


class BlobCorrupt(Permanent):
    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(f"blob {digest}: stored bytes hash to {actual}", digest=digest, actual=actual)


class BlobNotFound(NotFound):
    def __init__(self, digest: str) -> None:
        super().__init__(f"no blob {digest}", digest=digest)


class CommitOutcomeUnknown(TransientError):
    """A commit was sent but its outcome could not be learned; nothing was deleted or undone.

    The run may have landed or not: the next attempt (or ``contextful table show``) finds out by
    looking for ``run_id`` in the table's history. Its parts and manifest stay until then.
    """

    category = "unknown"

    def __init__(self, target: str, run_id: str, reason: str) -> None:
        super().__init__(f"the outcome of commit {run_id} on {target} is unknown ({reason}); nothing was deleted",
                         target=target, run_id=run_id, reason=reason)


# --- the served face's admission and bounds ---------------------------------------------------


class WriterCredentialUnadmitted(Unauthenticated):
    """A receive request's bearer key is missing, malformed, unknown or revoked (a reader key included)."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"{reason}; the receive routes admit a writer key issued by `contextful pipeline key "
                         f"issue PIPELINE`", reason=reason)


class WriterPipelineRefused(Refused):
    """An admitted writer key does not name the pipeline a batch was posted to."""

    key_id: str
    pipeline: str

    def __init__(self, key_id: str, pipeline: str) -> None:
        super().__init__(f"writer key {key_id} does not admit batches to pipeline {pipeline!r}", key_id=key_id,
                         pipeline=pipeline)


class RequestBodyTooLarge(SpecInvalid):
    """A request body (as sent, or once decoded) is past its declared bound; answered 413 and
    nothing of it is spooled."""

    what: str
    limit: int
    decoded: bool

    def __init__(self, what: str, limit: int, *, decoded: bool = False, declared: int | None = None) -> None:
        body = "decoded body" if decoded else "body"
        size = f"of {declared:,} bytes" if declared is not None else f"past {limit:,} bytes"
        super().__init__(f"{what}: a {body} {size} is over the {limit:,}-byte bound", what=what, limit=limit,
                         decoded=decoded, declared=declared)

    @property
    def http_status(self) -> int:
        return 413


# --- the query gateway's answers ---------------------------------------------------------------


class AnswerTooLarge(SpecInvalid):
    """A gateway answer crossed its byte bound (the entry's ``max_answer_bytes`` or the request's
    ``max_bytes``) before its first byte was sent; HTTP 413, the one spec-invalid error that is not 400."""

    limit: int

    def __init__(self, table: str, limit: int) -> None:
        super().__init__(f"the answer for entry {table!r} is over its {limit:,}-byte bound; ask for fewer rows or "
                         f"columns, or aggregate", table=table, limit=limit)

    @property
    def http_status(self) -> int:
        return 413


class QueryFailed(Permanent):
    """An admitted gateway query failed for a reason that is not the reader's (a data file missing or
    unreadable under the catalog, an engine fault). The answer names only this class and
    ``error_id``; the log holds the cause and its trace under the same id."""

    error_id: str

    def __init__(self, error_id: str) -> None:
        super().__init__(f"the query failed inside the gateway (error id {error_id})", error_id=error_id)


# --- positions (issue 12): inputs whose landed form changed ---------------------------------------


class InputChanged(Conflict):
    """A ``files`` input the cursor of an appending pipeline holds now has other content than what
    landed, and not only bytes appended to an NDJSON file: landing it again would repeat its rows.
    The message names the ways out: a key or a disposition that re-lands it, or a reset."""

    def __init__(self, input: str, reason: str, pipeline: str | None = None) -> None:
        named = repr(pipeline) if pipeline else "<pipeline>"
        super().__init__(f"input {input}: {reason}; nothing of it lands. To land a source exported in full, "
                         f"declare primary_key = [...] (its changed rows merge by key) or write_disposition = "
                         f"\"replace\" on [[pipeline]] {named}; or run `contextful pipeline reset "
                         f"{pipeline or '<pipeline>'}` to read every input again; or restore the landed file, or put "
                         "the new rows in a file of a new name (a new input lands whole)",
                         input=input, reason=reason, pipeline=pipeline)


# --- primary keys and table names (keys never merge distinct rows) --------------------------------


class PrimaryKeyNull(Incompatible):
    """A row of a keyed table holds null (or NaN, which equals nothing) in a key column: it has no
    identity to merge by, so its batch is refused, never merged with other such rows. ``input`` names
    the input when the landing path knows it; ``row`` is the row's 1-based position in that input
    (else in the batch staged): in the file, for an input a run read from an offset (appended NDJSON)."""

    table: str
    column: str
    row: int
    input: str | None

    def __init__(self, table: str, column: str, row: int, input: str | None = None, value: str = "null") -> None:
        where = f"{input}, row {row}" if input else f"row {row} of the batch staged"
        super().__init__(f"table {table!r}: {where} holds {value} in primary key column {column!r}; a keyed row "
                         f"needs a value in every key column", table=table, column=column, row=row, input=input,
                         value=value)


class PrimaryKeyColumnMissing(Incompatible):
    """A batch landing in a keyed table lacks a key column (the primary key names a column the data
    does not have): refused before anything is staged, so no view ever names a missing column."""

    table: str
    column: str
    columns: tuple[str, ...]
    input: str | None

    def __init__(self, table: str, column: str, columns: tuple[str, ...], input: str | None = None) -> None:
        shown = ", ".join(columns[:20]) + (", ..." if len(columns) > 20 else "")
        where = f"{input}: " if input else ""
        super().__init__(f"{where}table {table!r} has primary key column {column!r}, which the batch does not hold "
                         f"(columns: {shown or 'none'})", table=table, column=column, columns=columns, input=input)


class PrimaryKeyWideningLossy(SchemaIrreconcilable):
    """A key column would widen to a type that cannot hold every key exactly (int64 meeting a float:
    distinct keys above 2**53 would read equal and merge); refused instead of a downgrade event."""


class OrderByWideningLossy(SchemaIrreconcilable):
    """A keyed table's ``order_by`` column would widen to a type that cannot hold every value
    exactly (int64 meeting a float: 2**53 + 1 and 2**53 would read equal, and the row that wins a
    key would change); refused instead of a downgrade event, as for a key column."""


class PipelinePrimaryKeyInvalid(SpecInvalid):
    """A pipeline's ``primary_key`` can never name a column of its table, as the manifest declares it."""

    pipeline: str
    column: str
    reason: str

    def __init__(self, pipeline: str, column: str, reason: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: primary_key column {column!r} {reason}", pipeline=pipeline,
                         column=column, reason=reason)


class TableNameCollision(SpecInvalid):
    """Two tables of a manifest could land under one name, or read as one: a relational pipeline's
    child tables are ``<root>__<path>``, so no other table may be named ``<root>__...``; and DuckDB
    views compare names case-insensitively, so no two tables may differ only in case."""

    table: str
    first: str
    second: str
    reason: str

    def __init__(self, table: str, first: str, second: str, reason: str) -> None:
        super().__init__(f"table {table!r} of {second} collides with {first}: {reason}; rename one", table=table,
                         first=first, second=second, reason=reason)


class TableUnreadable(Permanent):
    """A table's view could not be built at a snapshot (a part missing, a key naming no column): the
    other tables still read; querying this one raises this error by name."""

    table: str
    reason: str

    def __init__(self, table: str, reason: str) -> None:
        super().__init__(f"table {table!r} cannot be read: {reason}", table=table, reason=reason)


class ColumnNamesCollide(Incompatible):
    """Two column (or struct field) names of one table differ only in case: DuckDB resolves names
    case-insensitively, so one would answer for the other. Refused at landing, naming both and the
    input; nothing of the batch lands."""

    table: str
    first: str
    second: str
    where: str

    def __init__(self, table: str, first: str, second: str, where: str) -> None:
        super().__init__(f"table {table!r}: {first!r} and {second!r} differ only in case ({where}); readers resolve "
                         f"names case-insensitively, so one would answer for the other: rename one at the source",
                         table=table, first=first, second=second, where=where)


# --- finding a project and its store ---------------------------------------------------------


class ProjectNotFound(NotFound):
    """No project where a command looked: the directory given does not exist, or no
    ``contextful.toml`` is in it or any directory above it."""

    path: str
    reason: str

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}; `contextful init DIR` starts a project, and --project DIR names one",
                         path=path, reason=reason)


class StoreNotFound(NotFound):
    """A command that reads or maintains a store found none (it never creates one): only a
    writer (``pipeline run``, ``table load``) creates a project's store on first use."""

    root: str
    reason: str

    def __init__(self, root: str, reason: str) -> None:
        super().__init__(f"no store at {root} ({reason}): `contextful pipeline run` or `contextful table load` "
                         "creates the project's store, and --store URL names an existing one", root=root, reason=reason)


class ProjectExists(Conflict):
    """``contextful init`` found a ``contextful.toml`` already: it never overwrites a project."""

    path: str

    def __init__(self, path: str) -> None:
        super().__init__(f"{path} exists; init never overwrites a project: edit it, or init another directory",
                         path=path)


class CatalogPathMissing(SpecInvalid):
    """A remote store root under the local profile: its SQLite catalog cannot live beside the parts."""

    root: str

    def __init__(self, root: str) -> None:
        super().__init__(f"store {root} is remote, and the local profile keeps its catalog in a local SQLite file: "
                         "set [project] catalog in contextful.toml (e.g. catalog = \"catalog.sqlite\"), or "
                         "CONTEXTFUL_STORAGE_PROFILE=postgres for a shared catalog", root=root)


# --- arguments a command or a call is given (issue 14) ---------------------------------------------


class ArgumentInvalid(SpecInvalid):
    """A value given to a command option or a call's argument cannot be what it names: an address
    that is not ``HOST:PORT`` (or one this machine cannot listen on), an instant that is not
    ISO-8601, a negative window. Names the option (or argument) as it was given, and the value."""

    argument: str
    value: object
    reason: str

    def __init__(self, argument: str, value: object, reason: str) -> None:
        super().__init__(f"{argument} {value!r}: {reason}", argument=argument, value=value, reason=reason)


class AddressInUse(TransientError):
    """``pipeline serve`` could not listen on an address because another socket holds it. Transient
    (exit 75): the port frees when its holder exits, so a supervisor's retry may start the service."""

    argument: str
    address: str
    reason: str

    def __init__(self, argument: str, address: str, reason: str) -> None:
        super().__init__(f"{argument} {address}: cannot listen: {reason} (another process holds the port; stop "
                         f"it or pick another port, or port 0 for a free one)", argument=argument, address=address,
                         reason=reason)


class ConfirmationRequired(SpecInvalid):
    """A command that forgets state (``pipeline reset``) asks before it acts; with no terminal to ask
    on it needs ``--yes``. Names the command and what it would forget; nothing changed."""

    command: str
    forgets: str

    def __init__(self, command: str, forgets: str) -> None:
        super().__init__(f"`contextful {command}` would forget {forgets}; stdin is not a terminal to confirm on: "
                         "pass --yes to go ahead (nothing changed)", command=command, forgets=forgets)


class TableStillRead(Conflict):
    """``table drop`` of a table the manifest still reads: a model's SQL or an ``[[export]]``'s source.
    Refused unless ``--force``; the readers are named so the manifest can be edited first."""

    table: str
    readers: tuple[str, ...]

    def __init__(self, table: str, readers: tuple[str, ...]) -> None:
        super().__init__(f"table {table!r} is read by {', '.join(readers)}: remove them from contextful.toml "
                         f"first, or drop it anyway with --force", table=table, readers=readers)


class TableDeclarationChanged(Conflict):
    """A declaration of a landed table (a pipeline's ``primary_key``, ``order_by``, ``normalize``;
    ``table load --primary-key``) differs from the one the table landed under: ``pipeline validate``,
    ``plan``, ``run`` and ``table load`` refuse it by name rather than land rows under a mix of the
    two. ``stored`` and ``declared`` are the two values as the manifest spells them; ``pipeline`` the
    declaring pipeline (None: a ``table load``, or ``declared_in``: an applied job's version, whose
    output table the store now holds otherwise, ``engine.control.contracts``); ``migrate`` the
    commands that move the table to the new declaration."""

    table: str
    pipeline: str | None
    setting: str
    stored: str
    declared: str
    migrate: str

    def __init__(self, table: str, pipeline: str | None, setting: str, stored: str, declared: str,
                 migrate: str, declared_in: str | None = None) -> None:
        who, where = (f" (pipeline {pipeline!r})", "contextful.toml") if pipeline is not None else \
            ("", declared_in or "this table load")
        super().__init__(f"table {table!r}{who}: {setting} is {stored} in the store but {declared} in {where}; "
                         f"nothing lands under a mix of the two. To migrate: {migrate}",
                         table=table, pipeline=pipeline, setting=setting, stored=stored, declared=declared,
                         migrate=migrate)


class JobKindUnknown(SpecInvalid):
    """A ``[[job]]`` names a kind outside the closed union, an argument vector or a host command
    (``surface.fire.job-kind-unknown``)."""

    job: str
    kind: str
    why: str

    def __init__(self, job: str, kind: str, why: str) -> None:
        super().__init__(f"[[job]] {job!r}: {why}", job=job, kind=kind, why=why)


class JobKindUndispatched(SpecInvalid):
    """A ``[[job]]`` of kind ``sweep``, ``rebuild-catalog`` or ``validate``: no job dispatches that
    work; ``command`` does it (``surface.fire.kind-undispatched``)."""

    job: str
    kind: str
    command: str

    def __init__(self, job: str, kind: str, command: str) -> None:
        super().__init__(f"[[job]] {job!r}: kind {kind!r} is never dispatched as a job; `{command}` does that work",
                         job=job, kind=kind, command=command)


class JobConcurrencyUnset(SpecInvalid):
    """A store-driven ``[[job]]`` declares no positive integer ``max_in_flight``; no default applies
    (``surface.fire.store-driven-concurrency``)."""

    job: str
    value: object

    def __init__(self, job: str, value: object) -> None:
        got = "declares none" if value is None else f"declares {value!r}"
        super().__init__(f"[[job]] {job!r}: a store-driven job needs max_in_flight, a positive integer (it {got}; "
                         "no default applies)", job=job, value=value)


class JobTargetUnbound(SpecInvalid):
    """A fold target naming no produced table, or a build target naming no declared ``[[model]]``
    (``surface.fire.target-unbound``)."""

    job: str
    target: str
    why: str

    def __init__(self, job: str, target: str, why: str) -> None:
        super().__init__(f"[[job]] {job!r}: target {target!r} is unbound: {why}", job=job, target=target, why=why)


class JobBodyUnregistered(SpecInvalid):
    """A store-driven ``[[job]]`` whose ``body`` names no body the embedding executable registers
    and whose ``delegate`` names no bound delegate (``surface.fire.store-driven-body``); ``searched``
    says where the body was looked for."""

    job: str
    body: str
    searched: str

    def __init__(self, job: str, body: str, searched: str) -> None:
        super().__init__(f"[[job]] {job!r}: {body} is neither a body this executable registers nor a bound "
                         f"delegate ({searched})", job=job, body=body, searched=searched)


class JobItemKeyInvalid(SpecInvalid):
    """A store-driven job's input relation serves an item key (its first column, or its isolated
    items' logical or entity key column) that is null or served twice, or does not select it: an
    item is named by its key, and nothing silently merges or drops an item."""

    job: str
    column: str
    why: str

    def __init__(self, job: str, column: str, why: str) -> None:
        super().__init__(f"[[job]] {job!r}: key column {column!r}: {why}; select one row per item with a non-null "
                         "key", job=job, column=column, why=why)


class JobAnswerInvalid(SpecInvalid):
    """A store-driven job's body answered something other than ``{table: rows}`` over the job's
    ``tables``: the item fails permanently, naming what it answered."""

    job: str
    item: str
    why: str

    def __init__(self, job: str, item: str, why: str) -> None:
        super().__init__(f"[[job]] {job!r} item {item!r}: the body's answer {why}", job=job, item=item, why=why)


class JobPlanInvalid(SpecInvalid):
    """A plan job's ``plan`` file cannot be lowered: missing or unreadable, its reference not the
    SHA-256 of its plan (edited after it was compiled), or compiled from declarations the applied
    version no longer holds (``surface.fire.plan-job``)."""

    job: str
    file: str
    why: str

    def __init__(self, job: str, file: str, why: str) -> None:
        super().__init__(f"[[job]] {job!r}: plan file {file}: {why}", job=job, file=file, why=why)


class ModelInputUnknown(SpecInvalid):
    """A model's SQL reads tables that no pipeline or model of the manifest produces and the store
    does not hold: its build would fail on them."""

    model: str
    tables: tuple[str, ...]
    known: tuple[str, ...]

    def __init__(self, model: str, tables: tuple[str, ...], known: tuple[str, ...]) -> None:
        super().__init__(f"[[model]] {model!r} reads {', '.join(map(repr, tables))}, which no pipeline or model "
                         f"produces and the store does not hold (known: {', '.join(known) or 'none'})",
                         model=model, tables=tables, known=known)


class JobNotFound(NotFound):
    """``contextful job fire|history NAME``: the applied version (``version``) declares no job
    ``job``; ``known`` are the jobs it declares."""

    job: str
    version: int
    known: tuple[str, ...]

    def __init__(self, job: str, version: int, known: tuple[str, ...]) -> None:
        super().__init__(f"no job {job!r} in applied version v{version} (its jobs: {', '.join(known) or 'none'})",
                         job=job, version=version, known=known)


class JobStoreUnbound(SpecInvalid):
    """A ``sync-push`` job fired on a store that has no corpus bucket (the container profile's
    ``CONTEXTFUL_CORPUS_BUCKET``, docs/container-profile.md): there is nothing to push to, and a
    fire that pushed nothing must not read as a success."""

    job: str
    store: str
    needs: str

    def __init__(self, job: str, store: str, needs: str) -> None:
        super().__init__(f"[[job]] {job!r}: store {store} has no corpus bucket to push to ({needs}); "
                         "nothing was pushed", job=job, store=store, needs=needs)


class RunNotFound(NotFound):
    """``contextful run show RUN``: no run record (``_runs`` or its cache) holds ``run_id``."""

    run_id: str

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run {run_id!r} in this store's run records (`contextful run history` lists them)",
                         run_id=run_id)


class QueryWriteRefused(Refused):
    """``contextful sql`` only reads: a statement whose DuckDB statement type is not a read
    (``CREATE``, ``INSERT``, ``COPY ... TO``, ``ATTACH``, ``INSTALL``, ...) is refused before any
    statement of the query runs, naming that type."""

    query: str
    statement: str

    def __init__(self, query: str, statement: str) -> None:
        shown = query if len(query) <= 200 else query[:197] + "..."
        super().__init__(f"`contextful sql` only reads: {statement} is not a SELECT statement (in: {shown}); land "
                         "data with `contextful table load` or a pipeline, derive tables with a [[model]]",
                         query=query, statement=statement)


class AwakeableUnknown(NotFound):
    """``run.suspend.resume-route``: no awakeable was minted under this token (HTTP 404)."""

    token: str

    def __init__(self, token: str) -> None:
        super().__init__(f"no awakeable holds token {_token_hint(token)}: check the token the suspended run handed "
                         "out (tokens are single-use and exact)", token=token)


class AwakeableTimedOut(Expired):
    """``run.suspend.expired-token``: the awakeable's deadline passed while it was pending; deadlines
    evaluate lazily, at resolution or when the suspended execution looks (HTTP 410)."""

    token: str
    execution: str
    label: str
    deadline_us: int

    def __init__(self, token: str, execution: str, label: str, deadline_us: int) -> None:
        from datetime import UTC, datetime

        deadline = datetime.fromtimestamp(deadline_us / 1_000_000, tz=UTC).isoformat()
        super().__init__(f"awakeable {label!r} of execution {execution} (token {_token_hint(token)}) timed out at "
                         f"{deadline}; it can no longer be resolved: rewind or re-run the execution to suspend "
                         "afresh", token=token, execution=execution, label=label, deadline_us=deadline_us)


class AwakeableAlreadyResolved(Conflict):
    """``run.suspend.conflicting-resolution``: the awakeable was resolved with another payload; the
    recorded value stays untouched (HTTP 409). The same payload again is no error."""

    token: str
    execution: str
    label: str

    def __init__(self, token: str, execution: str, label: str) -> None:
        super().__init__(f"awakeable {label!r} of execution {execution} (token {_token_hint(token)}) was already "
                         "resolved with another payload, which stays recorded; a resolution is single-valued "
                         "(GET the token to read the recorded payload)", token=token, execution=execution,
                         label=label)


class ExecutionSuspended(TransientError):
    """``run.suspend.awakeable``: an execution stopped waiting on a pending awakeable (its caller
    asked it to wait no longer). Transient: the execution is pending, and reopening it after the
    token is resolved replays to the same suspension and returns the payload."""

    execution: str
    token: str
    label: str
    deadline_us: int

    def __init__(self, execution: str, token: str, label: str, deadline_us: int) -> None:
        from datetime import UTC, datetime

        deadline = datetime.fromtimestamp(deadline_us / 1_000_000, tz=UTC).isoformat()
        super().__init__(f"execution {execution} is suspended on awakeable {label!r} until it is resolved (POST "
                         f"/awake/<token>) or it times out at {deadline}; open the execution again to resume it",
                         execution=execution, token=token, label=label, deadline_us=deadline_us)


def _token_hint(token: str) -> str:
    """The first characters of an awakeable token: enough to tell tokens apart in a message, not
    enough to resolve one from a log line."""
    return f"{token[:6]}…" if len(token) > 6 else repr(token)


# --- owners, registered bodies and admission (issue 15, helper "owners") ------------------------


class OwnerPinsMismatch(Conflict):
    """``run.own.host-scope``: a scope's pending owner pins other host-supplied identities than this
    claim offers (refused like :class:`OwnerPlanMismatch`); names every differing pin, both values."""

    scope: str
    execution: str
    pinned: dict[str, str]
    offered: dict[str, str]

    def __init__(self, scope: str, execution: str, pinned: dict[str, str], offered: dict[str, str]) -> None:
        names = sorted(k for k in set(pinned) | set(offered) if pinned.get(k) != offered.get(k))
        diff = "; ".join(f"{k}: pinned {pinned.get(k, '(absent)')}, offered {offered.get(k, '(absent)')}"
                         for k in names)
        super().__init__(f"scope {scope}: execution {execution} is pending under other pins ({diff}); it resumes "
                         "only under its pins: run it with them to completion, or rewind the execution",
                         scope=scope, execution=execution, pinned=pinned, offered=offered)


class BodyUnregistered(SpecInvalid):
    """``run.own.body-implementation``: configuration selects a body name no host registered."""

    body: str
    known: tuple[str, ...]
    modules: tuple[str, ...]
    """The ``[project] modules`` imported."""
    entry_points: tuple[str, ...]
    """The ``contextful.tasks`` entry points loaded."""

    def __init__(self, body: str, known: tuple[str, ...], modules: tuple[str, ...] = (),
                 entry_points: tuple[str, ...] = ()) -> None:
        super().__init__(f"body {body!r} is not registered by this host (registered: {', '.join(known) or 'none'}; "
                         f"[project] modules imported: {', '.join(modules) or 'none'}; contextful.tasks entry "
                         f"points: {', '.join(entry_points) or 'none'}); register it with "
                         "contextful.engine.run.bodies.register_body in a module [project] modules names",
                         body=body, known=known, modules=modules, entry_points=entry_points)


class BodyIdentityConfigured(SpecInvalid):
    """``run.own.body-implementation``: configuration gave an implementation identity (a digest, a
    type, a version) beside a body name; the host computes it, configuration only names the body."""

    body: str
    keys: tuple[str, ...]

    def __init__(self, body: str, keys: tuple[str, ...]) -> None:
        super().__init__(f"body {body!r}: configuration gives {', '.join(keys)} beside the name; configuration "
                         "selects a registered body by name only (the host verifies its implementation digest): "
                         "remove those keys", body=body, keys=keys)


class ExecutionWriterFenced(Conflict):
    """``run.journal.current-owner``, ``run.export.writer-fenced``: this attempt is no longer its
    scope's current writer (the lease transferred, the owner was retired or replaced, its pins
    changed), so it enters neither effect dispatch nor state publication."""

    execution: str
    attempt: int
    boundary: str
    reason: str

    def __init__(self, execution: str, attempt: int, boundary: str, reason: str) -> None:
        super().__init__(f"execution {execution}, attempt {attempt}: not admitted to {boundary}: {reason}; this "
                         "writer is fenced and must stop (the current owner's attempt carries the work on)",
                         execution=execution, attempt=attempt, boundary=boundary, reason=reason)


class StagingLeaseLost(Conflict):
    """A staging run found its lease gone when it renewed it: collection took the run for abandoned
    (its process renewed nothing for a whole lease: stopped, or its host paused) and may have deleted
    what it staged, so the run stops here and lands nothing; run it again and it lands what is missing."""

    table: str
    run_id: str

    def __init__(self, table: str, run_id: str) -> None:
        super().__init__(f"table {table!r}, run {run_id}: its staging lease is gone (collection took the run for "
                         "abandoned after a lease without a renewal) and what it staged may be deleted; it lands "
                         "nothing: run it again", table=table, run_id=run_id)


class SweepOriginOutOfOrder(Conflict):
    """``run.sweep.carried-state``: under ``state = "carried"`` origins run in ascending order one
    at a time, each reading the job's outputs at the preceding origin's commit; an origin read
    before that origin landed has no state to read."""

    execution_id: str
    origin: str
    preceding: str

    def __init__(self, execution_id: str, origin: str, preceding: str) -> None:
        super().__init__(f"sweep of execution {execution_id}: origin {origin} reads the outputs as origin {preceding} "
                         f"commits them, and origin {preceding} has not landed; run the origins in ascending order "
                         "(Sweep.run does)", execution_id=execution_id, origin=origin, preceding=preceding)


# --- signed credentials (engine.control.credentials) -----------------------------------------


class CredentialUnadmitted(Unauthenticated):
    """A request's signed credential is missing, malformed, signed by no issuer key pinned here,
    badly signed, for another audience or not yet valid (unauthenticated; HTTP 401, exit 9)."""

    audience: str
    reason: str

    def __init__(self, audience: str, reason: str) -> None:
        super().__init__(f"{reason}; this route admits 'Authorization: Bearer <credential>' carrying a credential "
                         f"for audience {audience!r} issued by `contextful key issue --audience {audience}` under an "
                         f"issuer key pinned here ([project] issuer_keys or CONTEXTFUL_ISSUER_PUBKEY)",
                         audience=audience, reason=reason)


class CredentialExpired(CredentialUnadmitted):
    """A signed credential's ``exp`` has passed (still a 401: it admits nothing)."""

    expired_at: str

    def __init__(self, audience: str, expired_at: str) -> None:
        super().__init__(audience, f"the credential expired at {expired_at}; issue a fresh one")
        self.expired_at = expired_at
        self.fields["expired_at"] = expired_at


class IssuerKeyInvalid(SpecInvalid):
    """An issuer key (a pinned public key, or a private key file) is not an Ed25519 key in the
    spelling ``contextful key generate`` writes, or cannot be read or written where it was named."""

    source: str
    reason: str

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"issuer key from {source}: {reason}; `contextful key generate` writes a key pair and "
                         "prints the public key to pin (ed25519:<43 base64url characters>)", source=source,
                         reason=reason)


class FireCredentialMissing(SpecInvalid):
    """``surface.dispatch.fire-credential-missing``: serve dispatches to child processes, its applied
    version schedules store-driven or synthesize jobs, and it holds neither ``--issuer-key`` (to mint
    each fire a credential) nor ``CONTEXTFUL_TOKEN`` (to pass on): raised at start, nothing fires."""

    jobs: tuple[str, ...]
    version: int | None

    def __init__(self, jobs: tuple[str, ...], version: int | None) -> None:
        at = f"v{version}" if version is not None else "the applied version"
        super().__init__(f"{at} schedules the store-driven or synthesize job(s) {', '.join(jobs)}, and serve holds no "
                         "fire credential for them: start serve with --issuer-key PATH (it mints one per fire) or "
                         "with CONTEXTFUL_TOKEN set (passed on to each child)", jobs=jobs, version=version)


class FireCredentialZoneUnset(SpecInvalid):
    """``surface.dispatch.fire-credential-zone``: serve under ``--issuer-key`` would mint fire
    credentials for scheduled store-driven or synthesize jobs, and the project's ``[project.zone]``
    declares no ``default``: raised at start, nothing fires."""

    jobs: tuple[str, ...]
    manifest: str

    def __init__(self, jobs: tuple[str, ...], manifest: str) -> None:
        super().__init__(f"serve under --issuer-key mints a credential per fire of {', '.join(jobs)} in the project's "
                         f"default zone, and [project.zone] in {manifest} declares no default: add [project.zone] "
                         "default = \"<zone>\" and apply it", jobs=jobs, manifest=manifest)


class SynthesizeTableIncompatible(Incompatible):
    """A synthesize job's source, entities or target table lacks a column the kind reads, or its
    target is keyed otherwise than on ``(entity_id, attribute)`` (docs/jobs.md "Synthesize jobs");
    the pass lands nothing."""

    job: str
    table: str
    reason: str

    def __init__(self, job: str, table: str, reason: str) -> None:
        super().__init__(f"[[job]] {job!r}: table {table!r} {reason}; a synthesize job reads mentions (mention_id, "
                         "entity_key, attribute, value, observed_at), entities (entity_id, entity_key) and its "
                         "claims keyed on (entity_id, attribute)", job=job, table=table, reason=reason)


class ReachRefused(Refused):
    """A store opened under a fire credential (``storage.reach``) was asked to read or write a table
    its credential's reach does not grant (``surface.dispatch.fire-reach``); nothing was read or
    written (refused; HTTP 403, exit 8)."""

    subject: str
    access: str
    table: str
    granted: tuple[str, ...]

    def __init__(self, subject: str, access: str, table: str, granted: tuple[str, ...]) -> None:
        super().__init__(f"the credential of {subject} does not reach {access} on table {table!r} (it grants {access} "
                         f"on: {', '.join(granted) or 'no table'})", subject=subject, access=access, table=table,
                         granted=granted)


# --- compiled plans (decision "plan-compiled-content") ----------------------------------------


class PipelineInlineStepBody(SpecInvalid):
    """``run.compile.inline-step-body``: a pipeline step's body is a connector reference (a source
    ``kind`` the engine knows, with its ``config``); inline code or any other body key is refused."""

    path: str
    key: str

    def __init__(self, path: str, key: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}; a step's body is a connector reference only ([pipeline.source] with "
                         f"kind and config): remove {key!r} and land through a source kind, shaping rows with "
                         f"[[pipeline.transform]] operations", path=path, key=key)


class PipelineUndeclaredControlFlow(SpecInvalid):
    """``run.compile.control-flow``: a data-dependent conditional or loop written any way but a
    declared ``branch`` (arms selected by data) or ``parallel`` (fan-out) operation."""

    path: str
    key: str

    def __init__(self, path: str, key: str) -> None:
        super().__init__(f"{path}: {key!r} is a data-dependent conditional or loop the plan cannot declare; "
                         f"branch with op = \"branch\" (declared arms, one selected per row by a column's value) "
                         f"and fan out with op = \"parallel\" in [[pipeline.transform]]", path=path, key=key)


class PipelineNodeIdCollision(SpecInvalid):
    """``run.compile.node-id-collision``: two nodes of one compiled plan share an id."""

    node: str
    first: str
    second: str

    def __init__(self, node: str, first: str, second: str) -> None:
        super().__init__(f"node id {node!r} is declared at {first} and again at {second}; give one of them another "
                         f"id", node=node, first=first, second=second)


class PipelineTransformArity(Incompatible):
    """``run.transform.arity``: a chain operation emitted more rows than it consumed (per batch)."""

    pipeline: str
    node: str
    consumed: int
    emitted: int

    def __init__(self, pipeline: str, node: str, consumed: int, emitted: int) -> None:
        super().__init__(f"pipeline {pipeline!r}: operation {node!r} emitted {emitted:,} rows from {consumed:,} "
                         f"consumed; a chain operation never emits more rows than it consumes (nothing of this "
                         f"batch landed): change the operation or the data it reads", pipeline=pipeline, node=node,
                         consumed=consumed, emitted=emitted)


class ScriptRuntimeLinked(Permanent):
    """``topology.compose.script-runtime``: a JavaScript engine is importable where plans are served."""

    modules: tuple[str, ...]

    def __init__(self, modules: tuple[str, ...]) -> None:
        super().__init__(f"a JavaScript runtime is importable in this serving environment ({', '.join(modules)}); "
                         f"plans are compiled data and no scripting runtime may be linked where they run: uninstall "
                         f"it from this environment (pip uninstall {' '.join(modules)}) or take it off PYTHONPATH",
                         modules=modules)


# --- run cancel (run.cancel.*) -----------------------------------------------------------------


class CancelTargetNotInFlight(Conflict):
    """``run.cancel.not-in-flight``: ``contextful run cancel`` named nothing in flight (HTTP 409).

    Only a pending owner (a non-terminal run status) accepts a cancel mark; ``target`` is the
    execution id or scope asked for, ``reason`` what was found instead.
    """

    target: str
    reason: str

    def __init__(self, target: str, reason: str) -> None:
        super().__init__(f"no execution in flight matches {target!r}: {reason}; only a pending execution can be "
                         "canceled (`contextful run executions` lists them with their status)",
                         target=target, reason=reason)


class RunCanceled(TerminalError):
    """``run.cancel.abandoned-work``: the Canceled tag. A run whose execution was marked canceled
    gives up at its next pull or commit boundary through the ordinary failure path: nothing staged
    lands, its run record closes as ``canceled`` and its owner as ``closed-canceled``, the committed
    position stays where it was (category canceled, a terminal status apart from failed)."""

    category = "canceled"
    execution: str
    scope: str

    def __init__(self, execution: str, scope: str) -> None:
        super().__init__(f"execution {execution} on {scope} was canceled (`contextful run cancel`); nothing it "
                         "staged since its last commit landed and its position is unchanged: run it again to land "
                         "what is missing", execution=execution, scope=scope)


# --- the container profile (issue 15): storage bindings and recovery identity ------------------


class StorageCapabilityMissing(Permanent):
    """``run.journal.storage-incomplete``: the storage profile lacks a binding or capability an
    execution needs (a DSN, a corpus bucket, the corpus's ``store.json``, a strict execution guard,
    a supported outbox); raised before any execution is admitted, naming every missing one."""

    profile: str
    missing: tuple[str, ...]

    def __init__(self, profile: str, missing: tuple[str, ...]) -> None:
        super().__init__(f"storage profile {profile!r} lacks {'; '.join(missing)}: bind it (docs/container-profile.md) "
                         "and start again; no execution was admitted", profile=profile, missing=missing)


class ExecutionRecoveryMismatch(Permanent):
    """``run.journal.execution-recovery``: the execution database is missing its tables or its
    project recovery identity, or holds another one than the corpus; no execution is admitted
    until the execution database is restored or ``contextful store provision`` records one."""

    schema: str
    reason: str

    def __init__(self, schema: str, reason: str) -> None:
        super().__init__(f"execution database {schema!r}: {reason}; restore the execution database that "
                         "belongs to this corpus, or on a first set-up record the recovery identity with "
                         "`contextful store provision` (docs/container-profile.md)", schema=schema, reason=reason)


class OutboxFrontierGap(Conflict):
    """``run.export.remote-state``: an acknowledgement that is not the stream's oldest pending
    events, in order. A (replacement) sender reoffers the pending event ids first; the frontier
    never advances past an event still owed."""

    stream: str
    pending: tuple[str, ...]
    offered: tuple[str, ...]

    def __init__(self, stream: str, pending: tuple[str, ...], offered: tuple[str, ...]) -> None:
        super().__init__(f"outbox stream {stream!r}: acknowledged {', '.join(offered) or 'nothing'} but the oldest "
                         f"pending events are {', '.join(pending) or 'none'}; deliver and acknowledge the pending "
                         "events first, in order", stream=stream, pending=pending, offered=offered)


# --- derive pipelines (run.select.*, run.emit.*, run.bind.*, run.exec.*; docs/derive.md) ---------


class DeriveNoStoreRoot(SpecInvalid):
    """``run.select.no-store-root``: a derive source built without a store root or without its
    pipeline id; ``absent`` names which (``store root``, ``pipeline id`` or both)."""

    absent: str

    def __init__(self, absent: str) -> None:
        super().__init__(f"a derive source was built without its {absent}: selection reads the pipeline's own "
                         "output table in its store, so build the source from a project (contextful pipeline run) "
                         "or pass both", absent=absent)


class DeriveConfigKeyMissing(SpecInvalid):
    """``run.select.required-key``: a required ``[pipeline.source.config]`` key is missing or blank."""

    pipeline: str
    key: str

    def __init__(self, pipeline: str, key: str, why: str = "") -> None:
        super().__init__(f"pipeline {pipeline!r}: [pipeline.source.config] {key} is missing or blank{why}; "
                         f"set it (docs/derive.md)", pipeline=pipeline, key=key)


class DeriveForeignOutputTable(SpecInvalid):
    """``run.select.foreign-output-table``: a config key names another pipeline's output table; the
    anti-join reads only this pipeline's own output table, named by the build."""

    pipeline: str
    key: str
    table: str
    owner: str

    def __init__(self, pipeline: str, key: str, table: str, owner: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: [pipeline.source.config] {key} = {table!r} is the output of "
                         f"{owner}; a derive pipeline selects against its own output table only (its `table`): "
                         f"remove {key}", pipeline=pipeline, key=key, table=table, owner=owner)


class DeriveReservedDiscriminator(SpecInvalid):
    """``run.emit.reserved-discriminator``: a derive output table declares a column named ``kind``
    (the passage/marker discriminator is the engine's)."""

    pipeline: str
    table: str
    column: str

    def __init__(self, pipeline: str, table: str, column: str = "kind") -> None:
        super().__init__(f"pipeline {pipeline!r}: derive table {table!r} declares a column {column!r}, which is "
                         f"reserved (it tells passage rows from marker rows): rename the column",
                         pipeline=pipeline, table=table, column=column)


class DeriveFailureOffTable(SpecInvalid):
    """``run.emit.failure-off-table``: per-unit failure state recorded anywhere but the pipeline's
    own output table (or a host task's marker table), the single record of done, failed and settled."""

    pipeline: str
    where: str

    def __init__(self, pipeline: str, where: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: per-unit failure state would be recorded in {where}; a unit's "
                         "status, attempts and last error are marker rows of the pipeline's own output table "
                         "(a host task's marker table): remove it", pipeline=pipeline, where=where)


class DeriveOutputTablesMismatch(SpecInvalid):
    """``run.emit.output-tables``: a host-task pipeline declares other tables than its task's marker
    and content tables, or a unit returned rows for a table not among its content tables (that unit
    alone fails)."""

    pipeline: str
    task: str
    declared: tuple[str, ...]
    expected: tuple[str, ...]

    def __init__(self, pipeline: str, task: str, declared: tuple[str, ...], expected: tuple[str, ...],
                 unit: str | None = None) -> None:
        what = (f"unit {unit!r} returned rows for {', '.join(declared)}" if unit is not None
                else f"the pipeline declares {', '.join(declared) or 'no tables'}")
        super().__init__(f"pipeline {pipeline!r}, host task {task!r}: {what}; the task's tables are exactly "
                         f"{', '.join(expected)}", pipeline=pipeline, task=task, declared=declared,
                         expected=expected, unit=unit)


class DeriveCycle(SpecInvalid):
    """``run.select.derive-cycle``: derive source-table or join dependencies return to a pipeline;
    names every pipeline on the cycle, and nothing is armed."""

    cycle: tuple[str, ...]

    def __init__(self, cycle: tuple[str, ...]) -> None:
        super().__init__(f"derive pipelines read each other in a cycle: {' -> '.join(cycle)}; no pipeline is "
                         "armed: break the cycle (a derive pipeline cannot read, directly or through others, its "
                         "own output)", cycle=cycle)


class DeriveAfterConflict(SpecInvalid):
    """``run.select.derive-after-conflict``: a derive child's ``after`` names a pipeline other than
    the derive parent it runs after; nothing is armed."""

    pipeline: str
    after: tuple[str, ...]
    parent: str

    def __init__(self, pipeline: str, after: tuple[str, ...], parent: str) -> None:
        super().__init__(f"pipeline {pipeline!r} runs after its derive parent {parent!r} (it reads that "
                         f"pipeline's output) but declares after = {list(after)!r}; remove `after` or name "
                         f"only {parent!r}; no pipeline is armed", pipeline=pipeline, after=after, parent=parent)


class DeriveEngineUnbound(SpecInvalid):
    """``run.bind.unbound-engine``: the engine a derive pipeline names has no ``[derive.<name>]``
    block in the machine configuration; names the pipeline, the engine, the file to edit and every
    bound engine."""

    pipeline: str
    engine: str
    file: str
    bound: tuple[str, ...]

    def __init__(self, pipeline: str, engine: str, file: str, bound: tuple[str, ...]) -> None:
        super().__init__(f"pipeline {pipeline!r} names engine {engine!r}, which has no [derive.{engine}] block; "
                         f"add one to {file} (bound engines: {', '.join(bound) or 'none'}; docs/derive.md)",
                         pipeline=pipeline, engine=engine, file=file, bound=bound)


class DeriveCommandInManifest(SpecInvalid):
    """``run.bind.command-in-manifest``: a binding key (``preprocess``, ``env``, ``allow_hosts``,
    a step's ``command``) inside ``[pipeline.source.config]``: what an engine executes belongs to
    the machine configuration."""

    pipeline: str
    key: str

    def __init__(self, pipeline: str, key: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: [pipeline.source.config] holds {key!r}, which belongs to the "
                         f"machine configuration's [derive.<engine>] block (the manifest names an engine; this "
                         f"machine's configuration says what it runs): move it there", pipeline=pipeline, key=key)


class DeriveUnknownTask(SpecInvalid):
    """``run.bind.unknown-task``: ``task`` names neither a built-in task nor a registered one; the
    message names where registrations were looked for (``engine.registrations``)."""

    pipeline: str
    task: str
    builtin: tuple[str, ...]
    registered: tuple[str, ...]
    modules: tuple[str, ...]
    """The ``[project] modules`` imported."""
    entry_points: tuple[str, ...]
    """The ``contextful.tasks`` entry points loaded."""

    def __init__(self, pipeline: str, task: str, builtin: tuple[str, ...], registered: tuple[str, ...],
                 modules: tuple[str, ...] = (), entry_points: tuple[str, ...] = ()) -> None:
        super().__init__(f"pipeline {pipeline!r}: task {task!r} is not a derive task (built-in: "
                         f"{', '.join(builtin)}; registered: {', '.join(registered) or 'none'}; "
                         f"[project] modules imported: {', '.join(modules) or 'none'}; contextful.tasks entry "
                         f"points: {', '.join(entry_points) or 'none'}): name the module registering it in "
                         f"[project] modules",
                         pipeline=pipeline, task=task, builtin=builtin, registered=registered, modules=modules,
                         entry_points=entry_points)


class DeriveTaskNameTaken(SpecInvalid):
    """``run.bind.host-task``: a host task registered under a built-in or already registered name."""

    task: str
    holder: str

    def __init__(self, task: str, holder: str) -> None:
        super().__init__(f"derive task name {task!r} is taken by {holder}; register the task under another name",
                         task=task, holder=holder)


class DeriveDriverMismatch(SpecInvalid):
    """``run.bind.driver-mismatch``: ``exec`` or ``none`` behind transcribe, ``fetch`` behind
    link_preview, and no engine behind a host task; any other pairing."""

    pipeline: str
    task: str
    driver: str

    def __init__(self, pipeline: str, task: str, driver: str, expected: str) -> None:
        super().__init__(f"pipeline {pipeline!r}: task {task!r} cannot run behind {driver}; {expected}",
                         pipeline=pipeline, task=task, driver=driver)


class DeriveEndpointHostNotBare(SpecInvalid):
    """``run.bind.endpoint-host-bare``: an ``endpoint_host`` carrying a scheme, port, path or query."""

    engine: str
    value: str
    part: str

    def __init__(self, engine: str, value: str, part: str) -> None:
        super().__init__(f"[derive.{engine}] endpoint_host = {value!r} carries a {part}; give the bare host name "
                         "(e.g. \"example.org\")", engine=engine, value=value, part=part)


class DeriveAdvisoryZone(SpecInvalid):
    """``run.bind.advisory-zone``: a row's zone taken from the binding's advisory ``zone`` key (the
    zone is advice to the engine and is left out of derivation keys; a row's zone is its own)."""

    pipeline: str
    engine: str

    def __init__(self, pipeline: str, engine: str, detail: str) -> None:
        super().__init__(f"pipeline {pipeline!r}, engine {engine!r}: {detail}; the binding's zone is advisory and "
                         "never a row's zone: let the engine report each passage's zone", pipeline=pipeline,
                         engine=engine)


class DeriveShellCommand(SpecInvalid):
    """``run.exec.shell-command``: a string-valued command; steps run as argument arrays, no shell."""

    engine: str
    step: str

    def __init__(self, engine: str, step: str) -> None:
        super().__init__(f"[derive.{engine}] {step}: command is a string; give an argument array "
                         "(command = [\"prog\", \"--flag\", \"{input}\"]): no shell ever runs a step",
                         engine=engine, step=step)


class DeriveEnvNameInvalid(SpecInvalid):
    """``run.exec.env-name``: an environment name that is not ASCII letters, digits and underscores,
    or that leads with a digit."""

    engine: str
    env_name: str

    def __init__(self, engine: str, env_name: str) -> None:
        super().__init__(f"[derive.{engine}] env: {env_name!r} is not an environment name (ASCII letters, digits "
                         "and '_', not leading with a digit)", engine=engine, env_name=env_name)


class DeriveUnitStatusUnknown(Incompatible):
    """``run.emit.unit-status``: a unit status other than ok, empty, unavailable or failed."""

    pipeline: str
    unit: str
    status: str

    def __init__(self, pipeline: str, unit: str, status: str) -> None:
        super().__init__(f"pipeline {pipeline!r}, unit {unit!r}: unit status {status!r} is none of ok, empty, "
                         "unavailable, failed", pipeline=pipeline, unit=unit, status=status)


class DeriveRemoteUrlUnsupported(Incompatible):
    """``run.bind.remote-url-unsupported``: an http(s) media value for an engine that declines remote
    addresses, with no ``when = "media_is_url"`` preprocess step to fetch it first."""

    engine: str
    media: str

    def __init__(self, engine: str, media: str) -> None:
        super().__init__(f"engine {engine!r} declines remote addresses and got {media!r}: add a preprocess step "
                         f"with when = \"media_is_url\" to [derive.{engine}] that fetches {{input}} into {{output}}",
                         engine=engine, media=media)


class DeriveMediaUnreadable(Incompatible):
    """``run.bind.media-unreadable``: a media value that is neither an address nor a readable local
    file; that unit alone fails."""

    unit: str
    media: str
    reason: str

    def __init__(self, unit: str, media: str, reason: str) -> None:
        super().__init__(f"unit {unit!r}: media {media!r} is neither an http(s) address nor a readable local file "
                         f"({reason})", unit=unit, media=media, reason=reason)


class DeriveHostNotAllowed(Incompatible):
    """The fetch driver was asked to reach (or redirected to) a host that is neither the binding's
    ``endpoint_host`` nor in its ``allow_hosts``; nothing is fetched from it and that unit fails."""

    url: str
    host: str
    allowed: tuple[str, ...]

    def __init__(self, url: str, host: str, allowed: tuple[str, ...]) -> None:
        super().__init__(f"{url!r}: host {host!r} is not the endpoint host or in allow_hosts "
                         f"({', '.join(allowed) or 'none'}); nothing was fetched from it",
                         url=url, host=host, allowed=allowed)


class DeriveConfidenceOutOfRange(Incompatible):
    """``run.bind.confidence-range``: a passage confidence outside 0.0..=1.0 after the adapter's
    normalization; the passage lands with a null confidence."""

    engine: str
    unit: str
    value: float

    def __init__(self, engine: str, unit: str, value: float) -> None:
        super().__init__(f"engine {engine!r}, unit {unit!r}: confidence {value!r} is outside 0.0..=1.0; the "
                         "passage landed with a null confidence", engine=engine, unit=unit, value=value)


class DeriveStepExit(TransientError):
    """``run.exec.non-zero-exit``: a step exited non-zero; ``error`` is its bounded error text."""

    step: str
    code: int
    error: str

    def __init__(self, step: str, code: int, error: str) -> None:
        super().__init__(f"derive step {step} exited {code}: {error or '(no error output)'}", step=step, code=code,
                         error=error)


class DeriveStepTimeout(TransientError):
    """``run.exec.deadline-elapsed``: a unit's chain passed its deadline; names the running step."""

    step: str
    deadline_s: float

    def __init__(self, step: str, deadline_s: float) -> None:
        super().__init__(f"derive step {step} was still running when the chain's {deadline_s:g} s deadline passed; "
                         "it was killed (raise deadline_s in its [derive.<engine>] block if the unit needs longer)",
                         step=step, deadline_s=deadline_s)


class DeriveOutputCap(Incompatible):
    """``run.exec.output-cap``: a step wrote past its output bound; it was killed and drained."""

    step: str
    bytes: int
    cap: int

    def __init__(self, step: str, count: int, cap: int) -> None:
        super().__init__(f"derive step {step} wrote {count:,} bytes, past its {cap:,}-byte output bound; it was "
                         "killed (raise output_cap_bytes in its [derive.<engine>] block if the output is right)",
                         step=step, bytes=count, cap=cap)


class DeriveStepProducedNothing(Incompatible):
    """``run.exec.silent-step``: a preprocess step exited zero without writing its output file."""

    step: str
    output: str

    def __init__(self, step: str, output: str) -> None:
        super().__init__(f"derive step {step} exited 0 but wrote nothing to {output}; a preprocess step must write "
                         "its {output} file", step=step, output=output)


class DeriveSettledUnitRevived(Conflict):
    """``run.emit.settled-revived``: a unit settled under its current key (by another tick) while this
    tick derived it; this tick lands none of that unit's rows."""

    pipeline: str
    unit: str
    derivation_key: str

    def __init__(self, pipeline: str, unit: str, derivation_key: str) -> None:
        super().__init__(f"pipeline {pipeline!r}, unit {unit!r}: settled under derivation key "
                         f"{derivation_key[:12]}... by another run while this one derived it; this run landed "
                         "none of its rows", pipeline=pipeline, unit=unit, derivation_key=derivation_key)


# --- the control plane I (surface.arm.*, surface.apply.*, surface.dispatch.*; engine/control) -------


class ScheduleUnreadable(SpecInvalid):
    """``surface.arm.unreadable-schedule``: a schedule string the grammar cannot read (L, W, ?, # and
    @ macros included); that entry alone is held back, every other entry arms."""

    entry: str
    schedule: str
    diagnostic: str

    def __init__(self, entry: str, schedule: str, diagnostic: str) -> None:
        super().__init__(f"{entry}: schedule {schedule!r} is unreadable: {diagnostic} (a schedule is "
                         "'every <n><s|m|h|d>' or a five-field UTC cron expression)",
                         entry=entry, schedule=schedule, diagnostic=diagnostic)


class TriggerAdapterUnknown(SpecInvalid):
    """``surface.arm.unknown-trigger``: ``[control] trigger`` names no adapter; serve runs on no adapter."""

    def __init__(self, trigger: str, known: tuple[str, ...]) -> None:
        super().__init__(f"[control] trigger {trigger!r} is no trigger adapter (known: {', '.join(known)}); "
                         "serving with no trigger: nothing fires", trigger=trigger, known=known)


class TriggerFaceMissing(SpecInvalid):
    """``surface.arm.trigger-face-missing``: ``trigger = "external"`` on a serve with no HTTP face."""

    def __init__(self) -> None:
        super().__init__('[control] trigger = "external" answers POST /wake on the served face, and this serve '
                         "has none: give pipeline serve --http HOST:PORT")


class DispatchUnitNotAHead(SpecInvalid):
    """``surface.dispatch.not-a-head``: a due id is a landing step of another entry's unit."""

    entry: str
    head: str

    def __init__(self, entry: str, head: str) -> None:
        super().__init__(f"{entry!r} is a step of {head!r}'s unit (its after names it): its cadence rides "
                         f"{head!r}'s schedule; nothing started", entry=entry, head=head)


class ManifestVersionConflict(Conflict):
    """``surface.apply.version-race``: another apply claimed the version this one meant to claim."""

    def __init__(self, project: str, version: int, winner: int, detail: str | None = None) -> None:
        # ``detail``: what a synced push found instead (engine.control.bucket), in place of the local race's words.
        said = detail or f"was claimed by another apply (applied: v{winner}); reapplying onto it"
        super().__init__(f"project {project!r}: version {version} {said}", project=project, version=version,
                         winner=winner)


class ApplyValidationRefused(SpecInvalid):
    """``surface.apply.validation``: the document fails engine validation; no version is claimed."""

    def __init__(self, source: str, problems: list[ContextfulError]) -> None:
        lines = "; ".join(str(p) for p in problems)
        super().__init__(f"{source}: not applied, no version claimed: {lines}", source=source, problems=problems)


class StoreNotInitialized(Conflict):
    """``surface.apply.uninitialized-store``: an apply or edit before the guarded import (HTTP 409)."""

    def __init__(self, project: str, snapshot_dir: str) -> None:
        super().__init__(f"project {project!r}: no version is claimed in {snapshot_dir} (an empty store included); "
                         "run contextful pipeline import first", project=project, snapshot_dir=snapshot_dir)


class ControlSnapshotUnreadable(TransientError):
    """``surface.reconcile.fail-static``: the applied pointer or snapshot cannot be read; what is
    armed stays armed and running."""

    location: str
    reason: str

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"{location}: {reason}; what is armed keeps running", location=location, reason=reason)


class ControlPointerMalformed(ControlSnapshotUnreadable):
    """``surface.reconcile.pointer-malformed``: a pointer body that is not wholly a version."""

    def __init__(self, location: str, body: str) -> None:
        ContextfulError.__init__(self, f"{location}: the applied pointer {body[:40]!r} is not a version number; "
                                 "what is armed keeps running", location=location, reason="malformed", body=body)


# --- the control plane III: synced control, reconcile, served control, residency ----------------
# (surface.apply.*, surface.reconcile.*, surface.edit.*, surface.reside.*; engine/control/receipts.py,
# reconcile.py, drafts.py, residency.py, engine/served/control.py)


class ControlSnapshotUntrusted(Unauthenticated):
    """``surface.reconcile.pulled-control-untrusted``: a pulled control head whose signature, project,
    digest, predecessor chain, signer pin or local validation fails; ``reason`` names which, and none
    of that version is armed."""

    location: str
    reason: str

    def __init__(self, location: str, reason: str) -> None:
        super().__init__(f"{location}: untrusted: {reason}; nothing of it is armed", location=location, reason=reason)


class ControlAttestationUnavailable(Unauthenticated):
    """``surface.apply.attestation-unavailable``: a synced import or apply holds no admitted Admin
    capability or no issuer signing key; no version is claimed."""

    project: str
    missing: str

    def __init__(self, project: str, missing: str) -> None:
        super().__init__(f"project {project!r} syncs its control: {missing}; no version is claimed",
                         project=project, missing=missing)


class ControlOperatorAttestationInvalid(Unauthenticated):
    """``surface.apply.operator-attestation``: an Admin mutation without a fresh console signature over
    its verified operator, route and body, or reusing a nonce; the document is unchanged."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"operator attestation refused: {reason}; nothing changed", reason=reason)


class ControlSourceNotLoopback(SpecInvalid):
    """``surface.reconcile.loopback-only``: a control URL whose host is not a loopback address; nothing
    is armed."""

    url: str

    def __init__(self, url: str) -> None:
        super().__init__(f"[control] url {url!r}: its host is not a loopback address (localhost, 127.0.0.0/8, "
                         "::1); nothing is armed", url=url)


class ControlRequestMalformed(SpecInvalid):
    """``surface.apply.served-malformed``: a served Admin edit or apply whose body is not a JSON object
    holding exactly its route's fields (HTTP 400); nothing changed."""

    route: str
    reason: str

    def __init__(self, route: str, reason: str) -> None:
        super().__init__(f"{route}: {reason}; nothing changed", route=route, reason=reason)


class SecretMaterialInDocument(SpecInvalid):
    """``surface.edit.secret-in-document``: a credential value typed into a configuration field; the
    document holds ``${secret:NAME}`` references, the backend holds material. ``where`` names the
    field; the value is never echoed."""

    where: str
    kind: str

    def __init__(self, where: str, kind: str) -> None:
        super().__init__(f"{where} holds credential material ({kind}); write a ${{secret:NAME}} reference and keep "
                         "the value in the secret backend", where=where, kind=kind)


class EnforceRegionMismatch(SpecInvalid):
    """``surface.reside.region-mismatch``: a configured resource resolves to a region the residency
    allow-set omits (or whose region cannot be learned); the runtime serves nothing."""

    resource: str
    region: str

    def __init__(self, resource: str, region: str, allowed: tuple[str, ...] = ()) -> None:
        super().__init__(f"{resource} resolves to region {region!r}, outside [residency] regions "
                         f"{list(allowed)!r}; nothing is served", resource=resource, region=region, allowed=allowed)


class ResidencySitesDiverge(Conflict):
    """``surface.reside.site-regions``: a push finding another site's recorded residency allow-set
    (an absent one included) differing from this site's; nothing is committed."""

    ours: tuple[str, ...] | None
    theirs: tuple[str, ...] | None

    def __init__(self, location: str, ours: tuple[str, ...] | None, theirs: tuple[str, ...] | None) -> None:
        def spelled(regions: tuple[str, ...] | None) -> str:
            return "none recorded" if regions is None else repr(list(regions))
        super().__init__(f"{location}: this site resides in {spelled(ours)} but the bucket records "
                         f"{spelled(theirs)}; nothing is pushed", location=location, ours=ours, theirs=theirs)


class ControlAdminGrantMissing(Refused):
    """``surface.apply.served-admin-grant``: a served ``/control/*`` request whose admitted credential
    holds no Admin grant over ``*`` without a tenant scope (HTTP 403), refused before its handler."""

    subject: str

    def __init__(self, subject: str, reason: str = "it holds no Admin grant over '*' without a tenant scope") -> None:
        super().__init__(f"credential of {subject!r}: {reason}", subject=subject, reason=reason)


class ConnectorUploadRefused(Refused):
    """``surface.edit.connector-upload``: an artifact uploaded through the operator surface; the surface
    references registered connectors by id and version (publishing runs a separate signed path)."""

    what: str

    def __init__(self, what: str) -> None:
        super().__init__(f"{what}: the operator surface takes no uploaded artifact; reference a registered "
                         "connector by id and version", what=what)


class ControlDraftAbsent(NotFound):
    """``surface.apply.draft-absent``: an Admin apply finding no validated store draft; no applied
    version changes."""

    project: str

    def __init__(self, project: str, reason: str = "no validated draft is saved") -> None:
        super().__init__(f"project {project!r}: {reason}; nothing is applied", project=project, reason=reason)


class ControlUnavailable(TransientError):
    """``surface.apply.served-unavailable``: a served control request failing with no authority or
    surface refusal (HTTP 503). Its detail carries no internal error text: the cause is logged, the
    answer names only an error id."""

    error_id: str

    def __init__(self, error_id: str) -> None:
        super().__init__(f"the control plane could not complete the request (error id {error_id})", error_id=error_id)


class ConfigOwnerUnconfigured(Permanent):
    """``surface.apply.owner-unconfigured``: the configuration owner has no storage configured or no
    credential (HTTP 503); no local writer substitutes for the store-scoped API."""

    missing: str

    def __init__(self, missing: str) -> None:
        super().__init__(f"the configuration owner is unconfigured: {missing}; no draft or version is written",
                         missing=missing)

    @property
    def http_status(self) -> int:
        return 503


# --- the control plane IV: workers, delegates, connections ---------------------------------------
# (surface.dispatch.worker-*/submit-*/heartbeat-*/callback-*/step-result, surface.delegate.*,
# surface.connection.*; engine/control/worker_key.py, worker.py, delegate.py, connection.py)


class DispatchSubmitRejected(Refused):
    """``surface.dispatch.submit-signed``: a worker's ``POST /submit`` without a valid HMAC under the
    worker key within the skew, or naming a callback outside its own relay; nothing starts."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"submission refused: {reason}; nothing started", reason=reason)


class DispatchCallbackRejected(Refused):
    """``surface.dispatch.callback-rejected``: a heartbeat or callback whose signature fails, whose
    attempt is not the step's current one, whose timestamp is outside the skew, or whose step has
    closed; no step changes."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"callback refused: {reason}; no step changed", reason=reason)


class StepResultRefused(SpecInvalid):
    """``surface.dispatch.step-result``: a completion callback body that is not a pointer, an
    object-store key, a catalog row id or a failed step's last error line as JSON of at most 1 MiB;
    nothing is recorded."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"step result refused: {reason}; nothing recorded", reason=reason)


class JobDelegateUnbound(SpecInvalid):
    """``surface.delegate.binding``: a store-driven body ``{ delegate = "<name>" }`` naming no
    ``[control.delegates.<name>]`` binding (at arm or fire)."""

    job: str
    delegate: str

    def __init__(self, job: str, delegate: str) -> None:
        super().__init__(f"job {job!r}: its body names delegate {delegate!r}, which no [control.delegates] "
                         "binding declares; nothing fires", job=job, delegate=delegate)


class DelegateHostRefused(SpecInvalid):
    """``surface.delegate.host``: a delegate url that is not http to a loopback host or the
    ``contextful.delegate`` virtual host, or that carries a credential; nothing is armed."""

    delegate: str
    url: str

    def __init__(self, delegate: str, url: str, reason: str) -> None:
        super().__init__(f"[control.delegates.{delegate}] url {url!r}: {reason}; nothing is armed",
                         delegate=delegate, url=url, reason=reason)


class DelegateTimeoutRefused(SpecInvalid):
    """``surface.delegate.call-timeout-ceiling``: a call delegate's timeout above 3600 s."""

    delegate: str

    def __init__(self, delegate: str, timeout_s: float, ceiling_s: int = 3600) -> None:
        super().__init__(f"[control.delegates.{delegate}] timeout {timeout_s:g} s is above the {ceiling_s} s "
                         "ceiling", delegate=delegate, timeout_s=timeout_s, ceiling_s=ceiling_s)


class DelegateSubmitUnfilled(SpecInvalid):
    """``surface.delegate.submit-unfilled``: a store-driven fire whose delegate binds ``mode = "submit"``;
    ``call`` is the mode that dispatches. Raised before any execution opens."""

    job: str
    delegate: str

    def __init__(self, job: str, delegate: str) -> None:
        super().__init__(f"job {job!r}: delegate {delegate!r} binds mode \"submit\", which no engine path drives; "
                         "bind mode = \"call\" to dispatch its items", job=job, delegate=delegate)


class DelegateAnswerRejected(TransientError):
    """``surface.delegate.rejected``: a delegate answer unsigned or skewed (the attempt closes
    Transient), or outside the outcome vocabulary or over the step-result bound (``permanent``: the
    attempt closes Permanent)."""

    delegate: str
    reason: str
    permanent: bool

    def __init__(self, delegate: str, reason: str, *, permanent: bool = False) -> None:
        super().__init__(f"delegate {delegate!r}: answer rejected: {reason}", delegate=delegate, reason=reason,
                         permanent=permanent)


class DelegateAnsweredTransient(TransientError):
    """``surface.delegate.outcome``: a delegate answered ``transient`` (or ``defer`` for a job without
    isolated items): the attempt closes Transient under the retry budget."""

    delegate: str
    reason: str

    def __init__(self, delegate: str, reason: str) -> None:
        super().__init__(f"delegate {delegate!r} answered transient: {reason}", delegate=delegate, reason=reason)


class DelegateAnsweredPermanent(Permanent):
    """``surface.delegate.outcome``: a delegate answered ``permanent``: the item closes Permanent."""

    delegate: str
    reason: str

    def __init__(self, delegate: str, reason: str) -> None:
        super().__init__(f"delegate {delegate!r} answered permanent: {reason}", delegate=delegate, reason=reason)


class ConnectionRequestMalformed(SpecInvalid):
    """``surface.connection.malformed``: a create body outside the declaration (an OAuth code or token
    beside the secret name included), an unreadable schedule, or a pause or delete body other than
    ``{}`` (HTTP 400); no version is claimed."""

    reason: str

    def __init__(self, reason: str) -> None:
        super().__init__(f"connection request malformed: {reason}; nothing claimed", reason=reason)


class ConnectionScopeDenied(Refused):
    """``surface.connection.authority``: a connection mutation whose admitted write credential is not
    for the connection's tenant and principal (HTTP 403)."""

    connection: str

    def __init__(self, connection: str, reason: str) -> None:
        super().__init__(f"connection {connection!r}: {reason}", connection=connection, reason=reason)


class ConnectionUnknown(NotFound):
    """``surface.connection.unknown``: a pause or delete naming no standing connection (HTTP 404)."""

    connection: str

    def __init__(self, connection: str) -> None:
        super().__init__(f"no standing connection {connection!r}", connection=connection)


class ConnectionIdConflict(Conflict):
    """``surface.connection.idempotent-create``: a create repeating a connection id (a retired one
    included) with a differing declaration (HTTP 409); the standing record stays."""

    connection: str

    def __init__(self, connection: str, reason: str) -> None:
        super().__init__(f"connection {connection!r}: {reason}; the standing record stays", connection=connection,
                         reason=reason)


# --- the control plane II: applied jobs (surface.fire.*; engine/control/contracts.py) -----------


class AppliedContractMissing(SpecInvalid):
    """``surface.fire.applied-contract-missing``: an applied job's version holds no standalone table
    contract for ``tables`` (a version claimed before contracts were captured, a pipelines-only apply
    over one, or a table a pipelines-only apply stopped producing); the job refuses until a full
    ``contextful pipeline apply`` captures them. No live declaration stands in."""

    job: str
    version: int
    tables: tuple[str, ...]

    def __init__(self, job: str, version: int, tables: tuple[str, ...] = ()) -> None:
        what = f"no contract of {', '.join(map(repr, tables))}" if tables else "no standalone table contracts"
        super().__init__(f"job {job!r}: applied version {version} holds {what}; nothing runs until a full "
                         "`contextful pipeline apply` captures them", job=job, version=version, tables=tables)


class AppliedAuthorityChanged(SpecInvalid):
    """``surface.fire.applied-current-authority``: the writer of a table an applied job reads or
    writes (``pipeline:<id>``, ``model:<name>``, ``external:<id>``, ``job:<name>`` or ``store``) is
    ``current`` now but ``snapshot`` in the job's version; the execution does not open."""

    job: str
    version: int
    table: str
    snapshot: str
    current: str

    def __init__(self, job: str, version: int, table: str, snapshot: str, current: str) -> None:
        super().__init__(f"job {job!r}: table {table!r} is written by {snapshot} in applied version {version} but "
                         f"by {current} now; nothing runs until the job's version is applied again",
                         job=job, version=version, table=table, snapshot=snapshot, current=current)


class AppliedModelDisclosureChanged(SpecInvalid):
    """``surface.fire.applied-current-authority``: a model an applied job reads publishes a contract
    (``current``) other than the one the job's version declares (``snapshot``)."""

    job: str
    version: int
    model: str
    snapshot: str
    current: str

    def __init__(self, job: str, version: int, model: str, snapshot: str, current: str) -> None:
        super().__init__(f"job {job!r}: model {model!r} discloses {snapshot} in applied version {version} but its "
                         f"published build discloses {current}; nothing runs until they agree",
                         job=job, version=version, model=model, snapshot=snapshot, current=current)


class CycleControlSourceUnresolved(SpecInvalid):
    """``surface.fire.cycle-control-source``: ``pipeline serve --cycle`` under a ``[control]``
    ``snapshot_dir`` or ``url`` that does not resolve (no such directory; a URL whose host is not a
    loopback address, or that does not answer); nothing is armed or fired."""

    source: str
    reason: str

    def __init__(self, source: str, reason: str) -> None:
        super().__init__(f"control source {source}: {reason}; nothing armed, nothing fired",
                         source=source, reason=reason)


# The catalogue's whole surface (contextful.errors re-exports it; a test keeps it complete).
__all__ = [
    "AddressInUse",
    "AnswerTooLarge",
    "AppliedAuthorityChanged",
    "AppliedContractMissing",
    "AppliedModelDisclosureChanged",
    "ApplyValidationRefused",
    "ArgumentInvalid",
    "AwakeableAlreadyResolved",
    "AwakeableTimedOut",
    "AwakeableUnknown",
    "BlobCorrupt",
    "BlobNotFound",
    "BodyIdentityConfigured",
    "BodyUnregistered",
    "CallbackGuardHeld",
    "CancelTargetNotInFlight",
    "CatalogDsnMissing",
    "CatalogPathMissing",
    "CatalogRejected",
    "CatalogUnavailable",
    "ColumnNamesCollide",
    "CommitConflict",
    "CommitOutcomeUnknown",
    "ConditionalWriteUnsupported",
    "ConfigOwnerUnconfigured",
    "ConfirmationRequired",
    "Conflict",
    "ConnectionIdConflict",
    "ConnectionRequestMalformed",
    "ConnectionScopeDenied",
    "ConnectionUnknown",
    "ConnectorBoundHit",
    "ConnectorUploadRefused",
    "ContextfulError",
    "ContractMismatch",
    "ControlAdminGrantMissing",
    "ControlAttestationUnavailable",
    "ControlDraftAbsent",
    "ControlOperatorAttestationInvalid",
    "ControlPointerMalformed",
    "ControlRequestMalformed",
    "ControlSnapshotUnreadable",
    "ControlSnapshotUntrusted",
    "ControlSourceNotLoopback",
    "ControlUnavailable",
    "CredentialExpired",
    "CredentialUnadmitted",
    "CursorFieldMismatch",
    "CursorPositionUnorderable",
    "CycleControlSourceUnresolved",
    "DelegateAnswerRejected",
    "DelegateAnsweredPermanent",
    "DelegateAnsweredTransient",
    "DelegateHostRefused",
    "DelegateSubmitUnfilled",
    "DelegateTimeoutRefused",
    "DeriveAdvisoryZone",
    "DeriveAfterConflict",
    "DeriveCommandInManifest",
    "DeriveConfidenceOutOfRange",
    "DeriveConfigKeyMissing",
    "DeriveCycle",
    "DeriveDriverMismatch",
    "DeriveEndpointHostNotBare",
    "DeriveEngineUnbound",
    "DeriveEnvNameInvalid",
    "DeriveFailureOffTable",
    "DeriveForeignOutputTable",
    "DeriveHostNotAllowed",
    "DeriveMediaUnreadable",
    "DeriveNoStoreRoot",
    "DeriveOutputCap",
    "DeriveOutputTablesMismatch",
    "DeriveRemoteUrlUnsupported",
    "DeriveReservedDiscriminator",
    "DeriveSettledUnitRevived",
    "DeriveShellCommand",
    "DeriveStepExit",
    "DeriveStepProducedNothing",
    "DeriveStepTimeout",
    "DeriveTaskNameTaken",
    "DeriveUnitStatusUnknown",
    "DeriveUnknownTask",
    "DispatchCallbackRejected",
    "DispatchSubmitRejected",
    "DispatchUnitNotAHead",
    "EnforceRegionMismatch",
    "ExecutionHeld",
    "ExecutionNotFound",
    "ExecutionRecoveryMismatch",
    "ExecutionRewindUnsafe",
    "ExecutionSuspended",
    "ExecutionWriterFenced",
    "Expired",
    "ExportCommitConflict",
    "ExportNamespaceShared",
    "ExportQueryRefused",
    "FireCredentialMissing",
    "FireCredentialZoneUnset",
    "Incompatible",
    "InputChanged",
    "InputMalformed",
    "InputNotFound",
    "InputUnreadable",
    "IssuerKeyInvalid",
    "JobAnswerInvalid",
    "JobBodyUnregistered",
    "JobConcurrencyUnset",
    "JobDelegateUnbound",
    "JobItemKeyInvalid",
    "JobKindUndispatched",
    "JobKindUnknown",
    "JobNotFound",
    "JobPlanInvalid",
    "JobStoreUnbound",
    "JobTargetUnbound",
    "JournalConflict",
    "LeaseCursorKindMismatch",
    "ManifestInvalid",
    "ManifestKeyUnknown",
    "ManifestValueInvalid",
    "ManifestVersionConflict",
    "ModalityInvalid",
    "ModelCycle",
    "ModelInputUnknown",
    "ModelTestFailed",
    "NotFound",
    "OrderByWideningLossy",
    "OutboxFrontierGap",
    "OwnerPinsMismatch",
    "OwnerPlanMismatch",
    "PageCapExceeded",
    "ParseCrashed",
    "Permanent",
    "PipelineAfterCycle",
    "PipelineAfterUnknown",
    "PipelineIdDuplicate",
    "PipelineInlineStepBody",
    "PipelineListIndexMissing",
    "PipelineNodeIdCollision",
    "PipelineNormalizeModeUnknown",
    "PipelinePrimaryKeyInvalid",
    "PipelineSeedCeilingBreached",
    "PipelineSeedCeilingUnevaluable",
    "PipelineSeedDeclarationMissing",
    "PipelineSeedSourceChanged",
    "PipelineSourceKindUnknown",
    "PipelineTransformArity",
    "PipelineUndeclaredControlFlow",
    "PrimaryKeyColumnMissing",
    "PrimaryKeyNull",
    "PrimaryKeyWideningLossy",
    "ProjectExists",
    "ProjectInvalid",
    "ProjectModuleUnimportable",
    "ProjectNotFound",
    "PublicationIncompatible",
    "PublicationStorageUnsupported",
    "QueryFailed",
    "QueryInvalid",
    "QueryWriteRefused",
    "RateLimited",
    "ReachRefused",
    "ReaderCredentialUnadmitted",
    "ReceiveBatchKeyExpired",
    "Refused",
    "RequestBodyTooLarge",
    "ResidencySitesDiverge",
    "RunCanceled",
    "RunNotFound",
    "ScheduleUnreadable",
    "SchemaIrreconcilable",
    "ScriptRuntimeLinked",
    "SecretMaterialInDocument",
    "SecretUnresolved",
    "SnapshotCollected",
    "SnapshotNotFound",
    "SourceRequestRefused",
    "SourceResponseMalformed",
    "SourceUnavailable",
    "SpecInvalid",
    "StagingFailed",
    "StagingLeaseLost",
    "StepResultRefused",
    "StorageCapabilityMissing",
    "StorageProfileUnknown",
    "StoreCatalogMismatch",
    "StoreFormatNewer",
    "StoreNotFound",
    "StoreNotInitialized",
    "SweepOriginOutOfOrder",
    "SyncCursorConflict",
    "SynthesizeTableIncompatible",
    "TableDeclarationChanged",
    "TableNameCollision",
    "TableNameInvalid",
    "TableNotFound",
    "TableStillRead",
    "TableUnreadable",
    "TerminalError",
    "TransientError",
    "TriggerAdapterUnknown",
    "TriggerFaceMissing",
    "TypeSpellingUnreadable",
    "TypedLandingFailed",
    "Unauthenticated",
    "WriterCredentialUnadmitted",
    "WriterPipelineRefused",
    "first_line",
]


# --- issue 33: coordinated publications and the D1 profile's callback guards ------------------


class PublicationIncompatible(Incompatible):
    """``run.export.group-incompatible``: membership drift, an incarnation mismatch, a changed pending
    read identity, an incompatible checkpoint, an incomplete producer frontier, or a predecessor or
    order mismatch; raised before delivery or activation, naming the publication and why."""

    publication: str
    reason: str

    def __init__(self, publication: str, reason: str) -> None:
        super().__init__(f"publication {publication!r}: {reason}; nothing was delivered or activated",
                         publication=publication, reason=reason)


class PublicationStorageUnsupported(Incompatible):
    """``run.export.group-storage``: the storage profile keeps no coordinated-group outbox (postgres),
    or a cloudflare-d1 sender state exceeds its bound; raised before execution, staging or delivery."""

    publication: str
    profile: str
    reason: str

    def __init__(self, publication: str, profile: str, reason: str) -> None:
        super().__init__(f"publication {publication!r} under storage profile {profile!r}: {reason} (the "
                         "coordinated-group-outbox capability); nothing was staged or delivered",
                         publication=publication, profile=profile, reason=reason)


class CallbackGuardHeld(Permanent):
    """``run.callback-guard.acquire`` and ``run.journal.d1-guard``: a committed guard protects a row
    this admission or transfer needs; it releases only under release, replay or
    ``contextful storage reconcile-guard``."""

    scope: str
    token: str
    why: str

    def __init__(self, scope: str, token: str, why: str) -> None:
        super().__init__(f"owner scope {scope!r} is protected by callback guard {token}: {why}", scope=scope,
                         token=token, why=why)
