// In-memory MongoDB wire-protocol server for tests (docoutbox.testing.mongo_server).
//
// Fetch the jars once:
//   python -m docoutbox.testing.mongo_server install [--lib DIR]
// Run (Java 17 single-file source launch):
//   java -cp 'DIR/*' MongoWireServer.java [PORT]
//
// PORT 0 (the default) picks a free port. Once bound, prints exactly one line
// "READY <port>" to stdout. Shuts down and exits when stdin reaches EOF (so the server
// dies with its parent) or on SIGTERM/SIGINT.

import de.bwaldvogel.mongo.MongoServer;
import de.bwaldvogel.mongo.MongoVersion;
import de.bwaldvogel.mongo.backend.memory.MemoryBackend;
import java.io.IOException;
import java.io.InputStream;
import java.util.List;
import java.util.concurrent.atomic.AtomicBoolean;

public class MongoWireServer {

    /** Reports MongoDB 6.0 / wire version 17 (pymongo 4.20 refuses wire versions below 9). */
    static final class Mongo60 implements MongoVersion {
        @Override
        public List<Integer> getVersionArray() {
            return List.of(6, 0, 0);
        }

        @Override
        public int getWireVersion() {
            return 17;
        }
    }

    public static void main(String[] args) throws Exception {
        int port = args.length > 0 ? Integer.parseInt(args[0]) : 0;

        MongoServer server = new MongoServer(new MemoryBackend().version(new Mongo60()));
        server.enableOplog();
        server.bind("127.0.0.1", port);
        int boundPort = server.getLocalAddress().getPort();

        AtomicBoolean stopped = new AtomicBoolean(false);
        Runnable stop = () -> {
            if (stopped.compareAndSet(false, true)) {
                try {
                    server.shutdownNow();
                } catch (RuntimeException e) {
                    System.err.println("shutdown failed: " + e);
                }
            }
        };
        // Runs on SIGTERM/SIGINT and on System.exit().
        Runtime.getRuntime().addShutdownHook(new Thread(stop, "mongo-wire-server-shutdown"));

        System.out.println("READY " + boundPort);
        System.out.flush();

        // Block until stdin reaches EOF (parent closed the pipe or died), then exit.
        InputStream in = System.in;
        byte[] buf = new byte[256];
        try {
            while (in.read(buf) != -1) {
                // ignore input
            }
        } catch (IOException e) {
            // treat a broken stdin like EOF
        }
        stop.run();
        System.exit(0);
    }
}
