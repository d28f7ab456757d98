package io.xcloak;

import java.io.BufferedInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * A tiny RESP2 client for the tests' own administration (INFO, CONFIG, CLUSTER, FLUSHALL): one
 * socket per command, so it never shares state with the client library under test. Replies: Long,
 * String (bulk and status), List, null; an error reply is thrown as {@link Error}.
 */
final class Resp {
    private Resp() {}

    static final class Error extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Error(String message) {
            super(message);
        }
    }

    static Object call(int port, int timeoutMillis, Object... args) {
        try (Socket socket = new Socket()) {
            socket.connect(new InetSocketAddress("127.0.0.1", port), timeoutMillis);
            socket.setSoTimeout(timeoutMillis);
            OutputStream out = socket.getOutputStream();
            StringBuilder head = new StringBuilder("*").append(args.length).append("\r\n");
            out.write(head.toString().getBytes(StandardCharsets.US_ASCII));
            for (Object arg : args) {
                byte[] bytes = arg instanceof byte[] b ? b : String.valueOf(arg).getBytes(StandardCharsets.UTF_8);
                out.write(("$" + bytes.length + "\r\n").getBytes(StandardCharsets.US_ASCII));
                out.write(bytes);
                out.write("\r\n".getBytes(StandardCharsets.US_ASCII));
            }
            out.flush();
            return read(new BufferedInputStream(socket.getInputStream()));
        } catch (IOException e) {
            throw new UncheckedIOException("RESP call to " + port + " failed", e);
        }
    }

    private static Object read(InputStream in) throws IOException {
        int type = in.read();
        String line = line(in);
        switch (type) {
            case '+':
                return line;
            case '-':
                throw new Error(line);
            case ':':
                return Long.parseLong(line);
            case '$': {
                int n = Integer.parseInt(line);
                if (n < 0) {
                    return null;
                }
                byte[] bytes = in.readNBytes(n);
                in.readNBytes(2);
                return new String(bytes, StandardCharsets.UTF_8);
            }
            case '*': {
                int n = Integer.parseInt(line);
                if (n < 0) {
                    return null;
                }
                List<Object> items = new ArrayList<>(n);
                for (int i = 0; i < n; i++) {
                    try {
                        items.add(read(in));
                    } catch (Error e) {
                        items.add(e);
                    }
                }
                return items;
            }
            default:
                throw new IOException("not a RESP reply: " + (char) type + line);
        }
    }

    private static String line(InputStream in) throws IOException {
        StringBuilder b = new StringBuilder();
        int c;
        while ((c = in.read()) != -1) {
            if (c == '\r') {
                in.read();
                break;
            }
            b.append((char) c);
        }
        return b.toString();
    }
}
