"""Errors with a one-line message meant for the person running the command."""


class CdcError(Exception):
    """Base of every error the `cdc` command reports as one line with a non-zero exit."""


class ConfigError(CdcError):
    """A config row (or the config file) is not valid; the message names table and field."""


class InputError(CdcError):
    """Landed change files cannot be read as the config row declares."""


class ConcurrentWriteError(CdcError):
    """Other writers kept committing to the same Delta table; running the step again fixes it."""


class UsageError(CdcError):
    """A command line argument is not valid."""


class TableDamagedError(CdcError):
    """A Delta table's log cannot be read (a corrupt or truncated commit): permanent, no retry
    helps; the message names the table's path and the fix."""


class SparkUnavailableError(CdcError):
    """The Spark Connect server does not answer (down, or stopped mid-step): transient, a retry
    of the step (Airflow's) may succeed; the message names the URL. `reason` is why, in a few
    words (the socket's), for a caller that names the server its own way."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


class SourceUnavailableError(CdcError):
    """A change source (a Kafka broker) does not answer: transient, a retry may succeed; the
    message names the servers and what failed."""


class LostMessagesError(CdcError):
    """Messages a table had not staged are gone from their source (Kafka retention deleted
    them): permanent, a retry reads the same gap; the message names the lost offsets and the
    choice (accept_lost_offsets, or a re-snapshot of the source)."""


# Errors a retry cannot fix: a step fails once with them (Airflow: no retry).
PERMANENT_ERRORS: tuple[type[CdcError], ...] = (
    ConfigError,
    UsageError,
    TableDamagedError,
    LostMessagesError,
)
