"""``DataFrame.toPandas()`` for the small results the driver reads every micro-batch
(a window's changed rows): the same frame, for a third of the driver's CPU.

PySpark's ``toPandas`` turns each Arrow column into a pandas Series on its own, runs a
converter over every column and concatenates them: 7.5 ms of the driver's CPU for
128 rows of 14 columns, measured (docs/spark.md, "What exactness costs"). Here the
Arrow table becomes one DataFrame in one call, and PySpark's own converter runs only on
the columns whose pandas form is not already Arrow's (timestamps, dates, intervals,
nested types): 2.7 ms. The frame is the one ``toPandas`` returns, dtypes included
(tests/spark/test_collect.py compares them over every Spark type).
"""

from __future__ import annotations

from typing import Any

#: Spark types whose Series from Arrow is what ``toPandas`` returns (its converter
#: leaves them as they are: an integral or boolean column with nulls is float64 or
#: object from Arrow already)
_AS_ARROW = ("LongType", "IntegerType", "ShortType", "ByteType", "DoubleType",
             "FloatType", "StringType", "BooleanType", "DecimalType", "BinaryType")
_CONFS = ("spark.sql.session.timeZone", "spark.sql.execution.pandas.structHandlingMode")


def collect_pandas(df: Any) -> Any:
    """``df.toPandas()`` (a batch DataFrame, collected through Arrow)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import _create_converter_to_pandas, to_arrow_schema

    schema = df.schema
    batches = df._collect_as_arrow()
    table = (pa.Table.from_batches(batches) if batches
             else to_arrow_schema(schema, timezone="UTC").empty_table())
    names = [f"col_{i}" for i in range(len(schema.fields))]  # names may repeat
    pdf = table.rename_columns(names).to_pandas(coerce_temporal_nanoseconds=True,
                                                date_as_object=True)
    converted = [(name, f) for name, f in zip(names, schema.fields, strict=True)
                 if type(f.dataType).__name__ not in _AS_ARROW]
    if converted:
        timezone, structs = df.sparkSession._jconf.getConfs(list(_CONFS))
        duplicates = structs == "legacy"  # as toPandas: dicts, refusing repeated names
        for name, f in converted:
            convert = _create_converter_to_pandas(
                f.dataType, f.nullable, timezone=timezone,
                struct_in_pandas="dict" if duplicates else structs,
                error_on_duplicated_field_names=duplicates)
            pdf[name] = convert(pdf[name])
    pdf.columns = schema.names
    return pdf
