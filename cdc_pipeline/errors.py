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
    helps; the message names the table's path and the fix. `where` is the damaged commit
    (`version 3, _delta_log/00000000000000000003.json`, or `its log (_delta_log)` when no
    commit file is named) and `cause` delta-rs' own first line, for a caller that words the
    damage its own way (`cdc repair`)."""

    def __init__(self, message: str, *, where: str = "", cause: str = "") -> None:
        super().__init__(message)
        self.where = where
        self.cause = cause


# The tables of a table's folder that `cdc repair` rebuilds: final from staging and the
# remembered deletes, history from its log, applied by applying every staged change again.
REPAIRABLE_TABLES = ("final", "history", "applied")


def damaged_table_fix(folder: str, table: str) -> str:
    """What to do about a damaged Delta table named `folder` (final, staging, ...) of `table`."""
    if folder == "leases":
        return (
            f"delete the folder leases of table {table} while no optimize or reset-staging of it "
            "runs: it holds no rows, only which of them runs"
        )
    if folder in REPAIRABLE_TABLES:
        return (
            f"restore that commit file from a backup, or rebuild it with `cdc repair {table}` "
            "(docs/operations.md, Damaged tables)"
        )
    return (
        "restore that commit file from a backup (docs/operations.md, Damaged tables, tells how "
        "to rebuild the table instead)"
    )


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
