#!/usr/bin/env bash
# Install, start and stop the servers the docoutbox test suite talks to.
#
# Usage: scripts/servers.sh <subcommand>
#   install-mongo     fetch mongo-java-server + deps into tests/servers/mongo/lib (Maven,
#                     with the pom shipped in docoutbox/testing/mongo_wire)
#   install-rabbitmq  apt-get install rabbitmq-server if it is missing
#   install-kafka     fetch the Apache Kafka broker jars into tests/servers/kafka/lib (Maven)
#   install-spark     fetch the MongoDB Spark connector + driver into tests/servers/spark/lib
#   install-chromium  apt-get install chromium (headless rendering of the audit report)
#   install-cosmos    npm ci the local Cosmos DB server into tests/servers/cosmos/node_modules
#                     (@vercel/cosmosdb-server, pinned, with the project's patch applied)
#   install           all of the above
#   start-rabbitmq    start RabbitMQ detached (no-op if running) and wait until it is ready
#   stop-rabbitmq     stop RabbitMQ and wait for it to exit (no-op if not running), then epmd
#   start-kafka       start a single-node Kafka (KRaft, broker + controller) detached on
#                     127.0.0.1:$DOCOUTBOX_KAFKA_PORT (no-op if it answers), formatting its
#                     storage under .servers/kafka on first start; waits until it listens
#   stop-kafka        stop the Kafka broker that start-kafka started (by its pid file)
#   start-cosmos      start a long-lived local Cosmos DB server on 127.0.0.1:$COSMOS_PORT
#                     (default 8081; no-op if ours is running) and print the COSMOS_* exports
#   stop-cosmos       stop the server start-cosmos started (its pid is in .servers/cosmos.pid)
#   start-spark-cluster  start a Spark standalone cluster from the venv's pyspark: a master on
#                     127.0.0.1:$DOCOUTBOX_SPARK_MASTER_PORT and two workers (1 core, 1g each);
#                     no-op if ours is running; waits until both workers have registered and
#                     prints the DOCOUTBOX_SPARK_MASTER export
#   stop-spark-cluster   stop the master and workers start-spark-cluster started (by pid)
#
# All subcommands are idempotent, never read stdin and work with CI=true.
# The MongoDB wire server is not started here: benchmarks/servers.py launches one per
# test session (java -cp 'tests/servers/mongo/lib/*' docoutbox/testing/mongo_wire/MongoWireServer.java 0).
# Nor is the Cosmos DB server: benchmarks/servers.py launches one per session too;
# start-cosmos is for examples and manual runs (tests then use it through COSMOS_ENDPOINT).
#
# Environment:
#   RABBITMQ_START_TIMEOUT  seconds to wait for RabbitMQ to come up (default 60)
#   DOCOUTBOX_KAFKA_PORT    the Kafka broker's port (default 19092); the controller listens
#                           on +1, and a second client listener on +2 advertises +3 (tests
#                           put a fault-injecting proxy there)
#   KAFKA_START_TIMEOUT     seconds to wait for Kafka to come up (default 90)
#   COSMOS_PORT             port of start-cosmos (default 8081)
#   COSMOSDB_SERVER_FEED_RANGES  feed ranges per container of start-cosmos (default 4)
#   DOCOUTBOX_SPARK_MASTER_PORT  the standalone master's port (default 17077); its web UI
#                           listens on +1, the workers' on +2 and +3
#   SPARK_CLUSTER_START_TIMEOUT  seconds to wait for the cluster (default 90)
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MONGO_POM="$REPO_ROOT/docoutbox/testing/mongo_wire/pom.xml"
MONGO_LIB="$REPO_ROOT/tests/servers/mongo/lib"
SPARK_DIR="$REPO_ROOT/tests/servers/spark"
SPARK_LIB="$SPARK_DIR/lib"
COSMOS_DIR="$REPO_ROOT/tests/servers/cosmos"
COSMOS_PORT="${COSMOS_PORT:-8081}"
STATE_DIR="$REPO_ROOT/.servers"
# The official emulator's well-known key (not a secret); the local server checks no signature.
COSMOS_EMULATOR_KEY="C2y6yDjf5/R+ob0N8A7Cgv30VRDJIWEHLM+4QDU5DE2nQ9nDuVTqobD4b8mGGyPMbIZnqyMsEcaGQy67XIw/Jw=="
RABBITMQ_START_TIMEOUT="${RABBITMQ_START_TIMEOUT:-60}"
KAFKA_DIR="$REPO_ROOT/tests/servers/kafka"
KAFKA_LIB="$KAFKA_DIR/lib"
KAFKA_HOME="$REPO_ROOT/.servers/kafka"
KAFKA_PORT="${DOCOUTBOX_KAFKA_PORT:-19092}"
KAFKA_CONTROLLER_PORT=$((KAFKA_PORT + 1))
KAFKA_START_TIMEOUT="${KAFKA_START_TIMEOUT:-90}"
SPARK_MASTER_PORT="${DOCOUTBOX_SPARK_MASTER_PORT:-17077}"
SPARK_CLUSTER_START_TIMEOUT="${SPARK_CLUSTER_START_TIMEOUT:-90}"
SPARK_CLUSTER_DIR="$STATE_DIR/spark"
SPARK_WORKERS=2

