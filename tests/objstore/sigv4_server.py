#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A loopback S3 that checks every request's AWS Signature V4, written from the AWS
specification with hmac and hashlib alone (no code shared with ckpt, which signs through
libcurl), and a container credentials endpoint that hands out short-lived credentials.

  sigv4_server.py serve --port-file F [--ttl S] [--static ID:SECRET[:TOKEN]] [--auth TOKEN]
  sigv4_server.py fetch URL [--auth TOKEN]      print URL's answer (a credential_process)

serve: objects live in memory (PUT, GET, HEAD, DELETE, and list-type=2 listings). A request
is answered 403 unless its Authorization header is a SigV4 signature, by a known access key,
of the canonical request rebuilt here, whose signed headers include host, x-amz-date and
x-amz-content-sha256 (which must be the payload's SHA-256), and, for a key issued with a
session token, x-amz-security-token carrying that token; a key whose Expiration has passed
is refused (ExpiredToken). Keys: --static ones (never expire) and those GET /_creds hands
out (a fresh key, secret and token each time, expiring --ttl seconds later; Authorization
must equal --auth when given; ?format=process answers a credential_process's JSON).
GET /_stats answers counters: issued, accepted, rejected, min_remaining_ms (the least
lifetime left of a key when a request signed with it arrived), tokens (requests signed with
a token), last_rejection; GET /_issued every secret key and token handed out; GET /_garbage
answers 200 with HTML. The port it listens on is written to --port-file.
"""
import argparse
import datetime
import hashlib
import hmac
import json
import secrets
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
KEYS = {}  # access key id -> (secret, token or None, expiration epoch or None)
OBJECTS = {}  # "/bucket/key" -> bytes
ISSUED = []  # every secret key and token handed out, for the test that greps for them
STATS = {"issued": 0, "accepted": 0, "rejected": 0, "min_remaining_ms": None, "tokens": 0, "last_rejection": ""}
ARGS = None


def iso(t):
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def hmac256(key, msg):
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def uri_encode(s):
    return urllib.parse.quote(s, safe="-_.~")


def canonical_query(raw):
    pairs = []
    for part in raw.split("&") if raw else []:
        k, _, v = part.partition("=")
        pairs.append((uri_encode(urllib.parse.unquote(k)), uri_encode(urllib.parse.unquote(v))))
    return "&".join(k + "=" + v for k, v in sorted(pairs))


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body=b"", headers=()):
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def refuse(self, code, why):
        with LOCK:
            STATS["rejected"] += 1
            STATS["last_rejection"] = code + ": " + why
        body = ("<?xml version=\"1.0\"?><Error><Code>%s</Code><Message>%s</Message></Error>" % (code, why)).encode()
        self.answer(403, body, [("Content-Type", "application/xml")])

    def verify(self, body):
        """None if the request is signed right, else (S3 error code, why)."""
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return ("AccessDenied", "no SigV4 Authorization header")
        fields = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 "):].split(","))
        key_id, date, region, service, terminal = fields["Credential"].split("/")
        signed = fields["SignedHeaders"].split(";")
        with LOCK:
            known = KEYS.get(key_id)
        if known is None:
            return ("InvalidAccessKeyId", "unknown access key")
        secret, token, expiration = known
        for required in ("host", "x-amz-date", "x-amz-content-sha256"):
            if required not in signed:
                return ("AccessDenied", required + " is not signed")
        if service != "s3" or terminal != "aws4_request":
            return ("AccessDenied", "bad credential scope")
        payload_hash = self.headers.get("x-amz-content-sha256", "")
        if payload_hash != hashlib.sha256(body).hexdigest():
            return ("XAmzContentSHA256Mismatch", "x-amz-content-sha256 is not the payload's SHA-256")
        amz_date = self.headers.get("x-amz-date", "")
        if not amz_date.startswith(date):
            return ("AccessDenied", "x-amz-date is not the credential scope's date")
        stamp = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
        if abs(stamp - time.time()) > 900:
            return ("RequestTimeTooSkewed", "x-amz-date is too far from now")
        sent_token = self.headers.get("x-amz-security-token")
        if token is not None:
            if "x-amz-security-token" not in signed:
                return ("AccessDenied", "x-amz-security-token is not signed")
            if sent_token != token:
                return ("InvalidToken", "the session token does not belong to the access key")
        elif sent_token is not None:
            return ("InvalidToken", "a session token for a key that has none")
        if expiration is not None:
            remaining = expiration - time.time()
            if remaining <= 0:
                return ("ExpiredToken", "the credentials expired %.3f s ago" % -remaining)
        path, _, query = self.path.partition("?")
        headers = ""
        for name in signed:
            values = self.headers.get_all(name) or []
            headers += name + ":" + ",".join(" ".join(v.split()) for v in values) + "\n"
        canonical = "\n".join([self.command, path, canonical_query(query), headers, ";".join(signed), payload_hash])
        scope = "/".join([date, region, service, terminal])
        to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
        k = hmac256(("AWS4" + secret).encode(), date)
        for part in (region, service, terminal):
            k = hmac256(k, part)
        expected = hmac.new(k, to_sign.encode(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, fields["Signature"]):
            return ("SignatureDoesNotMatch", "the signature does not match")
        with LOCK:
            STATS["accepted"] += 1
            if token is not None:
                STATS["tokens"] += 1
            if expiration is not None:
                ms = int((expiration - time.time()) * 1000)
                if STATS["min_remaining_ms"] is None or ms < STATS["min_remaining_ms"]:
                    STATS["min_remaining_ms"] = ms
        return None

    def issue(self):
        if ARGS.auth and self.headers.get("Authorization") != ARGS.auth:
            self.answer(401, b'{"message": "bad authorization token"}')
            return
        key_id = "ASIA" + secrets.token_hex(8).upper()
        secret, token = secrets.token_urlsafe(30), secrets.token_urlsafe(60)
        expiration = round(time.time() + ARGS.ttl, 6)  # to the microsecond, as the JSON says it
        with LOCK:
            KEYS[key_id] = (secret, token, expiration)
            ISSUED.extend([secret, token])
            STATS["issued"] += 1
        process = "format=process" in self.path
        doc = {"AccessKeyId": key_id, "SecretAccessKey": secret, "Expiration": iso(expiration)}
        if process:
            doc.update({"Version": 1, "SessionToken": token})
        else:
            doc.update({"Token": token, "RoleArn": "arn:aws:iam::123456789012:role/test"})
        self.answer(200, json.dumps(doc).encode(), [("Content-Type", "application/json")])

    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0") or 0))
        if self.path.startswith("/_creds"):
            return self.issue()
        if self.path == "/_stats":
            with LOCK:
                return self.answer(200, json.dumps(STATS).encode())
        if self.path == "/_issued":
            with LOCK:
                return self.answer(200, json.dumps(ISSUED).encode())
        if self.path == "/_garbage":
            return self.answer(200, b"<html>not credentials</html>")
        problem = self.verify(body)
        if problem:
            return self.refuse(*problem)
        path, _, query = self.path.partition("?")
        key = urllib.parse.unquote(path)
        if self.command == "PUT":
            with LOCK:
                OBJECTS[key] = body
            return self.answer(200, headers=[("ETag", '"%s"' % hashlib.md5(body).hexdigest())])
        if self.command == "DELETE":
            with LOCK:
                OBJECTS.pop(key, None)
            return self.answer(204)
        if self.command == "GET" and "list-type=2" in query:
            q = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
            prefix = key.rstrip("/") + "/" + q.get("prefix", "")
            with LOCK:
                items = sorted((k, v) for k, v in OBJECTS.items() if k.startswith(prefix))
            bucket_len = len(key.rstrip("/")) + 1
            xml = "<ListBucketResult><IsTruncated>false</IsTruncated><KeyCount>%d</KeyCount>" % len(items)
            for k, v in items:
                xml += "<Contents><Key>%s</Key><Size>%d</Size><ETag>&quot;%s&quot;</ETag></Contents>" % (
                    k[bucket_len:], len(v), hashlib.md5(v).hexdigest())
            xml += "</ListBucketResult>"
            return self.answer(200, xml.encode(), [("Content-Type", "application/xml")])
        with LOCK:
            data = OBJECTS.get(key)
        if data is None:
            return self.answer(404, b"<Error><Code>NoSuchKey</Code><Message>no such key</Message></Error>"
                               if self.command != "HEAD" else b"")
        etag = [("ETag", '"%s"' % hashlib.md5(data).hexdigest())]
        if self.command == "HEAD":
            return self.answer(200, headers=etag + [("Content-Length", str(len(data)))])
        rng = self.headers.get("Range")
        if rng:
            first, last = (int(x) for x in rng.split("=")[1].split("-"))
            return self.answer(206, data[first:last + 1], etag)
        return self.answer(200, data, etag)

    do_GET = do_PUT = do_HEAD = do_DELETE = do_POST = handle_any


def main():
    global ARGS
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port-file", required=True)
    s.add_argument("--ttl", type=float, default=3)
    s.add_argument("--static", action="append", default=[])
    s.add_argument("--auth", default="")
    f = sub.add_parser("fetch")
    f.add_argument("url")
    f.add_argument("--auth", default="")
    ARGS = p.parse_args()
    if ARGS.mode == "fetch":
        req = urllib.request.Request(ARGS.url, headers={"Authorization": ARGS.auth} if ARGS.auth else {})
        with urllib.request.urlopen(req, timeout=5) as r:
            sys.stdout.write(r.read().decode())
        return 0
    for spec in ARGS.static:
        parts = spec.split(":")
        KEYS[parts[0]] = (parts[1], parts[2] if len(parts) > 2 else None, None)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(ARGS.port_file + ".tmp", "w") as out:
        out.write(str(server.server_address[1]))
    import os
    os.rename(ARGS.port_file + ".tmp", ARGS.port_file)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
