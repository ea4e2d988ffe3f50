#!/usr/bin/env node
// A consumer written with Node clients, reading what a docoutbox dispatcher published.
//
//   node consume.js amqp  <url> <queue> <count> <schema-dir>
//   node consume.js kafka <bootstrap> <topic> <count> <schema-dir>
//
// Reads <count> messages (amqplib from a RabbitMQ queue, kafkajs from a Kafka topic from
// the beginning), tells the wire format apart (plain docoutbox JSON, CloudEvents structured
// or binary), validates each against the JSON Schema shipped with docoutbox (ajv, draft
// 2020-12, formats checked) and prints one JSON line per message:
//   {"mode", "valid", "errors", "id", "type", "seq", "aggregate", "key"}
// It exits 0 once <count> messages are read, 1 on an error, 2 after 60 s without them.
"use strict";

const fs = require("fs");
const path = require("path");
const Ajv2020 = require("ajv/dist/2020");
const addFormats = require("ajv-formats");

const [kind, address, source, countText, schemaDir] = process.argv.slice(2);
const count = Number(countText);
if (!["amqp", "kafka"].includes(kind) || !address || !source || !(count > 0) || !schemaDir) {
  console.error("usage: consume.js amqp|kafka <address> <queue|topic> <count> <schema-dir>");
  process.exit(64);
}

const ajv = new Ajv2020({ allErrors: true, strict: false });
addFormats(ajv);
const load = (name) =>
  ajv.compile(JSON.parse(fs.readFileSync(path.join(schemaDir, `${name}.schema.json`), "utf8")));
const validators = { entry: load("entry"), cloudevent: load("cloudevent") };

// CloudEvents attributes of a binary-mode message, from its headers (binding prefixes).
const PREFIXES = ["ce_", "ce-", "cloudEvents:", "cloudEvents_"];
function attributes(headers) {
  const out = {};
  for (const [name, value] of Object.entries(headers || {})) {
    const prefix = PREFIXES.find((p) => name.startsWith(p));
    if (prefix === undefined) continue;
    out[name.slice(prefix.length).toLowerCase()] = Buffer.isBuffer(value) ? value.toString() : value;
  }
  return out;
}

// Kafka carries every attribute as text: convert the Integer-typed extension back.
function typed(event) {
  if (typeof event.seq === "string" && /^[0-9]+$/.test(event.seq)) event.seq = Number(event.seq);
  return event;
}

function inspect(body, headers, contentType) {
  const ce = attributes(headers);
  let mode;
  let document;
  if (ce.specversion !== undefined) {
    mode = "binary";
    document = typed({ ...ce, datacontenttype: contentType || "application/json", data: JSON.parse(body) });
  } else {
    const parsed = JSON.parse(body);
    const structured = (contentType || "").split(";")[0].trim() === "application/cloudevents+json";
    mode = structured || (parsed && parsed.specversion !== undefined) ? "structured" : "plain";
    document = mode === "structured" ? typed(parsed) : parsed;
  }
  const validate = mode === "plain" ? validators.entry : validators.cloudevent;
  const valid = validate(document);
  const plain = mode === "plain";
  return {
    mode,
    valid,
    errors: valid ? [] : validate.errors.map((e) => `${e.instancePath} ${e.message}`),
    id: document.id,
    type: document.type,
    seq: document.seq,
    aggregate: plain ? String(document.aggregate_id) : document.aggregateid,
  };
}

function emit(line) {
  process.stdout.write(JSON.stringify(line) + "\n");
}

const deadline = setTimeout(() => {
  console.error(`timed out waiting for ${count} messages`);
  process.exit(2);
}, 60000);

async function amqp() {
  const amqplib = require("amqplib");
  const connection = await amqplib.connect(address);
  const channel = await connection.createChannel();
  await channel.prefetch(50);
  let seen = 0;
  await new Promise((resolve, reject) => {
    channel.consume(source, (message) => {
      try {
        const { headers, contentType } = message.properties;
        emit({ ...inspect(message.content.toString(), headers, contentType), key: null });
        channel.ack(message);
        if (++seen >= count) resolve();
      } catch (error) {
        reject(error);
      }
    });
  });
  await channel.close();
  await connection.close();
}

async function kafka() {
  const { Kafka, logLevel } = require("kafkajs");
  const client = new Kafka({ clientId: "docoutbox-interop", brokers: [address], logLevel: logLevel.NOTHING });
  const consumer = client.consumer({ groupId: `docoutbox-interop-${process.pid}-${Date.now()}` });
  await consumer.connect();
  await consumer.subscribe({ topic: source, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve, reject) => {
    consumer
      .run({
        eachMessage: async ({ message }) => {
          try {
            const headers = {};
            for (const [name, value] of Object.entries(message.headers || {})) {
              headers[name] = Buffer.isBuffer(value) ? value.toString() : String(value);
            }
            const line = inspect(message.value.toString(), headers, headers["content-type"]);
            emit({ ...line, key: message.key ? message.key.toString() : null });
            if (++seen >= count) resolve();
          } catch (error) {
            reject(error);
          }
        },
      })
      .catch(reject);
  });
  await consumer.disconnect();
}

(kind === "amqp" ? amqp() : kafka()).then(
  () => {
    clearTimeout(deadline);
    process.exit(0);
  },
  (error) => {
    console.error(error && error.stack ? error.stack : String(error));
    process.exit(1);
  },
);