log() { printf '[servers] %s\n' "$*" >&2; }
die() { printf '[servers] ERROR: %s\n' "$*" >&2; exit 1; }

# Run a command as root: directly when we are root, else through non-interactive sudo.
as_root() {
    if [[ "$(id -u)" -eq 0 ]]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@"
    else
        die "'$*' needs root, and sudo is not available. Re-run as root."
    fi
}

# RabbitMQ's Debian wrappers (rabbitmqctl, rabbitmq-server) only run as root or rabbitmq.
as_rabbitmq_admin() {
    if [[ "$(id -un)" == "rabbitmq" ]]; then
        "$@"
    else
        as_root "$@"
    fi
}

find_rabbitmq_cmd() {
    # /usr/sbin is not always on PATH for non-root users.
    local name="$1"
    if command -v "$name" >/dev/null 2>&1; then
        command -v "$name"
    elif [[ -x "/usr/sbin/$name" ]]; then
        echo "/usr/sbin/$name"
    else
        return 1
    fi
}

cmd_install_mongo() {
    if compgen -G "$MONGO_LIB/mongo-java-server-[0-9]*.jar" >/dev/null; then
        log "mongo-java-server already in $MONGO_LIB"
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn (Maven) is required for install-mongo"
    command -v java >/dev/null 2>&1 || die "java (17+) is required to run the MongoDB wire server"
    log "fetching mongo-java-server and its dependencies into $MONGO_LIB"
    # Output is captured (Debian's Maven 3.8 prints stray ANSI resets even with -q) and shown
    # only on failure.
    local mvn_log
    mvn_log="$(mktemp)"
    if ! mvn -B -q -f "$MONGO_POM" \
        dependency:copy-dependencies -DoutputDirectory="$MONGO_LIB" </dev/null >"$mvn_log" 2>&1; then
        cat "$mvn_log" >&2
        rm -f "$mvn_log"
        die "Maven could not fetch mongo-java-server (is Maven Central reachable?)"
    fi
    rm -f "$mvn_log"
    compgen -G "$MONGO_LIB/mongo-java-server-[0-9]*.jar" >/dev/null \
        || die "Maven finished but no mongo-java-server jar is in $MONGO_LIB"
    log "mongo-java-server installed"
}

