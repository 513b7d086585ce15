package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/epd-dev/coordinator/test/doubles/simworker"
	"github.com/epd-dev/coordinator/test/harness/atomicdir"
)

// syncBuffer collects a process's output while tests read it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// coordinator is a running binary: addr is the serving listener, admin the admin listener's
// host:port.
type coordinator struct {
	cmd         *exec.Cmd
	addr, admin string
	logs        *syncBuffer
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// insecure is a client that trusts any certificate (the tests check which one is served).
var insecure = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // see above

// runCoordinator starts the binary with the server section server (YAML flow items, listen_addr
// and metrics_port added) against gatewayYAML and waits until /readyz answers over scheme.
func runCoordinator(t *testing.T, server, gatewayYAML, scheme string) *coordinator {
	t.Helper()
	co := &coordinator{addr: freeAddr(t), admin: freeAddr(t), logs: &syncBuffer{}}
	_, adminPort, _ := net.SplitHostPort(co.admin)
	doc := fmt.Sprintf("server: {listen_addr: %q, metrics_port: %s%s}\ngateway: %s\npipeline: {steps: [{type: decode}]}\n",
		co.addr, adminPort, server, gatewayYAML)
	co.cmd = exec.Command(binary, "--config", writeConfig(t, doc))
	co.cmd.Stderr = co.logs
	if err := co.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = co.cmd.Process.Kill(); _ = co.cmd.Wait() })
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: insecure}, Timeout: 5 * time.Second}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if resp, err := client.Get(scheme + "://" + co.addr + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return co
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("coordinator not ready:\n%s\n%s", doc, co.logs)
		}
	}
}

// listeningOn is the local address of the process's listening TCP socket on port, from
// /proc/PID/net/tcp{,6}.
func listeningOn(t *testing.T, pid int, port string) string {
	t.Helper()
	p, _ := strconv.Atoi(port)
	suffix := fmt.Sprintf(":%04X", p)
	for _, file := range []string{"tcp", "tcp6"} {
		data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || f[3] != "0A" || !strings.HasSuffix(f[1], suffix) { // 0A: LISTEN
				continue
			}
			switch host := strings.TrimSuffix(f[1], suffix); host {
			case "0100007F":
				return "127.0.0.1"
			case "00000000", "00000000000000000000000000000000":
				return "every interface"
			default:
				return host
			}
		}
	}
	t.Fatalf("no listening socket on port %s", port)
	return ""
}

// TestAdminListener: /debug/pipeline and /metrics are on the admin listener only, which binds
// the serving listener's interface unless server.metrics_host names another.
func TestAdminListener(t *testing.T) {
	w, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	tests := map[string]struct {
		server, bound string
	}{
		"follows a loopback listen_addr": {bound: "127.0.0.1"},
		"every interface when asked":     {server: ", metrics_host: 0.0.0.0", bound: "every interface"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			co := runCoordinator(t, tc.server, "{address: "+w.URL()+"}", "http")
			_, port, _ := net.SplitHostPort(co.admin)
			if got := listeningOn(t, co.cmd.Process.Pid, port); got != tc.bound {
				t.Fatalf("the admin listener binds %s, want %s", got, tc.bound)
			}
			resp, err := http.Get("http://" + co.addr + "/debug/pipeline")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), `"code":"not_found"`) {
				t.Fatalf("/debug/pipeline on the serving port: HTTP %d %s", resp.StatusCode, b)
			}
			resp, err = http.Get("http://127.0.0.1:" + port + "/debug/pipeline")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				Revision string `json:"revision"`
				Reload   *struct {
					Watching bool `json:"watching"`
				} `json:"reload"`
			}
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || st.Revision == "" || st.Reload == nil {
				t.Fatalf("/debug/pipeline on the admin listener: %+v %v", st, err)
			}
		})
	}
}

// certDir writes a self-signed certificate for 127.0.0.1 named cn as tls.crt and tls.key into dir,
// the way kubelet updates a Secret volume.
func certDir(t *testing.T, dir, cn string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	if err := atomicdir.Write(dir, map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
	}); err != nil {
		t.Fatal(err)
	}
}

