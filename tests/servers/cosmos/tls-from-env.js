// Preloaded into the Cosmos DB server (node --require) by tests that need HTTPS with a
// certificate of their own: when COSMOSDB_SERVER_TLS_CERT and COSMOSDB_SERVER_TLS_KEY name
// PEM files, the server presents that certificate instead of the one bundled with it.
"use strict";
const fs = require("fs");
const https = require("https");
const certFile = process.env.COSMOSDB_SERVER_TLS_CERT;
const keyFile = process.env.COSMOSDB_SERVER_TLS_KEY;
if (certFile && keyFile) {
    const cert = fs.readFileSync(certFile);
    const key = fs.readFileSync(keyFile);
    const createServer = https.createServer;
    https.createServer = function (options, listener) {
        return createServer.call(this, { ...options, cert, key }, listener);
    };
}
