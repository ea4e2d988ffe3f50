"use strict";
// Used by the project's patch of @vercel/cosmosdb-server (tests/servers/cosmos/patches),
// installed as the local package "docoutbox-cosmos-feed". Everything the stock server
// lacks for a faithful latest-version change feed lives here:
//   - a global log sequence number (LSN) stamped on every write (create/replace/upsert/patch);
//   - effective partition keys (EPK): a port of the azure-cosmos SDK's hashing
//     (azure/cosmos/_cosmos_murmurhash3.py and PartitionKey._get_effective_partition_key_*);
//   - several partition key ranges (feed ranges) per container, split evenly over the EPK space;
//   - the change feed read itself, filtered by range/EPK, paged, with LSN etags;
//   - the 2 MB item size limit (413);
//   - snapshots of a container's items, so that a transactional batch can roll back;
//   - injected faults (status codes, delays, lost requests and replies) and partition splits,
//     for tests.
Object.defineProperty(exports, "__esModule", { value: true });
const crypto = require("crypto");
exports.splitRange = exports.rangesVersion = exports.dispatchWithFaults = exports.inTransaction = exports.checkItemSize = exports.restoreItems = exports.snapshotItems = exports.readChangeFeed = exports.partitionKeyRangesFor = exports.effectivePartitionKey = exports.murmurhash3_128 = exports.currentLsn = exports.stampLsn = exports.lsnOf = void 0;

// ---------------------------------------------------------------------------------------
// LSN. One counter for the whole server: strictly increasing, so per range it is too (on
// Cosmos each physical partition has its own). Kept outside the item (a WeakMap keyed by
// the stored object), because Cosmos shows `_lsn` in the change feed only, not on reads.
// The writes of a transactional batch share one LSN, as on Cosmos (see inTransaction).
let lastLsn = 0;
let transactionLsn = null;
const lsns = new WeakMap();
function stampLsn(data) {
    if (transactionLsn === null)
        lastLsn += 1;
    lsns.set(data, transactionLsn === null ? lastLsn : transactionLsn);
    return data;
}
exports.stampLsn = stampLsn;
// Runs fn() with every write stamped with the same new LSN; when fn() reports failure
// (returns false) or throws, the LSN is not used up.
function inTransaction(fn) {
    const before = lastLsn;
    transactionLsn = lastLsn + 1;
    let committed = false;
    try {
        committed = fn();
    }
    finally {
        transactionLsn = null;
        lastLsn = committed ? before + 1 : before;
    }
    return committed;
}
exports.inTransaction = inTransaction;
const lsnOf = data => lsns.get(data) || 0;
exports.lsnOf = lsnOf;
const currentLsn = () => lastLsn;
exports.currentLsn = currentLsn;

// ---------------------------------------------------------------------------------------
// MurmurHash3 x64 128-bit, seed 0, as azure/cosmos/_cosmos_murmurhash3.py murmurhash3_128.
// Returns [h1, h2] (the SDK's _UInt128(low=h1, high=h2)).
const MASK64 = (1n << 64n) - 1n;
const rotl64 = (v, s) => ((v << BigInt(s)) | (v >> BigInt(64 - s))) & MASK64;
const mul64 = (a, b) => (a * b) & MASK64;
const add64 = (a, b) => (a + b) & MASK64;
function fmix64(k) {
    k ^= k >> 33n;
    k = mul64(k, 0xff51afd7ed558ccdn);
    k ^= k >> 33n;
    k = mul64(k, 0xc4ceb9fe1a85ec53n);
    k ^= k >> 33n;
    return k;
}
function murmurhash3_128(bytes) {
    const c1 = 0x87c37b91114253d5n;
    const c2 = 0x4cf5ad432745937fn;
    let h1 = 0n;
    let h2 = 0n;
    const len = bytes.length;
    let pos = 0;
    for (; pos + 16 <= len; pos += 16) {
        let k1 = bytes.readBigUInt64LE(pos);
        let k2 = bytes.readBigUInt64LE(pos + 8);
        k1 = mul64(rotl64(mul64(k1, c1), 31), c2);
        h1 ^= k1;
        h1 = add64(mul64(add64(rotl64(h1, 27), h2), 5n), 0x52dce729n);
        k2 = mul64(rotl64(mul64(k2, c2), 33), c1);
        h2 ^= k2;
        h2 = add64(mul64(add64(rotl64(h2, 31), h1), 5n), 0x38495ab5n);
    }
    const n = len & 15;
    let k1 = 0n;
    let k2 = 0n;
    for (let i = n - 1; i >= 8; i -= 1)
        k2 ^= BigInt(bytes[pos + i]) << BigInt(8 * (i - 8));
    h2 ^= mul64(rotl64(mul64(k2, c2), 33), c1);
    for (let i = Math.min(n, 8) - 1; i >= 0; i -= 1)
        k1 ^= BigInt(bytes[pos + i]) << BigInt(8 * i);
    h1 ^= mul64(rotl64(mul64(k1, c1), 31), c2);
    h1 ^= BigInt(len);
    h2 ^= BigInt(len);
    h1 = add64(h1, h2);
    h2 = add64(h2, h1);
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 = add64(h1, h2);
    h2 = add64(h2, h1);
    return [h1, h2];
}
exports.murmurhash3_128 = murmurhash3_128;

