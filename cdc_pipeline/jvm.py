"""What the Spark JVMs the project starts need in their environment, and where a Spark Connect
server listens (no Spark imported here)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlparse

UTF8_LOCALE = {"LC_ALL": "C.UTF-8"}  # built into Debian and most images
CONNECT_DEFAULT_PORT = 15002
# The Connect server's heap when CDC_SPARK_DRIVER_MEMORY sets none. It serves every run of every
# table while it is up and keeps what they leave cached (compiled code, Delta logs, Spark's
# status store): 150-420 MB live after one to six cycles of 65 tables (after a full GC; not
# growing past that). On Spark's default 1g its old generation was full after four cycles and
# the collector took a quarter of the server's CPU; a steady 65-table cycle took 12% less time
# at 2g (docs/performance-log.md, "Where a steady cycle's CPU goes").
CONNECT_SERVER_MEMORY = "2g"


def utf8_locale(environment: Mapping[str, str]) -> dict[str, str]:
    """What to add to a JVM's environment so that it reads file names as UTF-8.

    The JVM takes its file name encoding from the locale it starts in (JDK 17 ignores
    -Dsun.jnu.encoding): under LC_ALL=C a landed `ünï.json` was "not found", while Python lists
    it as UTF-8. Empty when the locale is UTF-8 already."""
    for name in ("LC_ALL", "LC_CTYPE", "LANG"):
        value = environment.get(name)
        if value:
            return {} if "utf-8" in value.lower() or "utf8" in value.lower() else UTF8_LOCALE
    return UTF8_LOCALE


def connect_address(url: str) -> tuple[str, int]:
    """(host, port) of a Spark Connect URL (`sc://host:port/;params`); port 15002 by default."""
    parsed = urlparse(url)
    if parsed.scheme != "sc" or not parsed.hostname:
        raise ValueError(f"not a Spark Connect URL: {url!r} (expected sc://HOST:PORT)")
    return parsed.hostname, parsed.port or CONNECT_DEFAULT_PORT
