"""Platform errors: one hierarchy, one classifier, one vocabulary for healing, retries and the audit log.

Every error gets a **code** (what went wrong: `ICEBERG_COMMIT_CONFLICT`, `CORRUPT_INPUT`...) and a
**kind** (what repeating it can do), after dlt's Terminal/Transient exception mixins:

* `transient` — the same call may succeed when repeated (a commit conflict, a busy catalog, a source
  briefly down): the one retry helper (lakehouse.runtime.retry) repeats it in place, within its policy;
* `terminal` — nothing repeats it (a decision such as a disabled stage or a failed audit, metadata
  that cannot work as written, a database down past its outage window);
* `recoverable` — repeating the same call fails the same way, but a healing action (quarantine a
  file, evolve the schema, halve the batch) or a fresh step may get past it.

Errors the platform raises carry their code on the class (and `Transient` / `Terminal` where they
are raised). Errors from the JVM are mapped in ONE place, `java_classes`, by their Java class and
superclasses, read through Py4J from `Py4JJavaError.java_exception` or PySpark's captured
exceptions (`_origin`) and their cause chains — not from message words. What carries no class
(a Spark error-class tag in a message, an S3 error code in a botocore message) falls back to the
patterns of `_RULES`, kept here and nowhere else. docs/errors.md says which layer retries what.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

ICEBERG_COMMIT_CONFLICT = "ICEBERG_COMMIT_CONFLICT"
SCHEMA_DRIFT = "SCHEMA_DRIFT"
CORRUPT_INPUT = "CORRUPT_INPUT"
OUT_OF_MEMORY = "OUT_OF_MEMORY"
SOURCE_UNAVAILABLE = "SOURCE_UNAVAILABLE"
TRANSIENT_IO = "TRANSIENT_IO"
SPARK_SESSION_DEAD = "SPARK_SESSION_DEAD"
STEP_TIMEOUT = "STEP_TIMEOUT"
JVM_ERROR = "JVM_ERROR"
STAGE_DISABLED = "STAGE_DISABLED"
AUDIT_FAILED = "AUDIT_FAILED"
CONFIGURATION = "CONFIGURATION"  # the metadata cannot work as written: fix it, a retry will not
DATABASE_UNAVAILABLE = "DATABASE_UNAVAILABLE"
DATABASE_BUSY = "DATABASE_BUSY"  # a database (the catalog's, the control DB) refused a statement for now: locked, deadlock
ICEBERG_VALIDATION = "ICEBERG_VALIDATION"  # Iceberg's checks refused a commit (e.g. fast-forward of a non-descendant)
UNKNOWN = "UNKNOWN"

#: Codes whose failures are decisions or mistakes, not faults: never healed, never retried. A
#: database still down after the outage window (lakehouse.runtime.outage) was already retried for that long.
NOT_RETRYABLE = frozenset({STAGE_DISABLED, AUDIT_FAILED, CONFIGURATION, DATABASE_UNAVAILABLE})
#: Codes whose failures the same call may not meet again: retried in place by lakehouse.runtime.retry.
TRANSIENT_CODES = frozenset({ICEBERG_COMMIT_CONFLICT, DATABASE_BUSY, SOURCE_UNAVAILABLE, TRANSIENT_IO,
                             SPARK_SESSION_DEAD})

TRANSIENT, TERMINAL, RECOVERABLE = "transient", "terminal", "recoverable"

#: Java class (or a superclass of it) -> code, most specific first: the first one found anywhere in
#: the error's Java cause chain decides (after a database's own "busy" codes, see _busy).
_JAVA_CODES: tuple[tuple[str, str], ...] = (
    ("org.apache.iceberg.exceptions.CommitFailedException", ICEBERG_COMMIT_CONFLICT),
    ("org.apache.iceberg.exceptions.CommitStateUnknownException", ICEBERG_COMMIT_CONFLICT),
    ("org.apache.iceberg.exceptions.ValidationException", ICEBERG_VALIDATION),
    ("java.lang.OutOfMemoryError", OUT_OF_MEMORY),
    ("java.lang.StackOverflowError", JVM_ERROR),
    ("java.lang.VirtualMachineError", JVM_ERROR),
    ("org.apache.parquet.io.ParquetDecodingException", CORRUPT_INPUT),
    ("org.apache.parquet.io.InvalidRecordException", CORRUPT_INPUT),
    ("java.io.EOFException", CORRUPT_INPUT),
    # a file read by a task but gone by then ([PATH_NOT_FOUND] / "File ... does not exist"): the file's
    # problem, not the source's (lakehouse.engines.isolate leaves it for the next run)
    ("org.apache.spark.SparkFileNotFoundException", CORRUPT_INPUT),
    ("java.net.SocketTimeoutException", TRANSIENT_IO),
    ("java.net.ConnectException", SOURCE_UNAVAILABLE),
    ("java.net.UnknownHostException", SOURCE_UNAVAILABLE),
)
#: A database's own codes for "not now": SQLite's result codes, SQLSTATE serialization failure / deadlock.
_BUSY_SQLITE = ("SQLITE_BUSY", "SQLITE_LOCKED")
_BUSY_SQLSTATE = ("40001", "40P01")

#: Errors that, raised while reading a source, mean "the source cannot be read now" rather than bad
#: data or a bug (lakehouse.lineage.recovery reroutes on them): Python classes and Java classes.
_SOURCE_READ_PY = ("OSError", "ClientError", "BotoCoreError", "OperationalError", "InterfaceError",
                   "EndpointConnectionError", "SourceUnavailable")
_SOURCE_READ_JAVA = ("java.sql.SQLException", "java.net.ConnectException", "java.io.FileNotFoundException",
                     "java.net.UnknownHostException", "java.nio.file.AccessDeniedException")

# (code, class names anywhere in the MRO, message patterns). First match wins, so the more
# specific codes come first (a corrupt parquet footer is also an IOException).
_RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (STAGE_DISABLED, ("StageDisabled",), ()),
    (AUDIT_FAILED, ("AuditFailed",), ()),
    (CONFIGURATION, ("ConfigurationError", "MetadataError", "SqlParseError", "RuleError"), ()),
    (STEP_TIMEOUT, ("StepTimeout",), (r"cancelled part of cancelled job group",)),
    # pyiceberg's own CommitFailedException (a Python class); the JVM's comes from _JAVA_CODES. The
    # message: a commit to one branch built on metadata that a concurrent commit to another branch of
    # the table has since moved (the table's one sequence-number counter); the catalog refuses it as
    # a ValueError (PyIceberg) or ValidationException (Java) before anything is stored, where it
    # means what CommitFailedException means: reload and commit again (apache/iceberg#15001, #15126)
    (ICEBERG_COMMIT_CONFLICT, ("CommitFailedException", "CommitConflict"), (
        r"Cannot add snapshot with sequence number \d+ older than last sequence number \d+",
    )),
    (OUT_OF_MEMORY, ("MemoryError", "OutOfMemory"), (
        # an executor's failure the driver only has as Spark's stage-failure text (no cause to read)
        r"Java heap space",
        r"GC overhead limit exceeded",
        r"Container killed .* memory",  # YARN / Kubernetes killed an executor: no Java class reaches us
    )),
    (CORRUPT_INPUT, ("CorruptInput",), (
        r"is not a Parquet file",
        r"Could not read footer",
        r"CorruptedFileException|Corrupted file|corrupt(?:ed)? (?:file|footer|input)",
        r"ParquetDecodingException",
        r"Malformed records are detected",
        r"MALFORMED_RECORD_IN_PARSING",
        r"FAILED_READ_FILE",
        r"Encountered error while reading file",
        r"Parquet column cannot be converted",  # one file's column has another type than the batch's
        # a corrupt data page behind an intact footer: parquet-mr (Spark) and Arrow's parquet reader
        r"can not read class org\.apache\.parquet\.format\.PageHeader",
        r"Deserializing page header failed",
        r"PageHeader: Negative length|Negative length",
        r"Couldn't deserialize thrift",
        r"Invalid page header",
        r"Corrupt snappy compressed data|FAILED_TO_UNCOMPRESS",  # a page's compressed bytes (Arrow / snappy-java)
        r"cannot read this file as its probe planned",  # the Arrow engine's read of one file
        r"native \w+ library not available",  # a codec the JVM has no native library for (zstd)
        r"\[PATH_NOT_FOUND\]|SparkFileNotFoundException",  # a file deleted under the read
    )),
    (SCHEMA_DRIFT, ("SchemaDrift",), (
        r"too many data columns",
        r"Cannot write incompatible data",
        r"INCOMPATIBLE_DATA_FOR_TABLE",
        r"Cannot find data for output column",
        r"cannot resolve .* given input columns",
        r"UNRESOLVED_COLUMN",
    )),
    (SOURCE_UNAVAILABLE, ("SourceUnavailable", "EndpointConnectionError", "ConnectionRefusedError",
                          "NoSuchBucket"), (
        r"Connection refused",
        r"Could not connect to the endpoint URL",
        r"NoSuchBucket",
        r"The connection attempt failed",
        r"source .* (?:is )?(?:unavailable|down)",
    )),
    (JVM_ERROR, ("StackOverflowError",), (
        r"ExecutorLostFailure",
        r"Executor heartbeat timed out",
        r"Remote RPC client disassociated",
    )),
    (SPARK_SESSION_DEAD, ("Py4JNetworkError",), (
        r"SparkContext (?:was|has been) shut down",
        r"Cannot call methods on a stopped SparkContext",
        r"Answer from Java side is empty",
    )),
    (TRANSIENT_IO, ("TransientIO", "TimeoutError", "ConnectionResetError", "ReadTimeoutError",
                    "ConnectTimeoutError"), (
        r"SlowDown",
        r"ServiceUnavailable|Service Unavailable",
        r"InternalError|Internal Server Error",
        r"RequestTimeout",
        r"Connection reset",
        r"Throttl",
        r"(?:status|code|HTTP)\W{0,3}50[234]\b",
    )),
]


class Transient:
    """Mixin: repeating the same call may succeed (dlt's TransientException)."""


class Terminal:
    """Mixin: repeating cannot help; nothing retries it (dlt's TerminalException)."""


class PlatformError(RuntimeError):
    """An error the platform raises itself, already carrying its code."""

    code = UNKNOWN


class SourceUnavailable(Transient, PlatformError):
    """A source cannot be read now (a probe failed, an endpoint refused): the lineage reroute's cue."""

    code = SOURCE_UNAVAILABLE


class CorruptInput(PlatformError):
    code = CORRUPT_INPUT


class TransientIO(Transient, PlatformError):
    code = TRANSIENT_IO


class ConfigurationError(Terminal, PlatformError):
    """Metadata that cannot work as written (a rule on a missing column, a DROP as stage SQL...):
    terminal, because the same step would fail the same way on every retry."""

    code = CONFIGURATION


class StepTimeout(PlatformError):
    """A step's Spark work ran past its timeout and was cancelled (lakehouse.control.deadline)."""

    code = STEP_TIMEOUT


class DatabaseUnavailable(Terminal, PlatformError):
    """The control DB or the catalog database stayed unreachable past the outage window."""

    code = DATABASE_UNAVAILABLE


class InjectedFault(PlatformError):
    """Raised by a test's fault hook (lakehouse.control.faults) with the code of the fault it plays,
    so that it is classified, healed and retried like the real one."""

    def __init__(self, message: str, code: str = UNKNOWN):
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class ErrorInfo:
    code: str
    error_class: str  # the most specific class name: the Java one when Spark wrapped it
    message: str
    class_names: tuple[str, ...]  # Python MRO names, then Java class and superclass names
    declared_kind: str | None = None  # Transient / Terminal mixin of a raised platform error

    @property
    def kind(self) -> str:
        """transient | terminal | recoverable (see the module docstring)."""
        if self.declared_kind is not None:
            return self.declared_kind
        if self.code in NOT_RETRYABLE:
            return TERMINAL
        return TRANSIENT if self.code in TRANSIENT_CODES else RECOVERABLE

    @property
    def retryable(self) -> bool:
        """May a healing action or the step's retry policy try again (everything not terminal)?"""
        return self.kind != TERMINAL

    @property
    def transient(self) -> bool:
        return self.kind == TRANSIENT


#: JVM errors that say more than the exception wrapping them: reported as the error's class.
_FATAL_JVM = ("java.lang.StackOverflowError", "java.lang.OutOfMemoryError", "java.lang.InternalError")
_MAX_JAVA_DEPTH = 16


def _chain(exc: BaseException) -> list[BaseException]:
    seen, out, cur = set(), [], exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _java_throwable(exc: BaseException):
    """The Java Throwable behind a Python exception: Py4J's `java_exception`, or the `_origin` of
    PySpark's captured exceptions (AnalysisException, IllegalArgumentException, ...)."""
    return getattr(exc, "java_exception", None) or getattr(exc, "_origin", None)


def java_classes(exc: BaseException) -> list[tuple[list[str], Any]]:
    """For each Java throwable in the error's cause chain (outermost first), its class name followed
    by its superclasses' names, read from the JVM through Py4J, and the throwable. Empty when no JVM
    error is involved or the JVM cannot be asked any more (a dead gateway: classified by its Python
    class instead)."""
    out: list[tuple[list[str], Any]] = []
    for e in _chain(exc):
        jt = _java_throwable(e)
        depth = 0
        while jt is not None and depth < _MAX_JAVA_DEPTH:
            depth += 1
            try:
                names = []
                cls = jt.getClass()
                while cls is not None and len(names) < _MAX_JAVA_DEPTH:
                    name = str(cls.getName())
                    if name in ("java.lang.Object", "java.lang.Throwable"):
                        break
                    names.append(name)
                    cls = cls.getSuperclass()
                out.append((names, jt))
                nxt = jt.getCause()
            except Exception:  # noqa: BLE001 - the gateway is gone: nothing more to learn from the JVM
                break
            if nxt is None or nxt == jt:
                break
            jt = nxt
    return out


def _busy(exc: BaseException, jchains: list[tuple[list[str], Any]]) -> bool:
    """A database said "not now" by its own error code: SQLite's result code, or an SQLSTATE."""
    for e in _chain(exc):
        if str(getattr(e, "sqlite_errorname", "")).startswith(_BUSY_SQLITE):  # sqlite3 (Python 3.11+)
            return True
        if getattr(e, "pgcode", None) in _BUSY_SQLSTATE:  # psycopg2
            return True
    for names, jt in jchains:
        try:
            if "org.sqlite.SQLiteException" in names and str(jt.getResultCode().name()).startswith(_BUSY_SQLITE):
                return True
            if "java.sql.SQLException" in names and str(jt.getSQLState() or "") in _BUSY_SQLSTATE:
                return True
        except Exception:  # noqa: BLE001 - the gateway is gone
            return False
    return False


def _java_code(chains: list[tuple[list[str], Any]]) -> str | None:
    present = {n for names, _ in chains for n in names}
    return next((code for cls, code in _JAVA_CODES if cls in present), None)


def classify(exc: BaseException) -> ErrorInfo:
    """Code, kind, class and message of an exception (and of the exceptions it wraps)."""
    chain = _chain(exc)
    names: list[str] = []
    for e in chain:
        names.extend(c.__name__ for c in type(e).__mro__ if c not in (object, BaseException, Exception))
    jchains = java_classes(exc)
    java = [names_[0] for names_, _ in jchains if names_]
    for names_, _ in jchains:
        names.extend(names_)
        names.extend(n.rsplit(".", 1)[-1] for n in names_)
    declared = next((TRANSIENT if isinstance(e, Transient) else TERMINAL for e in chain
                     if isinstance(e, Transient | Terminal)), None)
    code = next((getattr(e, "code", None) for e in chain if isinstance(e, PlatformError)), None)
    if code is None and _java_code(jchains) == ICEBERG_COMMIT_CONFLICT:
        code = ICEBERG_COMMIT_CONFLICT
    if code is None and _busy(exc, jchains):
        code = DATABASE_BUSY
    if code is None:
        code = _java_code(jchains)
    if code is None:
        text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
        for c, classes, patterns in _RULES:
            if any(any(cls in n for n in names) for cls in classes) or any(
                re.search(p, text, re.I if c != TRANSIENT_IO else 0) for p in patterns
            ):
                code = c
                break
    message = str(exc) or type(exc).__name__
    error_class = next((j for j in java if j in _FATAL_JVM), java[0]) if java else type(exc).__name__
    return ErrorInfo(code or UNKNOWN, error_class, message[:4000], tuple(dict.fromkeys(names)), declared)


def source_unreachable(exc: BaseException) -> bool:
    """Does the error, raised while reading a source, mean "the source cannot be read now" (as
    opposed to bad data or a bug)? By Python class and by Java class, never by message."""
    info = classify(exc)
    if info.code == SOURCE_UNAVAILABLE:
        return True
    names = set(info.class_names)
    return bool(names & set(_SOURCE_READ_PY) or names & set(_SOURCE_READ_JAVA))


#: SQLSTATEs of "it is there already": duplicate_table, duplicate_object, unique_violation.
_EXISTS_SQLSTATE = ("42P07", "42710", "23505")


def already_exists(exc: BaseException) -> bool:
    """Did creating a database object lose a race to another process that created it first? By
    SQLSTATE (psycopg2's `pgcode`); SQLite has no code of its own for it (SQLITE_ERROR), so its
    message is read for that one case, here in the one mapper."""
    for e in _chain(exc):
        for err in (e, getattr(e, "orig", None)):  # SQLAlchemy keeps the DBAPI error as `orig`
            if getattr(err, "pgcode", None) in _EXISTS_SQLSTATE:
                return True
            if str(getattr(err, "sqlite_errorname", "")).startswith("SQLITE_") and "already exists" in str(err):
                return True
    return False


_LEADING_JAVA_CLASS = re.compile(r"^\s*((?:[a-z_][a-z0-9_]*\.)+[A-Z][\w$]*)(?::|\s|$)")


def classify_text(text: str) -> ErrorInfo:
    """Classify an error an operator pasted (`lakehouse control explain`): a leading Java class name
    (`org.apache.iceberg.exceptions.CommitFailedException: ...`, as Java prints a throwable) is
    taken as the class, the way a live error's class is read through Py4J; no superclasses are
    known then, so only the class itself maps."""
    m = _LEADING_JAVA_CLASS.match(text)
    info = classify(RuntimeError(text))
    if m is None:
        return info
    java = m.group(1)
    code = _java_code([([java], None)])
    names = (java, java.rsplit(".", 1)[-1], *info.class_names)
    return ErrorInfo(code or info.code, java, info.message, tuple(dict.fromkeys(names)))
