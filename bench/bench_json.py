# SPDX-License-Identifier: Apache-2.0
"""The "schema" field of the JSON the bench scripts write, as every ckpt program writes it
(apps/common/json_output.hpp): the first field of the top-level object, "NAME/VERSION", where
NAME is the program (and ".COMMAND" for a program with several outputs) and VERSION changes
when a field is removed or changes meaning, never when one is added (docs/json-output.md).
"""

SCHEMA_FIELD = "schema"


def schema_id(name, version):
    return f"{name}/{version}"


def with_schema(name, version, body):
    """body with "schema": "NAME/VERSION" as its first field."""
    out = {SCHEMA_FIELD: schema_id(name, version)}
    out.update((k, v) for k, v in body.items() if k != SCHEMA_FIELD)
    return out


def check_schema(doc, name, version, path):
    """Refuses a document that is not NAME/VERSION, naming the file and both schemas: figures
    read under another format's meaning would be wrong without a word."""
    got = doc.get(SCHEMA_FIELD) if isinstance(doc, dict) else None
    if got != schema_id(name, version):
        raise SystemExit(f"{path}: schema {got!r}, expected {schema_id(name, version)!r}")
    return doc
