// Package upstream is the coordinator's outbound HTTP machinery, shared by the gateway's legs,
// side services (render), media downloads and the passthrough: a pooled transport whose
// connections write leg bodies with one vectored write, a client that traces and measures every
// call, the header rules of a proxy (hop-by-hop headers, headers the coordinator owns), and the
// relay that streams an upstream answer back to the client.
package upstream
