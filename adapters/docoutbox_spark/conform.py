"""Apply the typed schema to raw rows; every mismatch becomes a finding, nothing is dropped.

``conform(raw)`` returns the documents (typed top-level fields), their outbox entries (one
row per array element, typed) and the ``malformed`` findings. A document with problems
stays in the documents frame, so it counts; its unusable fields are null. An entry with
problems stays in the entries frame with its problems listed; each audit uses the entries
whose fields it needs.

Numbers, booleans and dates arrive as text from every reader, so a number stored as a
numeric string (``"5"``) reads as the number; anything that does not parse is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from docoutbox.stored.codec import PREFIX
from docoutbox_spark.schema import SIZE_FIELD

FINDING_COLUMNS = ("kind", "aggregate_id", "entry_id", "detail")
#: How an encoded stored value begins.
ENCODED = f"{PREFIX}:"


@dataclass(frozen=True)
class Conformed:
    documents: DataFrame
    entries: DataFrame
    malformed: DataFrame
    #: The persisted frames (``conform(raw, persist=...)``): the typed documents.
    persisted: tuple[DataFrame, ...] = ()

    def unpersist(self) -> None:
        for frame in self.persisted:
            frame.unpersist()


def _is_array(raw: Column) -> Column:
    return F.ltrim(raw).startswith("[")


def _array(raw: Column) -> Column:
    return F.when(_is_array(raw), F.from_json(raw, "array<string>"))


def _long(raw: Column) -> Column:
    return raw.try_cast("bigint")


def _ts(raw: Column) -> Column:
    return raw.try_cast("timestamp")


def _problem(condition: Column, text: str) -> Column:
    return F.when(condition, F.lit(text))


def _required_long(raw: Column, name: str) -> list[Column]:
    return [
        _problem(raw.isNull(), f"{name}: missing"),
        _problem(raw.isNotNull() & _long(raw).isNull(), f"{name}: not an integer"),
    ]


def _optional_long(raw: Column, name: str) -> Column:
    return _problem(raw.isNotNull() & _long(raw).isNull(), f"{name}: not an integer")


def _optional_array(raw: Column, name: str) -> Column:
    return _problem(raw.isNotNull() & _array(raw).isNull(), f"{name}: not an array")


def _optional_ts(raw: Column, name: str) -> Column:
    return _problem(raw.isNotNull() & _ts(raw).isNull(), f"{name}: not a date")


def _object(raw: Column) -> Column:
    return F.ltrim(raw).startswith("{")


def _value(raw: Column) -> Column:
    """A stored value: a JSON object, or a value a store codec encoded (``dx1:...``,
    :mod:`docoutbox.stored`), which the audit never needs to read."""
    return _object(raw) | raw.startswith(ENCODED)


_ENTRY_RAW = (
    "struct<id:string,type:string,payload:string,headers:string,created_at:string,"
    "seq:string,aggregate_id:string,aggregate_type:string,correlation_id:string,"
    "causation_id:string,destination:string,attempts:string,last_error:string,due:string,"
    "claim:string>"
)
_MARK_RAW = "struct<source:string,hw:string,above:string>"


def conform(raw: DataFrame, persist: StorageLevel | None = None, *, read: bool = True) -> Conformed:
    """Split raw document rows (:data:`~docoutbox_spark.schema.RAW_DOCUMENT_SCHEMA`).

    Each outbox entry is parsed once, into the documents' typed entries (``_entries``),
    which the entries frame explodes: nothing downstream parses JSON again, so a filter on
    an entry field pushed below the explode cannot repeat the parse. With ``persist``, the
    typed documents (entries included) are persisted at that level and read at once (one
    Spark job), so the source is read once whatever is computed from the three frames
    afterwards; call :meth:`Conformed.unpersist` when done. ``read=False`` leaves the
    reading to the caller, who may fill several caches in one job. ``documents`` carries
    ``seqs``, the ``seq`` of each readable outbox entry (positive integers only), for
    per-document checks that need no shuffle."""
    raw_cols = [c for c in raw.columns if c != SIZE_FIELD]
    estimate = sum(
        (F.coalesce(F.octet_length(F.col(c)), F.lit(0)) + F.lit(len(c) + 2) for c in raw_cols),
        F.lit(5),
    )
    marks_raw = F.transform(_array(F.col("inbox_marks")), lambda m: F.from_json(m, _MARK_RAW))
    bad_mark = F.exists(
        marks_raw,
        lambda m: (
            m.isNull()
            | m["source"].isNull()
            | _long(m["hw"]).isNull()
            | (m["above"].isNotNull() & _array(m["above"]).isNull())
        ),
    )
    problems = F.array_compact(
        F.array(
            _problem(F.col("type").isNull(), "type: missing"),
            *_required_long(F.col("version"), "version"),
            _optional_long(F.col("partition"), "partition"),
            _problem(F.col("outbox").isNull(), "outbox: missing"),
            _problem(
                F.col("outbox").isNotNull() & _array(F.col("outbox")).isNull(),
                "outbox: not an array",
            ),
            *_required_long(F.col("outbox_seq"), "outbox_seq"),
            _optional_array(F.col("inbox"), "inbox"),
            _optional_array(F.col("inbox_marks"), "inbox_marks"),
            _problem(
                F.coalesce(bad_mark, F.lit(False)),
                "inbox_marks: an element is not {source, hw, above}",
            ),
            _optional_ts(F.col("created_at"), "created_at"),
            _optional_ts(F.col("updated_at"), "updated_at"),
        )
    )
    marks = F.transform(
        marks_raw,
        lambda m: F.struct(
            m["source"].alias("source"),
            _long(m["hw"]).alias("hw"),
            F.transform(_array(m["above"]), lambda a: _long(a)).alias("above"),
        ),
    )
    outbox = _array(F.col("outbox"))
    parsed = raw.select(
        "*",
        F.transform(
            outbox,
            lambda r: F.struct(
                r.alias("raw"), F.when(_object(r), F.from_json(r, _ENTRY_RAW)).alias("e")
            ),
        ).alias("_parsed"),
    )
    typed = F.transform(F.col("_parsed"), _typed_entry)
    base = parsed.select(
        F.col("_id").alias("aggregate_id"),
        F.col("type"),
        _long(F.col("version")).alias("version"),
        F.coalesce(_long(F.col("partition")), F.lit(0)).alias("partition"),
        _array(F.col("inbox")).alias("inbox"),
        marks.alias("inbox_marks"),
        _long(F.col("outbox_seq")).alias("outbox_seq"),
        _ts(F.col("created_at")).alias("created_at"),
        _ts(F.col("updated_at")).alias("updated_at"),
        F.coalesce(F.col(SIZE_FIELD), estimate).alias("size_bytes"),
        F.col(SIZE_FIELD).isNotNull().alias("size_exact"),
        typed.alias("_entries"),
        F.coalesce(F.size("_parsed"), F.lit(0)).alias("pending"),
        problems.alias("problems"),
    )
    # Each entry's seq from the typed entries (their positive seqs), in a projection of
    # its own so that the entries are parsed once per document.
    base = base.select(
        *[c for c in base.columns if c != "problems"],
        F.coalesce(
            F.filter(F.transform("_entries", lambda x: x["seq"]), lambda q: q.isNotNull()),
            F.array().cast("array<bigint>"),
        ).alias("seqs"),
        "problems",
    )
    if persist is not None:
        base = base.persist(persist)
        if read:
            base.write.format("noop").mode("overwrite").save()  # read it now, once
    documents = base.drop("_entries")
    entries = _entries(base)
    malformed = documents.where(F.size("problems") > 0).select(
        F.lit("malformed").alias("kind"),
        F.col("aggregate_id"),
        F.lit(None).cast("string").alias("entry_id"),
        F.array_join("problems", "; ").alias("detail"),
    )
    bad_entries = entries.where(F.size("problems") > 0).select(
        F.lit("malformed").alias("kind"),
        F.col("aggregate_id"),
        F.col("id").alias("entry_id"),
        F.concat(
            F.lit("outbox["),
            F.col("position").cast("string"),
            F.lit("]: "),
            F.array_join("problems", "; "),
        ).alias("detail"),
    )
    return Conformed(
        documents,
        entries,
        malformed.unionByName(bad_entries),
        (base,) if persist is not None else (),
    )


def _typed_entry(x: Column, position: Column) -> Column:
    """One outbox entry (``x``: its raw JSON text and its parse) with typed fields and its
    problems."""
    f = x["e"]

    def req(name: str) -> Column:
        return _problem(f.isNotNull() & f[name].isNull(), f"{name}: missing")

    problems = F.array_compact(
        F.array(
            _problem(f.isNull(), "not an object"),
            req("id"),
            req("type"),
            # A claim-checked entry keeps a reference (``claim``) instead of its payload.
            _problem(
                f.isNotNull() & f["payload"].isNull() & f["claim"].isNull(), "payload: missing"
            ),
            _problem(f["payload"].isNotNull() & ~_value(f["payload"]), "payload: not an object"),
            _problem(f["headers"].isNotNull() & ~_value(f["headers"]), "headers: not an object"),
            req("created_at"),
            _problem(
                f["created_at"].isNotNull() & _ts(f["created_at"]).isNull(),
                "created_at: not a date",
            ),
            _problem(f["due"].isNotNull() & _ts(f["due"]).isNull(), "due: not a date"),
            # A scheduled entry has no seq until the dispatcher releases it.
            _problem(f.isNotNull() & f["seq"].isNull() & f["due"].isNull(), "seq: missing"),
            _problem(
                f["seq"].isNotNull() & F.coalesce(_long(f["seq"]) < 1, F.lit(True)),
                "seq: not a positive integer",
            ),
            req("aggregate_id"),
            req("aggregate_type"),
            _problem(
                f["attempts"].isNotNull() & _long(f["attempts"]).isNull(),
                "attempts: not an integer",
            ),
        )
    )
    seq = _long(f["seq"])
    return F.struct(
        position.cast("int").alias("position"),
        f["id"].alias("id"),
        f["type"].alias("type"),
        f["destination"].alias("destination"),
        f["payload"].alias("payload"),
        f["headers"].alias("headers"),
        _ts(f["created_at"]).alias("created_at"),
        _ts(f["due"]).alias("due"),
        F.when(seq >= 1, seq).alias("seq"),
        f["aggregate_id"].alias("entry_aggregate_id"),
        f["aggregate_type"].alias("entry_aggregate_type"),
        F.coalesce(_long(f["attempts"]), F.lit(0)).alias("attempts"),
        f["last_error"].alias("last_error"),
        problems.alias("problems"),
        # The payload's stored size: a claim-checked entry's from its reference.
        F.coalesce(
            F.get_json_object(f["claim"], "$.size").cast("long"),
            F.length(f["payload"]).cast("long"),
        ).alias("payload_bytes"),
        f["claim"].isNotNull().alias("claimed"),
    )


def _entries(base: DataFrame) -> DataFrame:
    """One row per outbox entry, from the documents' typed entries (no parsing here)."""
    return base.select(
        "aggregate_id",
        F.col("type").alias("aggregate_type"),
        "partition",
        F.explode("_entries").alias("x"),
    ).select("aggregate_id", "aggregate_type", "partition", "x.*")


def conform_dead_letters(raw: DataFrame) -> DataFrame:
    """Dead-letter rows (``{_id, aggregate_id, entry, error, attempts, quarantined_at}``)
    with the entry's source stream and seq when they can be read."""
    e = F.from_json(F.col("entry"), _ENTRY_RAW)
    return raw.select(
        F.col("_id").alias("id"),
        F.col("aggregate_id"),
        F.coalesce(F.col("error"), F.lit("(no error recorded)")).alias("error"),
        _long(F.col("attempts")).alias("attempts"),
        _ts(F.col("quarantined_at")).alias("quarantined_at"),
        F.concat(e["aggregate_type"], F.lit("/"), e["aggregate_id"]).alias("source"),
        _long(e["seq"]).alias("seq"),
        e["id"].alias("entry_id"),
    )
