"""Decoders of the data bytes for the ingest job: functions (DataFrame, options) -> DataFrame."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

Decoder = Callable[[Any, Mapping[str, str]], Any]
"""Takes the source DataFrame and the --decoder-option values, returns the DataFrame to land."""

META_COLUMNS = ("partition", "transaction_id", "header", "client_id", "generation", "seq_num")


def raw(df: Any, options: Mapping[str, str]) -> Any:
    """The feed as it is: the data column stays binary."""
    return df


def json_columns(df: Any, options: Mapping[str, str]) -> Any:
    """Data as a UTF-8 JSON object, its fields as columns of the DDL schema in option `schema`.

    Options: `schema` (required, e.g. "id LONG, name STRING"), `mode` (PERMISSIVE, the default, gives
    nulls for malformed data; FAILFAST fails the batch), `keepData` ("true" keeps the raw bytes too).
    """
    from pyspark.sql import functions as F

    schema = options.get("schema")
    if not schema:
        raise ValueError('the json_columns decoder needs --decoder-option schema="<DDL>", e.g. "id LONG, name STRING"')
    mode = options.get("mode", "PERMISSIVE").upper()
    keep = options.get("keepData", "false").lower() == "true"
    parsed = F.from_json(F.col("data").cast("string"), schema, {"mode": mode}).alias("_value")
    extra = ["data"] if keep else []
    return df.select(*META_COLUMNS, *extra, parsed).select(*META_COLUMNS, *extra, "_value.*")


def load_decoder(spec: str) -> Decoder:
    """The function named by "module:function" (a ValueError that says why when it cannot be loaded)."""
    module_name, sep, function_name = spec.partition(":")
    if not sep or not module_name or not function_name:
        raise ValueError(f"--decoder must be module:function, e.g. waltz_spark.decoders:json_columns, not {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--decoder {spec}: cannot import {module_name}: {exc}") from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"--decoder {spec}: {module_name} has no function {function_name}")
    decoder: Decoder = function
    return decoder
