"""moto's S3 server with its conditional writes made atomic, for the object-storage tests.

moto answers `If-None-Match: *` by looking the key up and then storing the object, two steps of
a threaded server: two writers of the same Delta commit file at once could both pass the look-up
and the second overwrite the first's commit (a lost version: seen once in a full `make test`,
`test_concurrent_delta_rs_writers_on_s3_commit_exactly_once` ended at 31 versions of 32). AWS
S3 makes the check and the write one step; this server does too, by holding one lock over an
object's PUT and over a multipart upload's completion. Run with moto's own Python (.tools/moto,
`tests/s3.py` starts it); the arguments are moto_server's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from moto.s3.responses import S3Response
from moto.server import main

_WRITES = threading.Lock()


def _one_at_a_time(method: Callable[..., Any]) -> Callable[..., Any]:
    def serialized(self: Any, *args: Any, **kwargs: Any) -> Any:
        with _WRITES:
            return method(self, *args, **kwargs)

    return serialized


S3Response.put_object = _one_at_a_time(S3Response.put_object)  # type: ignore[method-assign]
# A multipart upload's completion (POST ?uploadId=...) checks If-None-Match the same way.
S3Response._key_response_post = _one_at_a_time(S3Response._key_response_post)  # type: ignore[method-assign]

if __name__ == "__main__":
    main()