// ---------------------------------------------------------------------------------------
// Effective partition key, hash partitioning version 2 (the SDK's default for new
// containers): PartitionKey._write_for_hashing_v2 per component, MurmurHash3-128 of the
// bytes, the 16 hash bytes big-endian (h2 then h1) with the top 2 bits cleared, in hex.
// MultiHash (hierarchical keys) concatenates one such hash per component.
function componentBytes(value) {
    if (value === true)
        return Buffer.from([0x03]);
    if (value === false)
        return Buffer.from([0x02]);
    if (value === null)
        return Buffer.from([0x01]);
    if (typeof value === "number") {
        const buf = Buffer.alloc(9);
        buf[0] = 0x05;
        buf.writeDoubleLE(value, 1);
        return buf;
    }
    if (typeof value === "string")
        return Buffer.concat([Buffer.from([0x08]), Buffer.from(value, "utf8"), Buffer.from([0xff])]);
    // A missing value (and `{}`, the legacy spelling of one) hashes as Undefined.
    return Buffer.from([0x00]);
}
function hashToEpk(bytes) {
    const [h1, h2] = murmurhash3_128(bytes);
    const out = Buffer.alloc(16);
    out.writeBigUInt64BE(h2, 0);
    out.writeBigUInt64BE(h1, 8);
    out[0] &= 0x3f;
    return out.toString("hex").toUpperCase();
}
function valueAtPath(path, data) {
    let current = data;
    for (const key of path.slice(1).split("/")) {
        if (current === null || typeof current !== "object")
            return undefined;
        current = current[key];
    }
    return current;
}
function isHashV2(definition) {
    return !!definition && Array.isArray(definition.paths) && definition.version === 2 &&
        (definition.kind === "Hash" || definition.kind === "MultiHash");
}
// `components` are the partition key values, one per path of the definition.
function effectivePartitionKey(definition, components) {
    if (definition.kind === "MultiHash")
        return components.map(c => hashToEpk(componentBytes(c))).join("");
    return hashToEpk(Buffer.concat(components.map(componentBytes)));
}
exports.effectivePartitionKey = effectivePartitionKey;
const itemEpks = new WeakMap();
function itemEpk(definition, data) {
    let epk = itemEpks.get(data);
    if (epk === undefined) {
        epk = effectivePartitionKey(definition, definition.paths.map(p => valueAtPath(p, data)));
        itemEpks.set(data, epk);
    }
    return epk;
}

// ---------------------------------------------------------------------------------------
// Partition key ranges: COSMOSDB_SERVER_FEED_RANGES (default 4, at most 64) ranges of equal
// width over the EPK space [00.., 40..) that version-2 hashes fall in; the first starts at
// "" and the last ends at "FF", as on Cosmos. Containers without a version-2 hash partition
// key (legacy or version 1, whose hashing is not ported) get the stock single range.
function feedRangeCount() {
    const n = parseInt(process.env.COSMOSDB_SERVER_FEED_RANGES || "4", 10);
    return Number.isInteger(n) && n >= 1 && n <= 64 ? n : 4;
}
function partitionKeyRangesFor(collectionData) {
    const n = isHashV2(collectionData && collectionData.partitionKey) ? feedRangeCount() : 1;
    const boundary = i => {
        if (i === 0)
            return "";
        if (i === n)
            return "FF";
        const prefix = Math.floor((i * 0x4000) / n).toString(16).toUpperCase().padStart(4, "0");
        return prefix.padEnd(32, "0");
    };
    const ranges = [];
    for (let i = 0; i < n; i += 1) {
        ranges.push({
            id: String(i),
            minInclusive: boundary(i),
            maxExclusive: boundary(i + 1),
            ridPrefix: i,
            throughputFraction: 1 / n,
            status: "online",
            parents: []
        });
    }
    return ranges;
}
exports.partitionKeyRangesFor = partitionKeyRangesFor;
const currentRanges = collection => [...collection.partitionKeyRanges._data.values()].map(item => item.read());

