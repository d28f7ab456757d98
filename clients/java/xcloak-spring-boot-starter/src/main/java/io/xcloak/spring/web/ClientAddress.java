package io.xcloak.spring.web;

import java.net.InetAddress;
import java.net.UnknownHostException;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.regex.Pattern;

/**
 * The client's address, the middleware's default key (docs/clients.md, Middleware): the peer's
 * address, or, when the peer is a trusted proxy, the rightmost address of {@code X-Forwarded-For}
 * (or of {@code Forwarded}'s {@code for=}) that is not a trusted proxy. Forwarding headers are read
 * only when trusted proxies are configured: anyone can send them.
 *
 * <p>Shared by the servlet filter, the WebFilter and the gateway's key resolver; it touches no
 * framework type.
 */
public final class ClientAddress {

    private static final Pattern IPV4 = Pattern.compile("\\d{1,3}(\\.\\d{1,3}){3}");

    private final List<Network> trusted;

    /**
     * @param trustedProxies addresses ({@code 10.0.0.1}) or networks in CIDR form
     *     ({@code 10.0.0.0/8}, {@code fd00::/8})
     * @throws IllegalArgumentException naming the entry that is neither
     */
    public ClientAddress(List<String> trustedProxies) {
        List<Network> networks = new ArrayList<>();
        for (String entry : trustedProxies) {
            networks.add(Network.parse(entry));
        }
        this.trusted = List.copyOf(networks);
    }

    /** No trusted proxy: the peer's address always. */
    public static ClientAddress peerOnly() {
        return new ClientAddress(List.of());
    }

    public boolean readsForwardingHeaders() {
        return !trusted.isEmpty();
    }

    /**
     * @param peer the connection's remote address (an IP literal)
     * @param forwardedFor every {@code X-Forwarded-For} header line, in order
     * @param forwarded every {@code Forwarded} header line, in order (read when there is no
     *     {@code X-Forwarded-For})
     */
    public String resolve(String peer, List<String> forwardedFor, List<String> forwarded) {
        if (trusted.isEmpty()) {
            InetAddress address = literal(peer);
            return address == null ? peer : text(address);
        }
        List<String> chain = chain(forwardedFor, forwarded);
        chain.add(peer);
        for (int i = chain.size() - 1; i >= 0; i--) {
            InetAddress address = literal(chain.get(i));
            if (address == null) {
                return chain.get(i); // not an address: nothing before it can be believed
            }
            if (!isTrusted(address)) {
                return text(address);
            }
        }
        return chain.get(0);
    }

    private boolean isTrusted(InetAddress address) {
        for (Network network : trusted) {
            if (network.contains(address)) {
                return true;
            }
        }
        return false;
    }

    private static List<String> chain(List<String> forwardedFor, List<String> forwarded) {
        List<String> chain = new ArrayList<>();
        if (!forwardedFor.isEmpty()) {
            for (String line : forwardedFor) {
                for (String part : line.split(",")) {
                    String address = part.trim();
                    if (!address.isEmpty()) {
                        chain.add(address);
                    }
                }
            }
            return chain;
        }
        for (String line : forwarded) {
            for (String element : line.split(",")) {
                for (String pair : element.split(";")) {
                    String p = pair.trim();
                    int eq = p.indexOf('=');
                    if (eq < 0 || !p.substring(0, eq).trim().toLowerCase(Locale.ROOT).equals("for")) {
                        continue;
                    }
                    String value = p.substring(eq + 1).trim().replace("\"", "");
                    if (value.startsWith("[")) { // "[2001:db8::1]:4711"
                        int close = value.indexOf(']');
                        value = close > 0 ? value.substring(1, close) : value;
                    } else if (value.indexOf(':') == value.lastIndexOf(':') && value.indexOf(':') > 0) {
                        value = value.substring(0, value.indexOf(':')); // "192.0.2.1:4711"
                    }
                    chain.add(value);
                }
            }
        }
        return chain;
    }

