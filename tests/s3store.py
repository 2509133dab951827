"""A small S3-compatible object store, the durable storage of a restartable test broker.

Tansu (the Kafka-protocol broker of the tests) keeps its log in memory
unless given an ``s3://`` storage engine; a broker meant to be killed and
restarted with its records intact needs one. No S3 server ships in the
test dependencies, so this is one: the subset of the S3 REST API that Tansu
(through Rust's ``object_store``) uses, with objects held in this process's
memory. It runs as its own process (``python -m tests.s3store --port N``),
so it outlives every restart of the broker.

Supported: bucket create (``PUT /b``) and list (``GET /``), ``ListObjectsV2``
with ``prefix``, ``delimiter``, ``max-keys`` and continuation tokens, object
``GET``/``HEAD`` (``If-None-Match`` -> 304, ``If-Match`` -> 412), ``PUT``
(``If-None-Match: *`` and ``If-Match`` conditional writes -> 412 when they
do not hold) and ``DELETE``. No authentication (it binds 127.0.0.1).
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import threading
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit
from xml.sax.saxutils import escape

_NS = "http://s3.amazonaws.com/doc/2006-03-01/"


class Store:
    """Buckets of objects: key -> (body, etag, modified time), keys kept sorted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[str, dict[str, tuple[bytes, str, float]]] = {}
        self.keys: dict[str, list[str]] = {}

    def put(self, bucket: str, key: str, body: bytes, now: float) -> str:
        etag = '"' + hashlib.md5(body).hexdigest() + '"'  # noqa: S324 (an ETag, not security)
        objects = self.buckets.setdefault(bucket, {})
        if key not in objects:
            bisect.insort(self.keys.setdefault(bucket, []), key)
        objects[key] = (body, etag, now)
        return etag

    def delete(self, bucket: str, key: str) -> None:
        if self.buckets.get(bucket, {}).pop(key, None) is not None:
            keys = self.keys[bucket]
            del keys[bisect.bisect_left(keys, key)]


class Handler(BaseHTTPRequestHandler):
    store: Store
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    """Headers and body go out in two writes; with Nagle's algorithm the second waits for
    the client's delayed ACK (about 40 ms per response), which made every fetch of the
    broker on this store take about half a second."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass  # quiet: thousands of requests per test

    def _split(self) -> tuple[str, str, dict[str, list[str]]]:
        parts = urlsplit(self.path)
        path = unquote(parts.path).lstrip("/")
        bucket, _, key = path.partition("/")
        return bucket, key, parse_qs(parts.query, keep_blank_values=True)

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    def _error(self, status: int, code: str) -> None:
        body = f"<Error><Code>{code}</Code><Message>{code}</Message></Error>".encode()
        self._send(status, body, {"Content-Type": "application/xml"})

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def do_PUT(self) -> None:  # noqa: N802
        bucket, key, _ = self._split()
        body = self._body()
        store = self.store
        with store.lock:
            if not key:
                store.buckets.setdefault(bucket, {})
                store.keys.setdefault(bucket, [])
                self._send(200)
                return
            if bucket not in store.buckets:
                self._error(404, "NoSuchBucket")
                return
            current = store.buckets[bucket].get(key)
            if self.headers.get("If-None-Match") == "*" and current is not None:
                self._error(412, "PreconditionFailed")
                return
            wanted = self.headers.get("If-Match")
            if wanted is not None and (current is None or current[1] != wanted):
                self._error(412, "PreconditionFailed")
                return
            etag = store.put(bucket, key, body, _now())
        self._send(200, headers={"ETag": etag})

    def do_DELETE(self) -> None:  # noqa: N802
        bucket, key, _ = self._split()
        with self.store.lock:
            self.store.delete(bucket, key)
        self._send(204)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        bucket, key, query = self._split()
        if not bucket:
            names = "".join(
                f"<Bucket><Name>{escape(b)}</Name><CreationDate>{_iso(0)}</CreationDate></Bucket>"
                for b in sorted(self.store.buckets)
            )
            xml = f'<ListAllMyBucketsResult xmlns="{_NS}"><Buckets>{names}</Buckets>'
            self._send(200, (xml + "</ListAllMyBucketsResult>").encode(),
                       {"Content-Type": "application/xml"})
            return
        if not key:
            self._list(bucket, query)
            return
        with self.store.lock:
            found = self.store.buckets.get(bucket, {}).get(key)
        if found is None:
            self._error(404, "NoSuchKey")
            return
        body, etag, modified = found
        headers = {"ETag": etag, "Last-Modified": formatdate(modified, usegmt=True),
                   "Content-Type": "application/octet-stream"}
        if self.headers.get("If-None-Match") == etag:
            self._send(304, headers=headers)
            return
        wanted = self.headers.get("If-Match")
        if wanted is not None and wanted != etag:
            self._error(412, "PreconditionFailed")
            return
        self._send(200, body, headers)

    def _list(self, bucket: str, query: dict[str, list[str]]) -> None:
        prefix = query.get("prefix", [""])[0]
        delimiter = query.get("delimiter", [""])[0]
        max_keys = int(query.get("max-keys", ["1000"])[0])
        after = query.get("continuation-token", query.get("start-after", [""]))[0]
        with self.store.lock:
            if bucket not in self.store.buckets:
                self._error(404, "NoSuchBucket")
                return
            keys = self.store.keys[bucket]
            objects = self.store.buckets[bucket]
            start = bisect.bisect_right(keys, after) if after else bisect.bisect_left(keys, prefix)
            contents: list[str] = []
            prefixes: list[str] = []
            last = ""
            truncated = False
            for key in keys[start:]:
                if not key.startswith(prefix):
                    break
                if len(contents) + len(prefixes) >= max_keys:
                    truncated = True
                    break
                last = key
                if delimiter:
                    cut = key.find(delimiter, len(prefix))
                    if cut >= 0:
                        common = key[: cut + len(delimiter)]
                        if not prefixes or prefixes[-1] != common:
                            prefixes.append(common)
                        continue
                body, etag, modified = objects[key]
                contents.append(
                    f"<Contents><Key>{escape(key)}</Key><LastModified>{_iso(modified)}"
                    f"</LastModified><ETag>{escape(etag)}</ETag><Size>{len(body)}</Size>"
                    "<StorageClass>STANDARD</StorageClass></Contents>"
                )
        common = "".join(
            f"<CommonPrefixes><Prefix>{escape(p)}</Prefix></CommonPrefixes>" for p in prefixes
        )
        token = ""
        if truncated:
            token = f"<NextContinuationToken>{escape(last)}</NextContinuationToken>"
        xml = (
            f'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult xmlns="{_NS}">'
            f"<Name>{escape(bucket)}</Name><Prefix>{escape(prefix)}</Prefix>"
            f"<KeyCount>{len(contents) + len(prefixes)}</KeyCount><MaxKeys>{max_keys}</MaxKeys>"
            f"<IsTruncated>{'true' if truncated else 'false'}</IsTruncated>{token}"
            f"{''.join(contents)}{common}</ListBucketResult>"
        )
        self._send(200, xml.encode(), {"Content-Type": "application/xml"})


def _now() -> float:
    import time

    return time.time()


def _iso(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(ts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    Handler.store = Store()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
