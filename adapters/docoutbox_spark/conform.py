"""Apply the typed schema to raw rows; every mismatch becomes a finding, nothing is dropped.

``conform(raw)`` returns the documents (typed top-level fields), their outbox entries (one
row per array element, typed) and the ``malformed`` findings. A document with problems
stays in the documents frame, so it counts; its unusable fields are null. An entry with
problems stays in the entries frame with its problems listed; each audit uses the entries
whose fields it needs.

Numbers, booleans and dates arrive as text from every reader, so a number stored as a
numeric string (``"5"``) reads as the number; anything that does not parse is reported.

Rule: the typing is done once per document. :func:`typed_layout` stores its result (the
layout of a Parquet snapshot, with the raw text of what did not conform), and ``conform``
of such rows only splits them, so an audit of a snapshot and of the database it was
exported from report the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from docoutbox.stored.codec import PREFIX
from docoutbox_spark.schema import SIZE_FIELD
from docoutbox_spark.sqltext import aliased, empty, literal, name, when

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


# Each helper below returns SQL text (:mod:`docoutbox_spark.sqltext`); its arguments are
# SQL expressions.


def _is_array(raw: str) -> str:
    return f"startswith(ltrim({raw}), '[')"


def _array(raw: str) -> str:
    return when(_is_array(raw), f"from_json({raw}, 'array<string>')")


def _long(raw: str) -> str:
    return f"try_cast({raw} AS bigint)"


def _ts(raw: str) -> str:
    return f"try_cast({raw} AS timestamp)"


def _problem(condition: str, text: str) -> str:
    return when(condition, literal(text))


def _required_long(raw: str, field: str) -> list[str]:
    return [
        _problem(f"{raw} IS NULL", f"{field}: missing"),
        _problem(f"({raw} IS NOT NULL AND {_long(raw)} IS NULL)", f"{field}: not an integer"),
    ]


def _optional_long(raw: str, field: str) -> str:
    return _problem(f"({raw} IS NOT NULL AND {_long(raw)} IS NULL)", f"{field}: not an integer")


def _optional_array(raw: str, field: str) -> str:
    return _problem(f"({raw} IS NOT NULL AND {_array(raw)} IS NULL)", f"{field}: not an array")


def _optional_ts(raw: str, field: str) -> str:
    return _problem(f"({raw} IS NOT NULL AND {_ts(raw)} IS NULL)", f"{field}: not a date")


def _object(raw: str) -> str:
    return f"startswith(ltrim({raw}), '{{')"


def _value(raw: str) -> str:
    """A stored value: a JSON object, or a value a store codec encoded (``dx1:...``,
    :mod:`docoutbox.stored`), which the audit never needs to read."""
    return f"({_object(raw)} OR startswith({raw}, {literal(ENCODED)}))"


_ENTRY_RAW = (
    "struct<id:string,type:string,payload:string,headers:string,created_at:string,"
    "seq:string,aggregate_id:string,aggregate_type:string,correlation_id:string,"
    "causation_id:string,destination:string,attempts:string,last_error:string,due:string,"
    "claim:string>"
)
_MARK_RAW = "struct<source:string,hw:string,above:string>"


def conform(
    raw: DataFrame,
    persist: StorageLevel | None = None,
    *,
    read: bool = True,
    entry_fields: tuple[str, ...] | None = None,
) -> Conformed:
    """Split raw document rows (:data:`~docoutbox_spark.schema.RAW_DOCUMENT_SCHEMA`), or
    the typed rows of a typed snapshot (:func:`typed_layout`), which need no typing.

    Each outbox entry is parsed once, into the documents' typed entries (``_entries``),
    which the entries frame explodes: nothing downstream parses JSON again, so a filter on
    an entry field pushed below the explode cannot repeat the parse. With ``persist``, the
    typed documents (entries included) are persisted at that level and read at once (one
    Spark job), so the source is read once whatever is computed from the three frames
    afterwards; call :meth:`Conformed.unpersist` when done. ``read=False`` leaves the
    reading to the caller, who may fill several caches in one job. ``documents`` carries
    ``seqs``, the ``seq`` of each readable outbox entry (positive integers only), for
    per-document checks that need no shuffle. ``entry_fields``: the only fields the
    entries keep (with ``position`` and ``problems``, which the malformed rows read), so
    that what is persisted holds no more than its reader needs (default: every field)."""
    base = _from_layout(raw) if is_typed(raw) else _typed(raw)
    if entry_fields is not None:
        base = _lean(base, entry_fields)
    if persist is not None:
        base = base.persist(persist)
        if read:
            base.write.format("noop").mode("overwrite").save()  # read it now, once
    documents = base.drop("_entries")
    entries = _entries(base)
    malformed = documents.where("size(problems) > 0").selectExpr(
        "'malformed' AS kind",
        "aggregate_id",
        "CAST(NULL AS string) AS entry_id",
        "array_join(problems, '; ') AS detail",
    )
    bad_entries = entries.where("size(problems) > 0").selectExpr(
        "'malformed' AS kind",
        "aggregate_id",
        "id AS entry_id",
        "concat('outbox[', CAST(position AS string), ']: ', array_join(problems, '; ')) AS detail",
    )
    return Conformed(
        documents,
        entries,
        malformed.unionByName(bad_entries),
        (base,) if persist is not None else (),
    )


def _lean(base: DataFrame, fields: tuple[str, ...]) -> DataFrame:
    """``base`` with its typed entries reduced to ``fields``, ``position`` and
    ``problems``, in one projection."""
    kept = dict.fromkeys(("position", *fields, "problems"))
    entry = ", ".join(f"{literal(f)}, e.{name(f)}" for f in kept)
    return base.selectExpr(
        *[name(c) for c in TYPED_COLUMNS if c != "_entries"],
        f"transform(_entries, e -> named_struct({entry})) AS _entries",
    )


#: The columns of the typed documents (``_entries``: the typed outbox entries).
TYPED_COLUMNS = (
    "aggregate_id",
    "type",
    "version",
    "partition",
    "inbox",
    "inbox_marks",
    "outbox_seq",
    "created_at",
    "updated_at",
    "size_bytes",
    "size_exact",
    "_entries",
    "pending",
    "seqs",
    "problems",
)
#: What a typed snapshot keeps beside them: the outbox's typed entries under ``outbox``,
#: the raw text of what did not conform (``raw``: the whole document as JSON when it has a
#: problem; ``outbox_raw``: each entry's text where that entry has one, else null), and
#: the business state as stored.
KEPT_COLUMNS = ("state", "state_version", "raw", "outbox_raw")


def is_typed(frame: DataFrame) -> bool:
    """Whether ``frame`` holds typed snapshot rows (:func:`typed_layout`), not raw ones."""
    columns = set(frame.columns)
    return "problems" in columns and "outbox_raw" in columns


def _from_layout(typed: DataFrame) -> DataFrame:
    """The typed documents of a typed snapshot: its columns, nothing computed."""
    return typed.selectExpr(
        *[("outbox AS _entries" if c == "_entries" else name(c)) for c in TYPED_COLUMNS]
    )


def typed_layout(raw: DataFrame) -> DataFrame:
    """Raw document rows in the typed snapshot layout (already typed rows as they are):
    the typed documents, typed once here so that an audit of the snapshot parses and
    types nothing, and what :data:`KEPT_COLUMNS` keeps."""
    if is_typed(raw):
        return raw
    base = _typed(raw, keep=True)
    # The raw text is built here, under the condition that needs it, from the raw columns
    # passed through as they are: a document that conforms is never turned into JSON.
    columns = [c for c in raw.columns if c != SIZE_FIELD]
    row = ", ".join(f"{literal(c)}, {name(_kept(c))}" for c in columns)
    texts = _array(name(_kept("outbox")))
    kept = (
        "CASE WHEN exists(_entries, e -> size(e.problems) > 0) THEN "
        f"zip_with(_entries, {texts}, (e, t) -> CASE WHEN size(e.problems) > 0 THEN t END) END"
    )
    return base.selectExpr(
        *[("_entries AS outbox" if c == "_entries" else name(c)) for c in TYPED_COLUMNS],
        "state",
        "state_version",
        f"CASE WHEN size(problems) > 0 THEN to_json(named_struct({row})) END AS raw",
        f"{kept} AS outbox_raw",
    )


#: The prefix of the raw columns :func:`_typed` passes through for :func:`typed_layout`.
_KEPT = "_kept_"


def _kept(column: str) -> str:
    """The name under which :func:`_typed` passes raw ``column`` through: the stored state
    keeps its own name, so that its text (often the largest) is held once per row."""
    return column if column in KEPT_COLUMNS else _KEPT + column


def _typed(raw: DataFrame, *, keep: bool = False) -> DataFrame:
    """The typed documents (:data:`TYPED_COLUMNS`) of raw rows; with ``keep``, also the
    stored state and every other raw column as it is (named by :func:`_kept`)."""
    raw_cols = [c for c in raw.columns if c != SIZE_FIELD]
    estimate = "5"
    for column in raw_cols:
        estimate = f"({estimate} + (coalesce(octet_length({name(column)}), 0) + {len(column) + 2}))"
    marks_raw = f"transform({_array('inbox_marks')}, m -> from_json(m, {literal(_MARK_RAW)}))"
    # Every number of a mark must be an integer: a cast would read a boolean as 1, and an
    # ``above`` element that is not one would be dropped unseen.
    bad_mark = (
        f"exists({marks_raw}, m -> (m IS NULL OR m.source IS NULL OR {_long('m.hw')} IS NULL "
        f"OR (m.above IS NOT NULL AND {_array('m.above')} IS NULL) "
        f"OR exists({_array('m.above')}, a -> {_long('a')} IS NULL)))"
    )
    problems = [
        _problem("`type` IS NULL", "type: missing"),
        *_required_long("version", "version"),
        _optional_long("`partition`", "partition"),
        _problem("outbox IS NULL", "outbox: missing"),
        _problem(f"(outbox IS NOT NULL AND {_array('outbox')} IS NULL)", "outbox: not an array"),
        *_required_long("outbox_seq", "outbox_seq"),
        _optional_array("inbox", "inbox"),
        _optional_array("inbox_marks", "inbox_marks"),
        _problem(
            f"coalesce({bad_mark}, false)", "inbox_marks: an element is not {source, hw, above}"
        ),
        _optional_ts("created_at", "created_at"),
        _optional_ts("updated_at", "updated_at"),
    ]
    if "state_version" in raw_cols:
        problems.append(_optional_long("state_version", "state_version"))
    marks = (
        f"transform({marks_raw}, m -> named_struct('source', m.source, 'hw', {_long('m.hw')}, "
        f"'above', transform({_array('m.above')}, a -> {_long('a')})))"
    )
    entry = when(_object("r"), f"from_json(r, {literal(_ENTRY_RAW)})")
    parsed = raw.selectExpr(
        "*", f"transform({_array('outbox')}, r -> named_struct('raw', r, 'e', {entry})) AS _parsed"
    )
    parts = [
        ("aggregate_id", "`_id`"),
        ("type", "`type`"),
        ("version", _long("version")),
        ("partition", f"coalesce({_long('`partition`')}, 0)"),
        ("inbox", _array("inbox")),
        ("inbox_marks", marks),
        ("outbox_seq", _long("outbox_seq")),
        ("created_at", _ts("created_at")),
        ("updated_at", _ts("updated_at")),
        ("size_bytes", f"coalesce({name(SIZE_FIELD)}, {estimate})"),
        ("size_exact", f"({name(SIZE_FIELD)} IS NOT NULL)"),
        ("_entries", f"transform(_parsed, (x, p) -> {_typed_entry('x', 'p')})"),
        ("pending", "coalesce(size(_parsed), 0)"),
        ("problems", f"array_compact(array({', '.join(problems)}))"),
    ]
    if keep:
        parts += [
            *((c, name(c) if c in raw_cols else "CAST(NULL AS string)") for c in KEPT_COLUMNS[:2]),
            *((_kept(c), name(c)) for c in raw_cols if _kept(c) != c),
        ]
    base = parsed.selectExpr(*aliased(parts))
    # Each entry's seq from the typed entries (their positive seqs), in a projection of
    # its own so that the entries are parsed once per document.
    return base.selectExpr(
        *[name(c) for c in base.columns if c != "problems"],
        "coalesce(filter(transform(_entries, x -> x.seq), q -> q IS NOT NULL), "
        f"{empty('bigint')}) AS seqs",
        "problems",
    )


def _typed_entry(x: str, position: str) -> str:
    """One outbox entry (``x``: its raw JSON text and its parse) with typed fields and its
    problems, as SQL."""
    f = f"{x}.e"

    def field(key: str) -> str:
        return f"{f}.{name(key)}"

    def req(key: str) -> str:
        return _problem(f"({f} IS NOT NULL AND {field(key)} IS NULL)", f"{key}: missing")

    seq = _long(field("seq"))
    problems = [
        _problem(f"{f} IS NULL", "not an object"),
        req("id"),
        req("type"),
        # A claim-checked entry keeps a reference (``claim``) instead of its payload.
        _problem(
            f"({f} IS NOT NULL AND {field('payload')} IS NULL AND {field('claim')} IS NULL)",
            "payload: missing",
        ),
        _problem(
            f"({field('payload')} IS NOT NULL AND NOT {_value(field('payload'))})",
            "payload: not an object",
        ),
        _problem(
            f"({field('headers')} IS NOT NULL AND NOT {_value(field('headers'))})",
            "headers: not an object",
        ),
        req("created_at"),
        _problem(
            f"({field('created_at')} IS NOT NULL AND {_ts(field('created_at'))} IS NULL)",
            "created_at: not a date",
        ),
        _problem(
            f"({field('due')} IS NOT NULL AND {_ts(field('due'))} IS NULL)", "due: not a date"
        ),
        # A scheduled entry has no seq until the dispatcher releases it.
        _problem(
            f"({f} IS NOT NULL AND {field('seq')} IS NULL AND {field('due')} IS NULL)",
            "seq: missing",
        ),
        _problem(
            f"({field('seq')} IS NOT NULL AND coalesce({seq} < 1, true))",
            "seq: not a positive integer",
        ),
        req("aggregate_id"),
        req("aggregate_type"),
        _problem(
            f"({field('attempts')} IS NOT NULL AND {_long(field('attempts'))} IS NULL)",
            "attempts: not an integer",
        ),
    ]
    parts = [
        ("position", f"CAST({position} AS int)"),
        ("id", field("id")),
        ("type", field("type")),
        ("destination", field("destination")),
        ("payload", field("payload")),
        ("headers", field("headers")),
        ("created_at", _ts(field("created_at"))),
        ("due", _ts(field("due"))),
        ("seq", when(f"{seq} >= 1", seq)),
        ("entry_aggregate_id", field("aggregate_id")),
        ("entry_aggregate_type", field("aggregate_type")),
        ("attempts", f"coalesce({_long(field('attempts'))}, 0)"),
        ("last_error", field("last_error")),
        ("problems", f"array_compact(array({', '.join(problems)}))"),
        # The payload's stored size: a claim-checked entry's from its reference.
        (
            "payload_bytes",
            f"coalesce(CAST(get_json_object({field('claim')}, '$.size') AS bigint), "
            f"CAST(length({field('payload')}) AS bigint))",
        ),
        ("claimed", f"({field('claim')} IS NOT NULL)"),
    ]
    return "named_struct(" + ", ".join(f"{literal(k)}, {v}" for k, v in parts) + ")"


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
    e = f"from_json(entry, {literal(_ENTRY_RAW)})"
    return raw.selectExpr(
        *aliased(
            [
                ("id", "`_id`"),
                ("aggregate_id", "aggregate_id"),
                ("error", "coalesce(error, '(no error recorded)')"),
                ("attempts", _long("attempts")),
                ("quarantined_at", _ts("quarantined_at")),
                ("source", f"concat({e}.aggregate_type, '/', {e}.aggregate_id)"),
                ("seq", _long(f"{e}.seq")),
                ("entry_id", f"{e}.id"),
            ]
        )
    )
