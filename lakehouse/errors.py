"""Platform error codes: one vocabulary for healing rules, retries and the audit log.

Spark hands Python errors from the JVM as Py4J / captured exceptions whose *text* carries the
Java class (`org.apache.iceberg.exceptions.CommitFailedException: ...`), so classification looks
at the Python class chain first and then at the message. A healing rule can match on the code
(`error_code: ICEBERG_COMMIT_CONFLICT`), on a class name, or on a regex over the message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
UNKNOWN = "UNKNOWN"

#: Codes whose failures are decisions or mistakes, not faults: never healed, never retried. A
#: database still down after the outage window (lakehouse.outage) was already retried for that long.
NOT_RETRYABLE = frozenset({STAGE_DISABLED, AUDIT_FAILED, CONFIGURATION, DATABASE_UNAVAILABLE})

# (code, class names anywhere in the MRO, message patterns). First match wins, so the more
# specific codes come first (a corrupt parquet footer is also an IOException).
_RULES: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    (STAGE_DISABLED, ("StageDisabled",), ()),
    (AUDIT_FAILED, ("AuditFailed",), ()),
    (CONFIGURATION, ("ConfigurationError", "MetadataError", "SqlParseError", "RuleError"), ()),
    (STEP_TIMEOUT, ("StepTimeout",), (r"cancelled part of cancelled job group",)),
    (ICEBERG_COMMIT_CONFLICT, ("CommitFailedException", "CommitConflict"), (
        r"CommitFailedException",
        r"Cannot commit .*(?:metadata location|changed|conflict)",
        r"Cannot fast-forward",
        r"CommitStateUnknownException",
    )),
    (OUT_OF_MEMORY, ("MemoryError", "OutOfMemory"), (
        r"java\.lang\.OutOfMemoryError",
        r"GC overhead limit exceeded",
        r"Java heap space",
        r"Container killed .* memory",
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
        r"can not read class org\.apache\.parquet",
        r"EOFException",
        r"Parquet column cannot be converted",  # one file's column has another type than the batch's
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
    (JVM_ERROR, ("StackOverflowError", "VirtualMachineError"), (
        r"java\.lang\.(?:StackOverflowError|InternalError|VirtualMachineError)",
        r"ExecutorLostFailure",
        r"Executor heartbeat timed out",
        r"Remote RPC client disassociated",
    )),
    (SPARK_SESSION_DEAD, (), (
        r"SparkContext (?:was|has been) shut down",
        r"Cannot call methods on a stopped SparkContext",
        r"Py4JNetworkError",
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


class PlatformError(RuntimeError):
    """An error the platform raises itself, already carrying its code."""

    code = UNKNOWN


class SourceUnavailable(PlatformError):
    code = SOURCE_UNAVAILABLE


class CorruptInput(PlatformError):
    code = CORRUPT_INPUT


class TransientIO(PlatformError):
    code = TRANSIENT_IO


class ConfigurationError(PlatformError):
    """Metadata that cannot work as written (a rule on a missing column, a DROP as stage SQL...):
    terminal, because the same step would fail the same way on every retry."""

    code = CONFIGURATION


class StepTimeout(PlatformError):
    """A step's Spark work ran past its timeout and was cancelled (lakehouse.control.deadline)."""

    code = STEP_TIMEOUT


class DatabaseUnavailable(PlatformError):
    """The control DB or the catalog database stayed unreachable past the outage window."""

    code = DATABASE_UNAVAILABLE


@dataclass(frozen=True)
class ErrorInfo:
    code: str
    error_class: str  # the most specific class name: the Java one when Spark wrapped it
    message: str
    class_names: tuple[str, ...]  # Python MRO names plus Java class names found in the text

    @property
    def retryable(self) -> bool:
        return self.code not in NOT_RETRYABLE


#: JVM errors that say more than the exception wrapping them: reported as the error's class.
_FATAL_JVM = ("java.lang.StackOverflowError", "java.lang.OutOfMemoryError", "java.lang.InternalError")
_JAVA_CLASS = re.compile(r"\b((?:[a-z_][a-z0-9_]*\.)+[A-Z][A-Za-z0-9_$]*(?:Exception|Error))\b")


def _chain(exc: BaseException) -> list[BaseException]:
    seen, out, cur = set(), [], exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def classify(exc: BaseException) -> ErrorInfo:
    """Code, class and message of an exception (and of the exceptions it wraps)."""
    chain = _chain(exc)
    names: list[str] = []
    for e in chain:
        names.extend(c.__name__ for c in type(e).__mro__ if c not in (object, BaseException, Exception))
    text = "\n".join(f"{type(e).__name__}: {e}" for e in chain)
    java = [m.group(1) for m in _JAVA_CLASS.finditer(text)]
    names.extend(java)
    names.extend(j.rsplit(".", 1)[-1] for j in java)
    code = next((getattr(e, "code", None) for e in chain if isinstance(e, PlatformError)), None)
    if code is None:
        for c, classes, patterns in _RULES:
            if any(any(cls in n for n in names) for cls in classes) or any(
                re.search(p, text, re.I if c != TRANSIENT_IO else 0) for p in patterns
            ):
                code = c
                break
    message = str(exc) or type(exc).__name__
    error_class = next((j for j in java if j in _FATAL_JVM), java[0]) if java else type(exc).__name__
    return ErrorInfo(code or UNKNOWN, error_class, message[:4000], tuple(dict.fromkeys(names)))
