"""The JSON report's schema (``report.schema.json``) and a small validator for it.

The validator implements the part of JSON Schema (draft 2020-12) the schema uses, and
refuses any other keyword rather than ignore it, so the schema cannot silently promise a
check that is not made: ``type`` (one or a list), ``enum``, ``required``, ``properties``,
``additionalProperties`` (a boolean or a schema), ``items``, ``minItems``, ``maxItems``,
``minimum`` and local ``$ref`` (``#/$defs/name``); ``title``, ``description``, ``$schema``,
``$id`` and ``$defs`` are annotations. No dependency beyond the standard library.

    python -m opfuse.report.schema report.json     # exit 0 when valid, else the errors
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from typing import Any

from ..kinds import KINDS

SCHEMA_FILE = "report.schema.json"

_ANNOTATIONS = {"title", "description", "$schema", "$id", "$defs"}
_KEYWORDS = {"type", "enum", "required", "properties", "additionalProperties", "items",
             "minItems", "maxItems", "minimum", "$ref"} | _ANNOTATIONS
_TYPES = {
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
}


def load_schema() -> dict[str, Any]:
    """The report schema (``opfuse/report/report.schema.json``)."""
    text = resources.files(__package__).joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    schema = json.loads(text)
    # The kinds come from their registry, not from a copy in the file.
    schema["$defs"]["kernel"]["properties"]["kind"]["enum"] = list(KINDS)
    return schema


def validate(instance: Any, schema: dict[str, Any] | None = None) -> list[str]:
    """Every violation of ``schema`` (default: the report schema) by ``instance``, as
    ``$.path: message`` lines; empty when it is valid."""
    schema = load_schema() if schema is None else schema
    errors: list[str] = []
    _check(instance, schema, schema, "$", errors)
    return errors


def _resolve(ref: str, root: dict[str, Any]) -> dict[str, Any]:
    if not ref.startswith("#/"):
        raise ValueError(f"only local $ref is supported, got {ref!r}")
    node: Any = root
    for part in ref[2:].split("/"):
        node = node[part]
    return node


def _check(value: Any, schema: dict[str, Any], root: dict[str, Any], path: str,
           errors: list[str]) -> None:
    unknown = set(schema) - _KEYWORDS
    if unknown:
        raise ValueError(f"schema at {path} uses unsupported keywords: {sorted(unknown)}")
    if "$ref" in schema:
        _check(value, _resolve(schema["$ref"], root), root, path, errors)
    if "type" in schema:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not any(_TYPES[t](value) for t in types):
            errors.append(f"{path}: expected {' or '.join(types)}, got {_type_name(value)}")
            return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        _check_object(value, schema, root, path, errors)
    elif isinstance(value, list):
        _check_array(value, schema, root, path, errors)
    elif _TYPES["number"](value) and "minimum" in schema and value < schema["minimum"]:
        errors.append(f"{path}: {value} < minimum {schema['minimum']}")


def _check_object(value: dict[str, Any], schema: dict[str, Any], root: dict[str, Any],
                  path: str, errors: list[str]) -> None:
    for key in schema.get("required", []):
        if key not in value:
            errors.append(f"{path}: missing required key '{key}'")
    props = schema.get("properties", {})
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = f"{path}.{key}"
        if key in props:
            _check(item, props[key], root, where, errors)
        elif extra is False:
            errors.append(f"{path}: unexpected key '{key}'")
        elif isinstance(extra, dict):
            _check(item, extra, root, where, errors)


def _check_array(value: list[Any], schema: dict[str, Any], root: dict[str, Any], path: str,
                 errors: list[str]) -> None:
    if "minItems" in schema and len(value) < schema["minItems"]:
        errors.append(f"{path}: {len(value)} items < minItems {schema['minItems']}")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        errors.append(f"{path}: {len(value)} items > maxItems {schema['maxItems']}")
    if "items" in schema:
        for i, item in enumerate(value):
            _check(item, schema["items"], root, f"{path}[{i}]", errors)


def _type_name(value: Any) -> str:
    for name, test in _TYPES.items():
        if name != "number" and test(value):
            return name
    return "number" if _TYPES["number"](value) else type(value).__name__


def main(argv: list[str] | None = None) -> int:
    """Validate report files (a report, or a list of them as --split-input-file writes)."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        print("usage: python -m opfuse.report.schema REPORT.json ...", file=sys.stderr)
        return 1
    status = 0
    for name in argv:
        with open(name, encoding="utf-8") as f:
            doc = json.load(f)
        for i, report in enumerate(doc if isinstance(doc, list) else [doc]):
            for line in validate(report):
                status = 1
                print(f"{name}[{i}]: {line}" if isinstance(doc, list) else f"{name}: {line}")
    return status


if __name__ == "__main__":
    sys.exit(main())
