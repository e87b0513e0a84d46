package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// testCA is a certificate authority made for one test: it signs the server's and the clients'
// certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a certificate the CA signed for cn (a server's for 127.0.0.1 if server), as PEM
// certificate and key.
func (ca *testCA) issue(t *testing.T, cn string, server bool) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
}

// adminClient is an HTTPS client trusting ca for the server, presenting cert (nil: none) whatever
// CAs the server asks for (Go's client would otherwise send none that no asked CA signed).
func adminClient(ca *testCA, cert *tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	c := &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	if cert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: c}}
}

// With admin.tls and its client_ca_file, the admin listener speaks HTTPS and wants a client
// certificate of that CA (mTLS) for everything but the probes: none gets 401 with a problem, one
// of another CA fails the handshake, the CA's own passes; and with a token too, both are wanted.
// The metrics listener stays apart, plain and open to the scraper.
func TestServeE2EAdminMTLS(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t, "sluice admin CA"), newTestCA(t, "someone else's CA")
	serverCert, serverKey := ca.issue(t, "sluice", true)
	goodCert, goodKey := ca.issue(t, "operator", false)
	badCert, badKey := other.issue(t, "intruder", false)
	for name, b := range map[string][]byte{"ca.pem": ca.pem, "server.pem": serverCert, "server.key": serverKey} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	good, err := tls.X509KeyPair(goodCert, goodKey)
	if err != nil {
		t.Fatal(err)
	}
	bad, err := tls.X509KeyPair(badCert, badKey)
	if err != nil {
		t.Fatal(err)
	}
	withCert, withBadCert, noCert := adminClient(ca, &good), adminClient(ca, &bad), adminClient(ca, nil)

	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	maddr, err := freeAddr()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_TEST_ADMIN_TOKEN", "admin-token-42")
	extra := "admin:\n  token_env: SLUICE_TEST_ADMIN_TOKEN\n  metrics_listen: " + maddr + "\n  tls: {cert_file: server.pem, key_file: server.key, client_ca_file: ca.pem}\n"
	p, err := launchWith(t, dir, "sluice.yaml", openConfig(up.URL, extra), "/healthz", launchOpts{client: noCert})
	if err != nil {
		t.Fatal(err)
	}
	get := func(c *http.Client, path, token string) (int, string, error) {
		req, _ := http.NewRequest("GET", p.admin+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body, err := get(noCert, path, ""); err != nil || code != http.StatusOK {
			t.Errorf("%s without a certificate: %d %q %v; want 200 (probes carry no certificate)", path, code, body, err)
		}
	}
	for _, path := range []string{"/v1/stats", "/metrics", "/operator/"} {
		code, body, err := get(noCert, path, "admin-token-42")
		if err != nil || code != http.StatusUnauthorized || !strings.Contains(body, "client certificate") {
			t.Errorf("%s without a certificate: %d %q %v; want 401 naming the client certificate", path, code, body, err)
		}
		if _, _, err := get(withBadCert, path, "admin-token-42"); err == nil {
			t.Errorf("%s with another CA's certificate: the handshake passed", path)
		}
		if code, body, err := get(withCert, path, ""); err != nil || code != http.StatusUnauthorized || !strings.Contains(body, "Bearer") {
			t.Errorf("%s with a certificate but no token: %d %q %v; want 401 asking for the token", path, code, body, err)
		}
		if code, body, err := get(withCert, path, "admin-token-42"); err != nil || code != http.StatusOK {
			t.Errorf("%s with the CA's certificate and the token: %d %q %v; want 200", path, code, body, err)
		}
	}
	if resp, err := e2eClient.Get("http://" + strings.TrimPrefix(p.admin, "https://") + "/v1/stats"); err == nil {
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest { // Go's TLS server: "client sent an HTTP request to an HTTPS server"
			t.Errorf("plain HTTP to the admin listener: %s; want 400", resp.Status)
		}
	}
	resp, err := e2eClient.Get("http://" + maddr + "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the metrics listener: %v %v; want 200 without a certificate", resp, err)
	}
	resp.Body.Close()
}
