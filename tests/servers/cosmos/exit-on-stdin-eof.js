// Preloaded into the Cosmos DB server (node --require): the server exits when its stdin
// reaches EOF, so it dies with the test process that started it, even after a kill -9.
"use strict";
process.stdin.on("end", () => process.exit(0));
process.stdin.on("error", () => process.exit(0));
process.stdin.resume();