// Splits: a range is replaced by two children (new ids, `parents` = [its id], split at the
// middle of its EPK interval), as when Cosmos splits a physical partition. A change feed
// request for the gone range then gets 410/1002 and the SDK moves its continuation to the
// children. The pkranges feed's etag is a version bumped by each split, so the SDK's
// routing map refresh sees the new ranges (the stock stub answered 304 forever).
const rangeVersions = new WeakMap();
const rangesVersion = collection => rangeVersions.get(collection.partitionKeyRanges) || 1;
exports.rangesVersion = rangesVersion;
const EPK_END = 0x40n << 120n; // version-2 EPKs are below 40000...0 (32 hex digits)
const epkToBig = epk => (epk === "" ? 0n : epk === "FF" ? EPK_END : BigInt(`0x${epk.padEnd(32, "0")}`));
function splitRange(collection, rangeId) {
    const ranges = currentRanges(collection);
    const range = ranges.find(r => r.id === String(rangeId));
    if (!range)
        throw new Error(`no partition key range ${rangeId}`);
    const mid = (epkToBig(range.minInclusive) + epkToBig(range.maxExclusive)) / 2n;
    const boundary = mid.toString(16).toUpperCase().padStart(32, "0");
    if (boundary <= range.minInclusive || (range.maxExclusive !== "FF" && boundary >= range.maxExclusive))
        throw new Error(`partition key range ${rangeId} is too narrow to split`);
    const next = Math.max(...ranges.map(r => Number(r.id))) + 1;
    const { _rid, _self, _etag, _ts, ...plain } = range; // the children get their own
    const child = (id, min, max) => ({
        ...plain,
        id: String(id),
        minInclusive: min,
        maxExclusive: max,
        ridPrefix: id,
        throughputFraction: range.throughputFraction / 2,
        parents: [...(range.parents || []), range.id]
    });
    const children = [child(next, range.minInclusive, boundary), child(next + 1, boundary, range.maxExclusive)];
    collection.partitionKeyRanges.delete(range.id, range.id);
    children.forEach(child => collection.partitionKeyRanges.create(child));
    rangeVersions.set(collection.partitionKeyRanges, rangesVersion(collection) + 1);
    return children.map(child => child.id);
}
exports.splitRange = splitRange;