// servedCert handshakes with addr and returns the certificate's common name.
func servedCert(addr string, client *tls.Config) (string, error) {
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, client)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// TestTLSListeners: both listeners serve their certificate directories and pick up a renewal
// without a restart; TLS 1.1 is refused; without cert_path a self-signed certificate is served.
func TestTLSListeners(t *testing.T) {
	w, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	gw := "{address: " + w.URL() + "}"
	t.Run("certificate directories", func(t *testing.T) {
		api, admin := filepath.Join(t.TempDir(), "api"), filepath.Join(t.TempDir(), "admin")
		certDir(t, api, "api-1")
		certDir(t, admin, "admin-1")
		co := runCoordinator(t, fmt.Sprintf(", secure_serving: true, cert_path: %s, metrics_cert_dir: %s", api, admin), gw, "https")
		for addr, want := range map[string]string{co.addr: "api-1", co.admin: "admin-1"} {
			if got, err := servedCert(addr, insecure); err != nil || got != want {
				t.Fatalf("%s served %q (%v), want %s", addr, got, err, want)
			}
		}
		old := insecure.Clone()
		old.MaxVersion = tls.VersionTLS11
		if _, err := servedCert(co.addr, old); err == nil {
			t.Fatal("a TLS 1.1 client was served")
		}
		certDir(t, api, "api-2")
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if got, _ := servedCert(co.addr, insecure); got == "api-2" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the renewed certificate was not served within 30s:\n%s", co.logs)
			}
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: insecure}}
		resp, err := hc.Post("https://"+co.addr+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"sim-model","messages":[{"role":"user","content":"tls"}],"max_tokens":2}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("chat over TLS: HTTP %d", resp.StatusCode)
		}
	})
	t.Run("self-signed", func(t *testing.T) {
		co := runCoordinator(t, ", secure_serving: true", gw, "https")
		conn, err := tls.Dial("tcp", co.addr, insecure)
		if err != nil {
			t.Fatal(err)
		}
		leaf := conn.ConnectionState().PeerCertificates[0]
		conn.Close()
		if leaf.Subject.Organization[0] != "coordinator" || !strings.Contains(co.logs.String(), "self-signed certificate") {
			t.Fatalf("served %v; logs:\n%s", leaf.Subject, co.logs)
		}
	})
}

// TestGatewayCAFile: an https gateway is trusted through gateway.ca_file, and one whose
// certificate is not in the bundle fails the legs (502).
func TestGatewayCAFile(t *testing.T) {
	gw := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"x","object":"chat.completion","choices":[]}`)
	}))
	defer gw.Close()
	dir := t.TempDir()
	trusted, other := filepath.Join(dir, "gateway-ca.crt"), filepath.Join(dir, "other-ca.crt")
	if err := os.WriteFile(trusted, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: gw.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	certDir(t, filepath.Join(dir, "other"), "other")
	if err := os.Symlink(filepath.Join(dir, "other", "tls.crt"), other); err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]int{trusted: http.StatusOK, other: http.StatusBadGateway} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			co := runCoordinator(t, "", fmt.Sprintf("{address: %s, ca_file: %s}", gw.URL, file), "http")
			resp, err := http.Post("http://"+co.addr+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[]}`))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Fatalf("HTTP %d %s, want %d", resp.StatusCode, b, want)
			}
		})
	}
}

// TestReloadOfFrontDoorSettings: a reload whose gateway CA bundle does not read is rejected
// naming gateway.ca_file; one that changes a TLS setting keeps the running listener and lists the
// setting as restart-required.
func TestReloadOfFrontDoorSettings(t *testing.T) {
	w, err := simworker.Start(simworker.Config{Role: simworker.RoleDecode})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	co := runCoordinator(t, "", "{address: "+w.URL()+"}", "http")
	path := co.cmd.Args[2]
	status := func() (key string, restart []string) {
		resp, err := http.Get("http://" + co.admin + "/debug/pipeline")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var st struct {
			Reload struct {
				LastErrorKey    string   `json:"last_error_key"`
				RestartRequired []string `json:"restart_required"`
			} `json:"reload"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
			t.Fatal(err)
		}
		return st.Reload.LastErrorKey, st.Reload.RestartRequired
	}
	original, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name    string
		edit    func(string) string
		key     string
		restart string
	}{
		{name: "missing CA bundle", key: "gateway.ca_file",
			edit: func(doc string) string {
				return strings.Replace(doc, "gateway: {", "gateway: {ca_file: /nonexistent/ca.crt, ", 1)
			}},
		{name: "TLS turned on", restart: "server.secure_serving",
			edit: func(doc string) string {
				return strings.Replace(doc, "server: {", "server: {secure_serving: true, ", 1)
			}},
	}
	for _, s := range steps {
		if err := os.WriteFile(path, []byte(s.edit(string(original))), 0o644); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			key, restart := status()
			if key == s.key && (s.restart == "" || slices.Contains(restart, s.restart)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: reload status key %q, restart %v:\n%s", s.name, key, restart, co.logs)
			}
		}
	}
	resp, err := http.Get("http://" + co.addr + "/readyz")
	if err != nil {
		t.Fatalf("the running plain-HTTP listener stopped serving: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz %d", resp.StatusCode)
	}
}