    /** An IP literal as an address, or null: never a name lookup. */
    static InetAddress literal(String text) {
        String s = text.trim();
        if (s.startsWith("[") && s.endsWith("]")) {
            s = s.substring(1, s.length() - 1);
        }
        boolean v4 = IPV4.matcher(s).matches();
        boolean v6 = s.indexOf(':') >= 0 && s.chars().allMatch(c -> Character.digit(c, 16) >= 0 || c == ':' || c == '.' || c == '%');
        if (!v4 && !v6) {
            return null;
        }
        try {
            InetAddress address = InetAddress.getByName(s);
            return unmap(address);
        } catch (UnknownHostException e) {
            return null;
        }
    }

    /**
     * An address as the other packages write it: a.b.c.d, or IPv6 in RFC 5952's form (lower case,
     * the longest run of zero groups as "::"), so that keys agree across languages.
     */
    static String text(InetAddress address) {
        byte[] b = address.getAddress();
        if (b.length == 4) {
            return address.getHostAddress();
        }
        int[] groups = new int[8];
        for (int i = 0; i < 8; i++) {
            groups[i] = ((b[2 * i] & 0xff) << 8) | (b[2 * i + 1] & 0xff);
        }
        int bestStart = -1;
        int bestLength = 1; // a single zero group is not compressed
        for (int i = 0; i < 8; ) {
            if (groups[i] != 0) {
                i++;
                continue;
            }
            int j = i;
            while (j < 8 && groups[j] == 0) {
                j++;
            }
            if (j - i > bestLength) {
                bestStart = i;
                bestLength = j - i;
            }
            i = j;
        }
        StringBuilder out = new StringBuilder();
        for (int i = 0; i < 8; i++) {
            if (i == bestStart) {
                out.append("::");
                i += bestLength - 1;
                continue;
            }
            if (out.length() > 0 && out.charAt(out.length() - 1) != ':') {
                out.append(':');
            }
            out.append(Integer.toHexString(groups[i]));
        }
        return out.toString();
    }

    /** ::ffff:a.b.c.d is a.b.c.d. */
    private static InetAddress unmap(InetAddress address) {
        byte[] b = address.getAddress();
        if (b.length == 16) {
            boolean mapped = b[10] == (byte) 0xff && b[11] == (byte) 0xff;
            for (int i = 0; i < 10 && mapped; i++) {
                mapped = b[i] == 0;
            }
            if (mapped) {
                try {
                    return InetAddress.getByAddress(new byte[] {b[12], b[13], b[14], b[15]});
                } catch (UnknownHostException e) {
                    return address;
                }
            }
        }
        return address;
    }

    private record Network(byte[] prefix, int bits) {

        static Network parse(String entry) {
            String text = entry == null ? "" : entry.trim();
            int slash = text.indexOf('/');
            InetAddress address = literal(slash < 0 ? text : text.substring(0, slash));
            if (address == null) {
                throw new IllegalArgumentException("trusted-proxies: '" + entry
                        + "' is not an IP address or a CIDR network (10.0.0.1, 10.0.0.0/8, fd00::/8)");
            }
            int max = address.getAddress().length * 8;
            int bits = max;
            if (slash >= 0) {
                try {
                    bits = Integer.parseInt(text.substring(slash + 1));
                } catch (NumberFormatException e) {
                    bits = -1;
                }
                if (bits < 0 || bits > max) {
                    throw new IllegalArgumentException("trusted-proxies: the prefix length of '" + entry
                            + "' must be an integer from 0 to " + max);
                }
            }
            return new Network(address.getAddress(), bits);
        }

        boolean contains(InetAddress address) {
            byte[] a = address.getAddress();
            if (a.length != prefix.length) {
                return false;
            }
            int full = bits / 8;
            for (int i = 0; i < full; i++) {
                if (a[i] != prefix[i]) {
                    return false;
                }
            }
            int rest = bits % 8;
            if (rest == 0) {
                return true;
            }
            int mask = (0xff << (8 - rest)) & 0xff;
            return (a[full] & mask) == (prefix[full] & mask);
        }
    }
}
