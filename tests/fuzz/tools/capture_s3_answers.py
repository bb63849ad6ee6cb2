#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Captures real S3 answers for the fuzz_s3_xml seed corpus (tests/fuzz/corpus/s3_xml/rgw_*).

    scripts/rgw start DIR
    tests/fuzz/tools/capture_s3_answers.py DIR tests/fuzz/corpus/s3_xml
    scripts/rgw stop DIR

Stores a few objects under the prefix fz/ (keys with XML's special characters, non-ASCII
and spaces among them) and starts a multipart upload, then saves the bodies of the answers
the S3 client parses: ListObjectsV2 (a truncated page with its continuation token, the last
page), ListMultipartUploads, InitiateMultipartUpload, CompleteMultipartUpload, and error
bodies (NoSuchKey, PreconditionFailed, NoSuchBucket, and what the RGW answers a completion of
an upload id it never gave). The requests are signed by the curl tool (--aws-sigv4), as
tests/objstore/test_s3_hostile.cpp does.
"""
import hashlib
import os
import subprocess
import sys
import urllib.parse

PREFIX = "fz/"
KEYS = ["latest", "step-0000000010/manifest.json", "step-0000000010/rank-00000-of-00002.safetensors",
        "step-0000000010/a&b <c> \"q\" 'x'.bin", "step-0000000010/\u00fcn\u00efc\u00f8de space.bin"]


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    env = {}
    with open(os.path.join(sys.argv[1], "env")) as f:
        for line in f:
            name, _, value = line.strip().removeprefix("export ").partition("=")
            env[name] = value
    out = sys.argv[2]
    os.makedirs(out, exist_ok=True)
    endpoint, bucket = env["AWS_ENDPOINT_URL"], env["CKPT_S3_BUCKET"]

    def request(method, key, query="", body=b"", headers=(), bucket_name=bucket):
        url = endpoint + "/" + bucket_name + "/" + urllib.parse.quote(key, safe="/~") + ("?" + query if query else "")
        cmd = ["curl", "-s", "-X", method, "--aws-sigv4", "aws:amz:" + env["AWS_REGION"] + ":s3", "--user",
               env["AWS_ACCESS_KEY_ID"] + ":" + env["AWS_SECRET_ACCESS_KEY"], "-H",
               "x-amz-content-sha256: " + hashlib.sha256(body).hexdigest(), url]
        if method in ("PUT", "POST"):
            cmd += ["--data-binary", "@-"]
        for h in headers:
            cmd += ["-H", h]
        return subprocess.run(cmd, input=body, capture_output=True, check=True).stdout

    def save(name, answer):
        with open(os.path.join(out, "rgw_" + name), "wb") as f:
            f.write(answer)
        print(f"rgw_{name}: {len(answer)} bytes")

    for k in KEYS:
        request("PUT", PREFIX + k, body=b"x" * 3)
    save("list_objects_truncated", request("GET", "", "list-type=2&max-keys=2&prefix=" + urllib.parse.quote(PREFIX, safe="")))
    save("list_objects_last_page", request("GET", "", "list-type=2&max-keys=1000&prefix=" +
                                           urllib.parse.quote(PREFIX + "step-0000000010/", safe="")))
    initiated = request("POST", PREFIX + "step-0000000020/rank-00000-of-00002.safetensors", "uploads=")
    save("initiate_multipart", initiated)
    save("list_uploads", request("GET", "", "max-uploads=1000&prefix=" + urllib.parse.quote(PREFIX, safe="") + "&uploads="))
    save("error_no_such_key", request("GET", PREFIX + "missing"))
    save("error_precondition_failed", request("PUT", PREFIX + "latest", body=b"y", headers=["If-None-Match: *"]))
    save("error_complete_unknown_upload", request("POST", PREFIX + "step-0000000020/x", "uploadId=nosuchupload",
                                         body=b"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>\"e\"</ETag></Part>"
                                              b"</CompleteMultipartUpload>"))
    save("error_no_such_bucket", request("GET", "", "list-type=2&max-keys=10&prefix=", bucket_name="no-such-bucket-fz"))
    # A multipart upload completed: the CompleteMultipartUpload answer.
    started = request("POST", PREFIX + "step-0000000030/whole", "uploads=")
    uid = started.split(b"<UploadId>")[1].split(b"</UploadId>")[0].decode()
    request("PUT", PREFIX + "step-0000000030/whole", "partNumber=1&uploadId=" + urllib.parse.quote(uid, safe=""), body=b"w" * 7)
    etag = hashlib.md5(b"w" * 7).hexdigest()
    complete = f'<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>"{etag}"</ETag></Part></CompleteMultipartUpload>'
    save("complete_multipart", request("POST", PREFIX + "step-0000000030/whole", "uploadId=" + urllib.parse.quote(uid, safe=""),
                                       body=complete.encode()))


if __name__ == "__main__":
    main()