// ---------------------------------------------------------------------------------------
// The change feed, latest-version mode ("A-IM: Incremental feed").
//   - Which range: the partition key range of x-ms-documentdb-partitionkeyrangeid, narrowed
//     by x-ms-start-epk/x-ms-end-epk when present, or one partition key
//     (x-ms-documentdb-partitionkey).
//   - From where: If-None-Match "*" = from now; an LSN etag = after that LSN; none = from the
//     beginning; If-Modified-Since = items written at or after that time.
//   - Items with a newer LSN, in LSN order, at most x-ms-max-item-count (default 100), each
//     with its `_lsn`; a page never ends inside a transactional batch (its items share one
//     LSN), so it can hold more items than asked for, as on Cosmos. The etag is the LSN of the last item returned; 304 (with the current
//     LSN as etag) only when nothing in the range is newer.
//   - Deletes are not in this mode, as on Cosmos: a deleted item simply stops appearing.
const DEFAULT_PAGE_SIZE = 100;
const quote = lsn => `"${lsn}"`;
function header(req, name) {
    const value = req.headers[name];
    return Array.isArray(value) ? value[0] : value;
}
function readChangeFeed(collection, req, res) {
    const collectionData = collection.read();
    if (!collectionData) {
        res.statusCode = 404;
        return { code: "NotFound", message: "Entity with the specified id does not exist in the system." };
    }
    if (String(header(req, "a-im")).toLowerCase() !== "incremental feed") {
        res.statusCode = 400;
        return { code: "BadRequest", message: "Only the latest-version change feed (A-IM: Incremental feed) is supported." };
    }
    const definition = collectionData.partitionKey;
    const hashed = isHashV2(definition);
    let min = "";
    let max = "FF";
    const rangeId = header(req, "x-ms-documentdb-partitionkeyrangeid");
    if (rangeId !== undefined) {
        const range = currentRanges(collection).find(r => r.id === String(rangeId));
        if (!range) {
            res.statusCode = 410;
            res.setHeader("x-ms-substatus", "1002"); // PartitionKeyRangeGone
            return { code: "Gone", message: `Partition key range ${rangeId} does not exist.` };
        }
        min = range.minInclusive;
        max = range.maxExclusive;
    }
    const startEpk = header(req, "x-ms-start-epk");
    const endEpk = header(req, "x-ms-end-epk");
    if (startEpk !== undefined || endEpk !== undefined) {
        min = startEpk || "";
        max = endEpk || "FF";
    }
    let onlyEpk = null;
    const pkHeader = header(req, "x-ms-documentdb-partitionkey");
    if (pkHeader && hashed) {
        try {
            const components = JSON.parse(pkHeader);
            if (Array.isArray(components) && components.length === definition.paths.length)
                onlyEpk = effectivePartitionKey(definition, components.map(c => (c && typeof c === "object" ? undefined : c)));
        }
        catch (err) {
            res.statusCode = 400;
            return { code: "BadRequest", message: `Invalid partition key header: ${pkHeader}` };
        }
    }
    const ifNoneMatch = header(req, "if-none-match");
    if (ifNoneMatch === "*") {
        res.statusCode = 304;
        res.setHeader("etag", quote(lastLsn));
        return {};
    }
    let since = 0;
    if (ifNoneMatch) {
        since = Number(ifNoneMatch.replace(/"/g, ""));
        if (!Number.isSafeInteger(since) || since < 0) {
            res.statusCode = 400;
            return { code: "BadRequest", message: `Invalid change feed continuation: ${ifNoneMatch}` };
        }
    }
    const ifModifiedSince = header(req, "if-modified-since");
    const minTs = ifModifiedSince ? Math.floor(Date.parse(ifModifiedSince) / 1000) : null;
    const requested = parseInt(header(req, "x-ms-max-item-count") || "", 10);
    const pageSize = requested > 0 ? requested : DEFAULT_PAGE_SIZE;
    // Map order is write order: a write deletes the stored object and appends a new one,
    // so iterating yields ascending LSNs and the page can stop early.
    const page = [];
    for (const item of collection.documents._data.values()) {
        const data = item.read();
        const lsn = lsnOf(data);
        if (lsn <= since || (minTs !== null && data._ts < minTs))
            continue;
        if (hashed) {
            const epk = itemEpk(definition, data);
            if (epk < min || epk >= max || (onlyEpk !== null && epk !== onlyEpk))
                continue;
        }
        if (page.length >= pageSize && lsn !== page[page.length - 1]._lsn)
            break;
        page.push({ ...data, _lsn: lsn });
    }
    if (page.length === 0) {
        res.statusCode = 304;
        res.setHeader("etag", quote(Math.max(since, lastLsn)));
        return {};
    }
    res.statusCode = 200;
    res.setHeader("etag", quote(page[page.length - 1]._lsn));
    res.setHeader("x-ms-item-count", String(page.length));
    return { _rid: collectionData._rid, Documents: page, _count: page.length };
}
exports.readChangeFeed = readChangeFeed;

// ---------------------------------------------------------------------------------------
// Cosmos refuses an item whose JSON (system properties included) exceeds 2 MB: 413.
const MAX_ITEM_BYTES = 2 * 1024 * 1024;
function checkItemSize(data) {
    const size = Buffer.byteLength(JSON.stringify(data), "utf8");
    if (size > MAX_ITEM_BYTES) {
        const err = new Error(`Request size is too large: the item has ${size} bytes, at most ${MAX_ITEM_BYTES} are allowed.`);
        err.statusCode = 413;
        err.code = "RequestEntityTooLarge";
        throw err;
    }
}
exports.checkItemSize = checkItemSize;

// ---------------------------------------------------------------------------------------
// Snapshots for the transactional batch. Stored item objects are never mutated in place
// (every write stores a new object), so copying the two maps is a full snapshot.
function snapshotItems(items) {
    return { data: new Map(items._data), index: new Map(items._index), ridCount: items._ridCount };
}
exports.snapshotItems = snapshotItems;
function restoreItems(items, snapshot) {
    items._data = snapshot.data;
    items._index = snapshot.index;
    items._ridCount = snapshot.ridCount;
}
exports.restoreItems = restoreItems;

// ---------------------------------------------------------------------------------------
// Injected faults, for tests of what a client does when Cosmos throttles, fails, is slow
// or loses a reply. Not part of Cosmos: a control route outside the REST namespace.
//   POST   /_faults  {"status": 429, "retryAfterMs": 10, "count": 2, "method": "PATCH",
//                    "pathContains": "/docs/", "headers": {"a-im": "Incremental Feed"}}
//   DELETE /_faults  removes every fault not yet used up
// A request takes the first fault it matches (method, a substring of its path, header
// values compared case-insensitively); `count` requests (default 1) take it. A fault
//   - with `status` answers it instead of the server (with `substatus`/`retryAfterMs` as
//     x-ms-substatus/x-ms-retry-after-ms), after `delayMs` if given;
//   - with `dropRequest` closes the connection without handling the request;
//   - with `dropReply` handles the request (the write applies) and closes the connection
//     instead of answering;
//   - with only `delayMs` answers normally, late.
const faults = [];
function faultMatches(fault, req) {
    if (fault.method && fault.method.toUpperCase() !== req.method)
        return false;
    if (fault.pathContains && !decodeURIComponent(req.url).includes(fault.pathContains))
        return false;
    return Object.entries(fault.headers || {}).every(([name, value]) => String(req.headers[name.toLowerCase()] || "").toLowerCase() === String(value).toLowerCase());
}
function controlFaults(req, res) {
    const chunks = [];
    req.on("data", chunk => chunks.push(chunk));
    req.on("end", () => {
        res.setHeader("content-type", "application/json");
        if (req.method === "DELETE") {
            faults.length = 0;
        }
        else if (req.method === "POST") {
            let fault;
            try {
                fault = JSON.parse(Buffer.concat(chunks).toString() || "{}");
            }
            catch (err) {
                res.statusCode = 400;
                res.end(JSON.stringify({ message: `invalid fault: ${err.message}` }));
                return;
            }
            faults.push({ count: 1, ...fault });
        }
        else if (req.method !== "GET") {
            res.statusCode = 405;
        }
        res.end(JSON.stringify({ faults }));
    });
}
// POST /_split {"database": ..., "container": ..., "range": "1"} splits that range.
function controlSplit(account, req, res) {
    const chunks = [];
    req.on("data", chunk => chunks.push(chunk));
    req.on("end", () => {
        res.setHeader("content-type", "application/json");
        try {
            const { database, container, range } = JSON.parse(Buffer.concat(chunks).toString());
            const collection = account.database(database).collection(container);
            if (!collection.read())
                throw new Error(`no container ${database}/${container}`);
            res.end(JSON.stringify({ children: splitRange(collection, range) }));
        }
        catch (err) {
            res.statusCode = 400;
            res.end(JSON.stringify({ message: err.message }));
        }
    });
}
// Calls next() to let the server handle the request, unless a fault says otherwise.
function dispatchWithFaults(account, req, res, next) {
    if (req.url === "/_faults" || req.url.startsWith("/_faults?")) {
        controlFaults(req, res);
        return;
    }
    if (req.url === "/_split" && req.method === "POST") {
        controlSplit(account, req, res);
        return;
    }
    const index = faults.findIndex(f => faultMatches(f, req));
    if (index < 0) {
        next();
        return;
    }
    const fault = faults[index];
    fault.count -= 1;
    if (fault.count <= 0)
        faults.splice(index, 1);
    const act = () => {
        if (fault.dropRequest) {
            req.socket.destroy();
        }
        else if (fault.status) {
            res.statusCode = fault.status;
            res.setHeader("content-type", "application/json");
            res.setHeader("x-ms-activity-id", crypto.randomUUID());
            res.setHeader("x-ms-request-charge", "0");
            if (fault.retryAfterMs !== undefined)
                res.setHeader("x-ms-retry-after-ms", String(fault.retryAfterMs));
            if (fault.substatus !== undefined)
                res.setHeader("x-ms-substatus", String(fault.substatus));
            res.end(JSON.stringify({ code: fault.code || "InjectedFault", message: fault.message || `Injected status ${fault.status}.` }));
        }
        else {
            if (fault.dropReply)
                res.end = () => req.socket.destroy();
            next();
        }
    };
    if (fault.delayMs)
        setTimeout(act, fault.delayMs);
    else
        act();
}
exports.dispatchWithFaults = dispatchWithFaults;
