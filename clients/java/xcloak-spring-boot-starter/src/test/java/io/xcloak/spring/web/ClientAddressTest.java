package io.xcloak.spring.web;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.List;

import org.junit.jupiter.api.Test;

/** The default key (docs/clients.md, Middleware): forwarding headers only from trusted proxies. */
class ClientAddressTest {

    private static final ClientAddress TRUSTING = new ClientAddress(List.of("10.0.0.0/8", "192.0.2.7", "fd00::/8"));

    @Test
    void withoutTrustedProxiesTheHeadersAreIgnored() {
        assertEquals("203.0.113.9", ClientAddress.peerOnly().resolve("203.0.113.9", List.of("198.51.100.1"), List.of()));
    }

    @Test
    void anUntrustedPeerIsTheClientWhateverItForwards() {
        assertEquals("203.0.113.9", TRUSTING.resolve("203.0.113.9", List.of("198.51.100.1"), List.of()));
    }

    @Test
    void theRightmostUntrustedAddressIsTheClient() {
        // The client forged 1.1.1.1; 198.51.100.1 is what the first trusted proxy saw.
        assertEquals("198.51.100.1",
                TRUSTING.resolve("10.1.2.3", List.of("1.1.1.1, 198.51.100.1", "192.0.2.7"), List.of()));
    }

    @Test
    void forwardedForIsReadWhenThereIsNoXForwardedFor() {
        assertEquals("2001:db8::1", TRUSTING.resolve("10.0.0.1", List.of(),
                List.of("for=198.51.100.1;proto=https, for=\"[2001:db8::1]:4711\"")));
        assertEquals("198.51.100.2", TRUSTING.resolve("fd12::1", List.of(), List.of("for=198.51.100.2:8080")));
    }

    @Test
    void aChainOfTrustedProxiesOnlyGivesItsLeftmost() {
        assertEquals("10.9.9.9", TRUSTING.resolve("10.0.0.1", List.of("10.9.9.9, 10.0.0.2"), List.of()));
    }

    @Test
    void somethingThatIsNotAnAddressEndsTheChain() {
        assertEquals("unknown", TRUSTING.resolve("10.0.0.1", List.of("198.51.100.1, unknown"), List.of()));
    }

    @Test
    void aMappedIpv4AddressIsTheIpv4Address() {
        assertEquals("198.51.100.1", TRUSTING.resolve("::ffff:10.0.0.1", List.of("::ffff:198.51.100.1"), List.of()));
    }

    @Test
    void ipv6IsWrittenInItsShortestForm() {
        assertEquals("::1", ClientAddress.peerOnly().resolve("0:0:0:0:0:0:0:1", List.of(), List.of()));
        assertEquals("2001:db8::1:0:0:1", ClientAddress.peerOnly().resolve("2001:DB8:0:0:1:0:0:1", List.of(), List.of()));
        assertEquals("2001:db8:0:1:1:1:1:1", ClientAddress.peerOnly().resolve("2001:db8:0:1:1:1:1:1", List.of(), List.of()));
        assertEquals("::", ClientAddress.peerOnly().resolve("0:0:0:0:0:0:0:0", List.of(), List.of()));
        assertEquals("fe80::", ClientAddress.peerOnly().resolve("fe80:0:0:0:0:0:0:0", List.of(), List.of()));
    }

    @Test
    void aBadEntryIsRefusedNamingIt() {
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> new ClientAddress(List.of("10.0.0.0/33")));
        assertTrue(e.getMessage().contains("'10.0.0.0/33'") && e.getMessage().contains("0 to 32"), e.getMessage());
        e = assertThrows(IllegalArgumentException.class, () -> new ClientAddress(List.of("proxy.example")));
        assertTrue(e.getMessage().contains("'proxy.example' is not an IP address"), e.getMessage());
    }
}