cmd_install_rabbitmq() {
    if find_rabbitmq_cmd rabbitmq-server >/dev/null; then
        log "rabbitmq-server already installed"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 \
        || die "rabbitmq-server is missing and apt-get is not available; install it manually"
    log "installing rabbitmq-server with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server </dev/null
    find_rabbitmq_cmd rabbitmq-server >/dev/null \
        || die "apt-get finished but rabbitmq-server is still missing"
    log "rabbitmq-server installed"
}

rabbitmq_running() {
    local ctl
    ctl="$(find_rabbitmq_cmd rabbitmqctl)" || return 1
    as_rabbitmq_admin "$ctl" -q status </dev/null >/dev/null 2>&1
}

cmd_start_rabbitmq() {
    local server ctl
    server="$(find_rabbitmq_cmd rabbitmq-server)" \
        || die "rabbitmq-server is not installed; run: $0 install-rabbitmq"
    ctl="$(find_rabbitmq_cmd rabbitmqctl)" || die "rabbitmqctl not found"

    if rabbitmq_running; then
        log "RabbitMQ already running"
    else
        log "starting RabbitMQ (detached)"
        as_rabbitmq_admin "$server" -detached </dev/null >/dev/null 2>&1 \
            || log "rabbitmq-server -detached returned non-zero; waiting for the node anyway"
    fi

    local deadline=$((SECONDS + RABBITMQ_START_TIMEOUT))
    local out=""
    while true; do
        if out="$(as_rabbitmq_admin "$ctl" -q await_startup --timeout 5 </dev/null 2>&1)"; then
            log "RabbitMQ is ready (amqp://guest:guest@127.0.0.1:5672/)"
            return 0
        fi
        if ((SECONDS >= deadline)); then
            printf '%s\n' "$out" >&2
            for f in /var/log/rabbitmq/startup_err /var/log/rabbitmq/startup_log; do
                if [[ -s "$f" ]]; then
                    log "--- $f ---"
                    tail -n 20 "$f" >&2 || true
                fi
            done
            die "RabbitMQ did not become ready within ${RABBITMQ_START_TIMEOUT}s"
        fi
        sleep 1
    done
}

cmd_stop_rabbitmq() {
    local ctl
    if ! ctl="$(find_rabbitmq_cmd rabbitmqctl)"; then
        log "rabbitmqctl not installed; nothing to stop"
        return 0
    fi
    if rabbitmq_running; then
        log "stopping RabbitMQ"
        # `shutdown` is `stop` that also waits for the Erlang VM to exit, so an immediate
        # start-rabbitmq cannot race with the old node. Fall back to plain `stop`.
        as_rabbitmq_admin "$ctl" -q shutdown </dev/null >/dev/null 2>&1 \
            || as_rabbitmq_admin "$ctl" -q stop </dev/null >/dev/null 2>&1 \
            || true
    else
        log "RabbitMQ not running"
    fi
    if command -v epmd >/dev/null 2>&1; then
        epmd -kill >/dev/null 2>&1 || true
    fi
}

# Fetch a Maven project's runtime jars into its lib/ directory ($1: the directory, $2: a name).
maven_fetch() {
    local dir="$1" name="$2" mvn_log
    command -v mvn >/dev/null 2>&1 || die "mvn (Maven) is required to fetch $name"
    command -v java >/dev/null 2>&1 || die "java (17+) is required to run $name"
    log "fetching $name and its dependencies into $dir/lib"
    mvn_log="$(mktemp)"
    if ! mvn -B -q -f "$dir/pom.xml" \
        dependency:copy-dependencies -DoutputDirectory=lib </dev/null >"$mvn_log" 2>&1; then
        cat "$mvn_log" >&2
        rm -f "$mvn_log"
        die "Maven could not fetch $name (is Maven Central reachable?)"
    fi
    rm -f "$mvn_log"
}

