"""Audit docoutbox collections with PySpark.

- :mod:`docoutbox_spark.schema`: the explicit document schema and its raw reading form;
- :mod:`docoutbox_spark.readers`: the MongoDB Spark connector, the pymongo data source
  (:mod:`docoutbox_spark.datasource`), the Cosmos DB data source
  (:mod:`docoutbox_spark.cosmos_source`) and Parquet snapshots;
- :mod:`docoutbox_spark.stored`: raw rows with values a store codec encoded decoded, and
  old versions upcast (the audit itself needs neither);
- :mod:`docoutbox_spark.conform`: typed frames, with malformed documents as findings;
- :mod:`docoutbox_spark.sqltext`: the SQL text the audit's expressions are built as;
- :mod:`docoutbox_spark.audit`: the audit functions (DataFrame in, DataFrame out);
- :mod:`docoutbox_spark.spilled`: spilled inbox IDs folded back for reconciliation;
- :mod:`docoutbox_spark.run` and :mod:`docoutbox_spark.report`: the summary, its JSON and
  the offline HTML report. The commands ``docoutbox audit``/``export`` are in the
  application ring (:mod:`docoutbox_app.cli.spark`).
"""

from docoutbox_spark.schema import DEAD_LETTER_SCHEMA, DOCUMENT_SCHEMA, ENTRY_SCHEMA

__all__ = ["DEAD_LETTER_SCHEMA", "DOCUMENT_SCHEMA", "ENTRY_SCHEMA"]