cmd_install_kafka() {
    if compgen -G "$KAFKA_LIB/kafka_2.13-[0-9]*.jar" >/dev/null; then
        log "Kafka already in $KAFKA_LIB"
        return 0
    fi
    maven_fetch "$KAFKA_DIR" "Apache Kafka"
    compgen -G "$KAFKA_LIB/kafka_2.13-[0-9]*.jar" >/dev/null \
        || die "Maven finished but no kafka_2.13 jar is in $KAFKA_LIB"
    log "Kafka installed"
}

kafka_listening() {
    (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null
}

kafka_java() {
    java -Xms128m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_LIB/*" "$@"
}

cmd_start_kafka() {
    compgen -G "$KAFKA_LIB/kafka_2.13-[0-9]*.jar" >/dev/null \
        || die "Kafka is not installed; run: $0 install-kafka"
    if kafka_listening; then
        log "Kafka already listening on 127.0.0.1:$KAFKA_PORT"
        return 0
    fi
    mkdir -p "$KAFKA_HOME"
    local config="$KAFKA_HOME/server.properties"
    cat >"$config" <<PROPERTIES
# Written by scripts/servers.sh start-kafka: one node that is broker and controller.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$KAFKA_CONTROLLER_PORT
# PROXIED is advertised one port higher, where tests put a fault-injecting TCP proxy.
listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,CONTROLLER://127.0.0.1:$KAFKA_CONTROLLER_PORT,PROXIED://127.0.0.1:$((KAFKA_PORT + 2))
advertised.listeners=PLAINTEXT://127.0.0.1:$KAFKA_PORT,PROXIED://127.0.0.1:$((KAFKA_PORT + 3))
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT
log.dirs=$KAFKA_HOME/data
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
num.network.threads=2
num.io.threads=2
background.threads=2
log.retention.hours=24
log.segment.bytes=16777216
PROPERTIES
    if [[ ! -f "$KAFKA_HOME/data/meta.properties" ]]; then
        log "formatting Kafka storage in $KAFKA_HOME/data"
        local cluster_id
        cluster_id="$(kafka_java kafka.tools.StorageTool random-uuid </dev/null 2>/dev/null | tail -n 1)"
        kafka_java kafka.tools.StorageTool format --ignore-formatted \
            -t "$cluster_id" -c "$config" </dev/null >"$KAFKA_HOME/format.log" 2>&1 \
            || { cat "$KAFKA_HOME/format.log" >&2; die "could not format Kafka storage"; }
    fi
    log "starting Kafka on 127.0.0.1:$KAFKA_PORT (detached; log in $KAFKA_HOME/kafka.log)"
    nohup java -Xms128m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
        -Dlog4j2.configurationFile="$KAFKA_DIR/log4j2.properties" -cp "$KAFKA_LIB/*" \
        kafka.Kafka "$config" </dev/null >"$KAFKA_HOME/kafka.log" 2>&1 &
    echo $! >"$KAFKA_HOME/kafka.pid"
    local pid=$! deadline=$((SECONDS + KAFKA_START_TIMEOUT))
    until kafka_listening; do
        if ! kill -0 "$pid" 2>/dev/null; then
            tail -n 30 "$KAFKA_HOME/kafka.log" >&2
            die "Kafka exited before it listened on 127.0.0.1:$KAFKA_PORT"
        fi
        if ((SECONDS >= deadline)); then
            tail -n 30 "$KAFKA_HOME/kafka.log" >&2
            die "Kafka did not listen on 127.0.0.1:$KAFKA_PORT within ${KAFKA_START_TIMEOUT}s"
        fi
        sleep 0.5
    done
    log "Kafka is ready (127.0.0.1:$KAFKA_PORT)"
}

cmd_stop_kafka() {
    local pidfile="$KAFKA_HOME/kafka.pid" pid
    if [[ ! -f "$pidfile" ]]; then
        log "no Kafka started from this checkout; nothing to stop"
        return 0
    fi
    pid="$(cat "$pidfile")"
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping Kafka (pid $pid)"
        kill "$pid"
        local deadline=$((SECONDS + 60))
        while kill -0 "$pid" 2>/dev/null; do
            if ((SECONDS >= deadline)); then
                log "Kafka did not stop within 60 s; killing it"
                kill -9 "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.5
        done
    else
        log "Kafka not running"
    fi
    rm -f "$pidfile"
}

cmd_install_spark() {
    if compgen -G "$SPARK_LIB/mongo-spark-connector_2.13-*.jar" >/dev/null; then
        log "MongoDB Spark connector already in $SPARK_LIB"
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || die "mvn (Maven) is required for install-spark"
    log "fetching the MongoDB Spark connector and its dependencies into $SPARK_LIB"
    local mvn_log
    mvn_log="$(mktemp)"
    if ! mvn -B -q -f "$SPARK_DIR/pom.xml" \
        dependency:copy-dependencies -DoutputDirectory=lib </dev/null >"$mvn_log" 2>&1; then
        cat "$mvn_log" >&2
        rm -f "$mvn_log"
        die "Maven could not fetch the MongoDB Spark connector (is Maven Central reachable?)"
    fi
    rm -f "$mvn_log"
    compgen -G "$SPARK_LIB/mongo-spark-connector_2.13-*.jar" >/dev/null \
        || die "Maven finished but no connector jar is in $SPARK_LIB"
    log "MongoDB Spark connector installed"
}

cmd_install_chromium() {
    if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
        log "chromium already installed"
        return 0
    fi
    command -v apt-get >/dev/null 2>&1 \
        || die "chromium is missing and apt-get is not available; install it manually"
    log "installing chromium with apt-get"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        chromium fonts-dejavu-core </dev/null
    command -v chromium >/dev/null 2>&1 || die "apt-get finished but chromium is still missing"
    log "chromium installed"
}

# A stamp of what was installed: the lock file and the patches. npm ci runs again only when
# one of them changed (or node_modules is gone), so the subcommand is cheap when up to date.
cosmos_stamp() {
    cat "$COSMOS_DIR/package.json" "$COSMOS_DIR/package-lock.json" "$COSMOS_DIR"/patches/*.patch \
        2>/dev/null | sha256sum | cut -d' ' -f1
}

cmd_install_cosmos() {
    local stamp_file="$COSMOS_DIR/node_modules/.docoutbox-install-stamp"
    local cli="$COSMOS_DIR/node_modules/@vercel/cosmosdb-server/lib/cli.js"
    command -v node >/dev/null 2>&1 || die "node (20+) is required for install-cosmos"
    command -v npm >/dev/null 2>&1 || die "npm is required for install-cosmos"
    local major
    major="$(node -p 'process.versions.node.split(".")[0]')"
    ((major >= 20)) || die "node $(node --version) is too old: @vercel/cosmosdb-server needs 20+"
    if [[ -f "$cli" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$(cosmos_stamp)" ]]; then
        log "Cosmos DB server already installed in $COSMOS_DIR/node_modules"
        return 0
    fi
    log "installing the Cosmos DB server (npm ci, then patch-package) in $COSMOS_DIR"
    local npm_log
    npm_log="$(mktemp)"
    if ! (cd "$COSMOS_DIR" && npm ci --no-audit --no-fund --loglevel=error) \
        </dev/null >"$npm_log" 2>&1; then
        cat "$npm_log" >&2
        rm -f "$npm_log"
        die "npm ci failed in $COSMOS_DIR (is the npm registry reachable? does the patch apply?)"
    fi
    rm -f "$npm_log"
    [[ -f "$cli" ]] || die "npm ci finished but $cli is missing"
    cosmos_stamp >"$stamp_file"
    log "Cosmos DB server installed"
}

cosmos_pid() {
    local pid
    [[ -f "$STATE_DIR/cosmos.pid" ]] || return 1
    pid="$(cat "$STATE_DIR/cosmos.pid")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null && grep -q cosmosdb-server "/proc/$pid/cmdline" 2>/dev/null \
        && echo "$pid"
}

cmd_start_cosmos() {
    local cli="$COSMOS_DIR/node_modules/@vercel/cosmosdb-server/lib/cli.js"
    [[ -f "$cli" ]] || die "the Cosmos DB server is not installed; run: $0 install-cosmos"
    mkdir -p "$STATE_DIR"
    if cosmos_pid >/dev/null; then
        log "Cosmos DB server already running (pid $(cosmos_pid))"
    else
        log "starting the Cosmos DB server on 127.0.0.1:$COSMOS_PORT"
        (cd "$COSMOS_DIR" && exec nohup node "$cli" --port "$COSMOS_PORT" --host 127.0.0.1 \
            --no-ssl --keep-alive </dev/null >"$STATE_DIR/cosmos.log" 2>&1) &
        echo $! >"$STATE_DIR/cosmos.pid"
        local deadline=$((SECONDS + 30))
        until grep -q "Ready to accept" "$STATE_DIR/cosmos.log" 2>/dev/null; do
            if ! cosmos_pid >/dev/null; then
                cat "$STATE_DIR/cosmos.log" >&2 || true
                rm -f "$STATE_DIR/cosmos.pid"
                die "the Cosmos DB server exited (is port $COSMOS_PORT taken?)"
            fi
            ((SECONDS < deadline)) || die "the Cosmos DB server was not ready within 30 s"
            sleep 0.2
        done
    fi
    log "Cosmos DB server ready; its data lives in memory until stop-cosmos"
    printf 'export COSMOS_ENDPOINT=http://127.0.0.1:%s/\n' "$COSMOS_PORT"
    printf 'export COSMOS_KEY=%s\n' "$COSMOS_EMULATOR_KEY"
}

cmd_stop_cosmos() {
    local pid
    if pid="$(cosmos_pid)"; then
        log "stopping the Cosmos DB server (pid $pid)"
        kill "$pid"
        local deadline=$((SECONDS + 10))
        while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    else
        log "no Cosmos DB server started by start-cosmos is running"
    fi
    rm -f "$STATE_DIR/cosmos.pid"
}

# The Spark distribution inside the venv's pyspark package (it has bin/spark-class, no sbin).
spark_home() {
    local python="$REPO_ROOT/.venv/bin/python"
    [[ -x "$python" ]] || python="$(command -v python3)"
    "$python" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null \
        || die "pyspark is not installed (run scripts/setup)"
}

# The pid in .servers/spark/NAME.pid when that process is still our Spark daemon.
spark_daemon_pid() {
    local file="$SPARK_CLUSTER_DIR/$1.pid" pid
    [[ -f "$file" ]] || return 1
    pid="$(cat "$file")"
    [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null \
        && grep -q "org.apache.spark.deploy" "/proc/$pid/cmdline" 2>/dev/null && echo "$pid"
}

spark_daemon() {
    local name="$1"
    shift
    (SPARK_DAEMON_MEMORY=256m SPARK_WORKER_DIR="$SPARK_CLUSTER_DIR/$name" \
        SPARK_LOCAL_IP=127.0.0.1 SPARK_LOG_DIR="$SPARK_CLUSTER_DIR" \
        exec nohup "$SPARK_HOME/bin/spark-class" "$@" </dev/null \
        >"$SPARK_CLUSTER_DIR/$name.log" 2>&1) &
    echo $! >"$SPARK_CLUSTER_DIR/$name.pid"
}

cmd_start_spark_cluster() {
    command -v java >/dev/null 2>&1 || die "java not found"
    SPARK_HOME="$(spark_home)"
    export SPARK_HOME
    mkdir -p "$SPARK_CLUSTER_DIR"
    local master="spark://127.0.0.1:$SPARK_MASTER_PORT" i
    if spark_daemon_pid master >/dev/null; then
        log "Spark master already running (pid $(spark_daemon_pid master))"
    else
        log "starting the Spark master on $master"
        spark_daemon master org.apache.spark.deploy.master.Master --host 127.0.0.1 \
            --port "$SPARK_MASTER_PORT" --webui-port $((SPARK_MASTER_PORT + 1))
    fi
    local deadline=$((SECONDS + SPARK_CLUSTER_START_TIMEOUT))
    until grep -q "I have been elected leader" "$SPARK_CLUSTER_DIR/master.log" 2>/dev/null; do
        spark_daemon_pid master >/dev/null || { cat "$SPARK_CLUSTER_DIR/master.log" >&2 || true; die "the Spark master exited (is port $SPARK_MASTER_PORT taken?)"; }
        ((SECONDS < deadline)) || die "the Spark master was not ready within ${SPARK_CLUSTER_START_TIMEOUT} s"
        sleep 0.5
    done
    for ((i = 1; i <= SPARK_WORKERS; i++)); do
        if spark_daemon_pid "worker-$i" >/dev/null; then
            log "Spark worker $i already running"
            continue
        fi
        spark_daemon "worker-$i" org.apache.spark.deploy.worker.Worker "$master" \
            --host 127.0.0.1 --cores 1 --memory 1g --webui-port $((SPARK_MASTER_PORT + 1 + i))
    done
    for ((i = 1; i <= SPARK_WORKERS; i++)); do
        until grep -q "Successfully registered with master" "$SPARK_CLUSTER_DIR/worker-$i.log" 2>/dev/null; do
            spark_daemon_pid "worker-$i" >/dev/null || { cat "$SPARK_CLUSTER_DIR/worker-$i.log" >&2 || true; die "Spark worker $i exited"; }
            ((SECONDS < deadline)) || die "Spark worker $i did not register within ${SPARK_CLUSTER_START_TIMEOUT} s"
            sleep 0.5
        done
    done
    log "Spark cluster ready: $master with $SPARK_WORKERS workers"
    printf 'export DOCOUTBOX_SPARK_MASTER=%s\n' "$master"
}

cmd_stop_spark_cluster() {
    local name pid
    for name in worker-2 worker-1 master; do
        if pid="$(spark_daemon_pid "$name")"; then
            log "stopping Spark $name (pid $pid)"
            kill "$pid"
            local deadline=$((SECONDS + 15))
            while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.2; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        fi
        rm -f "$SPARK_CLUSTER_DIR/$name.pid"
    done
}

cmd_install() {
    cmd_install_mongo
    cmd_install_rabbitmq
    cmd_install_kafka
    cmd_install_spark
    cmd_install_chromium
    cmd_install_cosmos
}

usage() {
    # Print the header comment (line 2 up to the first non-comment line).
    awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "${BASH_SOURCE[0]}" >&2
    exit 2
}

main() {
    [[ $# -eq 1 ]] || usage
    case "$1" in
        install-mongo) cmd_install_mongo ;;
        install-rabbitmq) cmd_install_rabbitmq ;;
        install-spark) cmd_install_spark ;;
        install-chromium) cmd_install_chromium ;;
        install-cosmos) cmd_install_cosmos ;;
        install) cmd_install ;;
        start-rabbitmq) cmd_start_rabbitmq ;;
        stop-rabbitmq) cmd_stop_rabbitmq ;;
        install-kafka) cmd_install_kafka ;;
        start-kafka) cmd_start_kafka ;;
        stop-kafka) cmd_stop_kafka ;;
        start-cosmos) cmd_start_cosmos ;;
        stop-cosmos) cmd_stop_cosmos ;;
        start-spark-cluster) cmd_start_spark_cluster ;;
        stop-spark-cluster) cmd_stop_spark_cluster ;;
        -h | --help | help) usage ;;
        *) log "unknown subcommand: $1"; usage ;;
    esac
}

main "$@"
